"""Value domains: what an input of a user's op may hold, as nouns a definition names.

    Tensor("N", values=positive())           # scales, variances, temperatures
    Tensor("M", "K", values=finite(max_magnitude=1e4))
    Tensor("T", dtype=torch.int64, values=integers(0, "V"))   # indices below a size
    Tensor("B", "C", values=probabilities())  # rows on the simplex

A domain says which value families the cases draw (``strategies.FAMILIES``, most benign
first so that shrinking goes there), which single values are worth injecting, and how a
family's draw is mapped into the domain when the case is materialised. The map is stored
with the case (:attr:`TensorSpec.domain`, a name and numbers), so a replay file rebuilds
the same values without the definition.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from tritoncheck.strategies import FAMILIES, special_values

FINITE_FAMILIES = ("normal", "near_max", "tiny", "constant", "outlier", "offset")
MaxMagnitude = float | Callable[[torch.dtype], float] | None


@dataclass(frozen=True)
class Domain:
    """Where an input's values lie. Subclasses are the nouns below; ``transform`` names the
    map applied when the case is materialised (``materialise``), ``params`` its numbers."""

    families: tuple[str, ...] = FINITE_FAMILIES
    max_magnitude: MaxMagnitude = None

    def __post_init__(self):
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise ValueError(f"{type(self).__name__}: families must be a non-empty subset of {FAMILIES}, got {bad}")
        if self.max_magnitude is not None and not callable(self.max_magnitude) and not (
                isinstance(self.max_magnitude, (int, float)) and self.max_magnitude > 0):
            raise ValueError(f"{type(self).__name__}: max_magnitude must be a positive number or a function of the "
                             f"dtype, got {self.max_magnitude!r}")

    def cap(self, dtype: torch.dtype) -> float | None:
        """The largest magnitude drawn in ``dtype`` (None: the dtype's)."""
        if self.max_magnitude is None:
            return None
        cap = self.max_magnitude(dtype) if callable(self.max_magnitude) else self.max_magnitude
        if not (isinstance(cap, (int, float)) and cap > 0):
            raise ValueError(f"{type(self).__name__}: max_magnitude({dtype}) must be a positive number, got {cap!r}")
        return float(cap)

    def specials(self, dtype: torch.dtype) -> list[float]:
        return special_values(dtype, max_magnitude=self.cap(dtype)) if dtype.is_floating_point else []

    def stored(self, sizes: dict[str, int]) -> tuple:
        """The (transform, params) a case stores; ``sizes`` resolves bounds named by dims."""
        return ()

    def describe(self) -> str:
        cap = "" if self.max_magnitude is None else f", |x| <= {self.max_magnitude if not callable(self.max_magnitude) else 'max_magnitude(dtype)'}"
        return f"finite{cap}"


class _Finite(Domain):
    pass


def finite(*, max_magnitude: MaxMagnitude = None, families: Sequence[str] = FINITE_FAMILIES) -> Domain:
    """Any finite value of the dtype (the default), up to ``max_magnitude`` (a number, or a
    function of the dtype: ``lambda d: math.sqrt(torch.finfo(d).max)`` keeps a square
    finite). ``families`` narrows what is drawn (strategies.FAMILIES)."""
    return _Finite(families=tuple(families), max_magnitude=max_magnitude)


@dataclass(frozen=True)
class Interval(Domain):
    """Reals in ``[low, high]`` (either may be None: unbounded on that side); ``open``
    excludes the bounds (a strictly positive scale)."""

    low: float | None = None
    high: float | None = None
    open: bool = False

    def __post_init__(self):
        super().__post_init__()
        for name in ("low", "high"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise ValueError(f"reals: {name} must be a finite number or None, got {v!r}")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise ValueError(f"reals: need low < high, got low={self.low}, high={self.high}")

    def specials(self, dtype: torch.dtype) -> list[float]:
        ends = [v for v in (self.low, self.high) if v is not None and not self.open]
        if self.low is not None and self.high is not None:
            ends.append((self.low + self.high) / 2)
        elif self.low is not None:
            ends.append(self.low + float(torch.finfo(dtype).tiny))
        return ends

    def stored(self, sizes: dict[str, int]) -> tuple:
        return ("interval", (self.low, self.high, self.open))

    def describe(self) -> str:
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        left = "(" if self.open or self.low is None else "["
        right = ")" if self.open or self.high is None else "]"
        return f"reals in {left}{lo}, {hi}{right}"


def reals(low: float | None = None, high: float | None = None, *, open: bool = False,
          max_magnitude: MaxMagnitude = None) -> Domain:
    """Reals in ``[low, high]`` (``open=True``: ``(low, high)``); a bound left None is
    unbounded there. A bounded interval maps each family's draw through tanh onto it (the
    near-max family lands on its ends); a half-line takes |draw| from its bound."""
    return Interval(max_magnitude=max_magnitude, low=low, high=high, open=open)


def positive(*, max_magnitude: MaxMagnitude = None) -> Domain:
    """Strictly positive reals (scales, variances, temperatures): tiny, subnormal and
    near-max ones included."""
    return Interval(max_magnitude=max_magnitude, low=0.0, open=True)


def unit_interval() -> Domain:
    """Reals in [0, 1] (gates, keep probabilities)."""
    return Interval(low=0.0, high=1.0)


@dataclass(frozen=True)
class Simplex(Domain):
    """Non-negative values summing to 1 along ``axis`` (up to their rounding): a softmax of
    the drawn family (constant rows are uniform, outliers near one-hot)."""

    axis: int = -1

    def specials(self, dtype: torch.dtype) -> list[float]:
        return []

    def stored(self, sizes: dict[str, int]) -> tuple:
        return ("simplex", (self.axis,))

    def describe(self) -> str:
        return f"probabilities along axis {self.axis}"


def probabilities(axis: int = -1) -> Domain:
    return Simplex(families=("normal", "constant", "outlier", "near_max"), axis=axis)


@dataclass(frozen=True)
class Integers(Domain):
    """Integers in ``[low, high)``; a bound may name a dim (``integers(0, "V")``: an index
    into a size-V axis). Drawn uniform, all one value (collisions), or only the two ends."""

    low: int | str = 0
    high: int | str = 2

    def __post_init__(self):
        for name in ("low", "high"):
            v = getattr(self, name)
            if not (isinstance(v, str) and v.isidentifier()) and not (isinstance(v, int) and not isinstance(v, bool)):
                raise ValueError(f"integers: {name} must be an int or a dim name, got {v!r}")

    def bounds(self, sizes: dict[str, int]) -> tuple[int, int]:
        lo, hi = (sizes[v] if isinstance(v, str) else v for v in (self.low, self.high))
        if not lo < hi:
            raise ValueError(f"integers({self.low!r}, {self.high!r}): empty range [{lo}, {hi}) for this case")
        return lo, hi

    def specials(self, dtype: torch.dtype) -> list[float]:
        return []

    def stored(self, sizes: dict[str, int]) -> tuple:
        return ("integers", self.bounds(sizes))

    def describe(self) -> str:
        return f"integers in [{self.low}, {self.high})"


def integers(low: int | str, high: int | str) -> Domain:
    return Integers(families=("normal", "constant", "outlier"), low=low, high=high)


# ------------------------------------------------------------------ materialising

def materialise(values: np.ndarray, stored: tuple, family: str, rng: np.random.Generator,
                dtype: torch.dtype) -> np.ndarray:
    """``values`` (a family's float64 draw) mapped into the stored domain."""
    if not stored:
        return values
    kind, params = stored[0], tuple(stored[1])
    if kind == "interval":
        low, high, is_open = params
        if low is not None and high is not None:
            scale = max(float(np.max(np.abs(values))), 1.0) if family in ("near_max", "offset") else 1.0
            t = 0.5 + 0.5 * np.tanh(values / scale * (1e3 if family == "near_max" else 1.0))
            out = low + (high - low) * t
            if is_open:
                out = np.clip(out, low + _step(low, dtype), high - _step(high, dtype))
            return out
        if low is not None:
            out = low + np.abs(values)
            return np.maximum(out, low + _step(low, dtype)) if is_open else out
        out = high - np.abs(values)
        return np.minimum(out, high - _step(high, dtype)) if is_open else out
    if kind == "simplex":
        (axis,) = params
        if values.ndim == 0:
            return np.ones_like(values)
        z = values - np.max(values, axis=axis, keepdims=True)
        e = np.exp(z)
        return e / np.sum(e, axis=axis, keepdims=True)
    if kind == "integers":
        low, high = params
        shape = values.shape
        if family == "constant":
            return np.full(shape, rng.integers(low, high), dtype=np.float64)
        if family == "outlier":  # only the two ends of the range
            return rng.choice((low, high - 1), shape).astype(np.float64)
        return rng.integers(low, high, shape).astype(np.float64)
    raise ValueError(f"unknown value domain {kind!r} in a stored case")


def _step(bound: float, dtype: torch.dtype) -> float:
    """At least one spacing of ``dtype`` at ``bound`` (the subnormal spacing at 0): a value
    this far inside an open bound stays inside once rounded to the dtype."""
    info = torch.finfo(dtype)
    return max(2 * float(info.eps) * abs(bound), float(info.tiny) * float(info.eps))


def describe(stored: tuple) -> str:
    if not stored:
        return ""
    kind, params = stored[0], tuple(stored[1])
    if kind == "interval":
        low, high, _ = params
        return f"in ({'-inf' if low is None else low}, {'inf' if high is None else high})"
    if kind == "integers":
        return f"integers in [{params[0]}, {params[1]})"
    return f"{kind}"


def large(domain: Domain, shape: tuple[int, ...], dtype: torch.dtype, device, sizes: dict[str, int]) -> torch.Tensor:
    """A large tensor in ``domain`` built on ``device`` (the large-index problem), normal draws
    mapped as :func:`materialise` maps them."""
    stored = domain.stored(sizes)
    if stored and stored[0] == "integers":
        low, high = stored[1]
        return torch.randint(low, high, shape, device=device, dtype=dtype)
    t = torch.randn(shape, device=device, dtype=torch.float32)
    if stored and stored[0] == "interval":
        low, high, _ = stored[1]
        if low is not None and high is not None:
            t = low + (high - low) * (0.5 + 0.5 * torch.tanh(t))
        elif low is not None:
            t = low + t.abs() + float(torch.finfo(torch.float32).tiny)
        else:
            t = high - t.abs()
    elif stored and stored[0] == "simplex":
        t = torch.softmax(t, dim=stored[1][0])
    cap = domain.cap(dtype)
    if cap is not None:
        t = t.clamp(-cap, cap)
    return t.to(dtype)


def as_domain(value: Any, where: str) -> Domain:
    if value is None:
        return finite()
    if not isinstance(value, Domain):
        raise TypeError(f"{where}: values must be a domain (tritoncheck.finite(), reals(...), positive(), "
                        f"integers(...), probabilities(), unit_interval()), got {value!r}")
    return value
