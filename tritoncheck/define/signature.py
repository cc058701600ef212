"""The nouns of an op's signature: named sizes, tensors, scalars and outputs.

    inputs={"a": Tensor("M", "K"), "b": Tensor("K", "N"), "bias": Tensor("N")}
    inputs={"x": Tensor("...", "D"), "cos": Tensor("S", "D//2", dtype=torch.float32)}
    inputs={"approximate": Scalar(choices=("none", "tanh"))}
    dims={"K": Dim(max=4096), "D": Dim(multiple_of=2)}
    outputs={"q": Output(dtype=torch.float8_e4m3fn, exact=True), "scale": Output(dtype=torch.float32)}

A shape entry is a dim name (the same name in two tensors is one size), a dim name
divided or multiplied by an int (``"D//2"``, ``"2*H"``), an int, or ``"..."``: leading
batch dims, the same ones in every tensor that has them. Each class validates itself
when built and names the argument and the fix.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from tritoncheck.define.domains import Domain, as_domain

BATCH = "..."
_EXPRESSION = re.compile(r"^(?:(\d+)\s*\*\s*)?([A-Za-z_]\w*)(?:\s*(\*|//)\s*(\d+))?$")


@dataclass(frozen=True)
class DimExpression:
    """A shape entry in terms of a named dim: ``factor * name // divisor``."""

    name: str
    factor: int = 1
    divisor: int = 1

    def size(self, sizes: dict[str, int]) -> int:
        return sizes[self.name] * self.factor // self.divisor

    def __str__(self) -> str:
        text = self.name if self.factor == 1 else f"{self.factor}*{self.name}"
        return text if self.divisor == 1 else f"{text}//{self.divisor}"


def parse_entry(entry: Any, where: str) -> str | int | DimExpression:
    """One shape entry: ``"..."``, an int >= 0, or a dim expression."""
    if entry == BATCH:
        return BATCH
    if isinstance(entry, int) and not isinstance(entry, bool):
        if entry < 0:
            raise ValueError(f"{where}: a fixed size must be >= 0, got {entry}")
        return entry
    if isinstance(entry, str):
        m = _EXPRESSION.match(entry.strip())
        if m:
            lead, name, op, number = m.groups()
            factor, divisor = int(lead or 1), 1
            if op == "*":
                factor *= int(number)
            elif op == "//":
                divisor = int(number)
            if factor < 1 or divisor < 1:
                raise ValueError(f"{where}: {entry!r} multiplies or divides by zero")
            return DimExpression(name, factor, divisor)
    raise ValueError(f"{where}: shape entries are dim names ('M'), expressions ('D//2', '2*H'), ints or '...'; "
                     f"got {entry!r}")


@dataclass(frozen=True)
class Dim:
    """How a named size is drawn. ``min``/``max``: its range (``max`` an int, or a pair
    (interpreter, GPU) for the two profiles' sizes; None: as the element budget allows);
    ``multiple_of``: only multiples (an even head dim); ``long``: now and then drawn past
    4096 and 65536 and tried on purpose at 2^k - 1, 2^k, 2^k + 1 (tile boundaries) and past
    4096 and 65536 (the length classes); default True for every dim. ``blocks``: block
    sizes whose edges are drawn too (your kernel's tiles, where you know them)."""

    min: int = 1
    max: int | tuple[int, int] | None = None
    multiple_of: int = 1
    long: bool = True
    blocks: tuple[int, ...] = ()

    def __post_init__(self):
        if not isinstance(self.min, int) or self.min < 1:
            raise ValueError(f"Dim: min must be an int >= 1, got {self.min!r}")
        maxes = self.max if isinstance(self.max, tuple) else (self.max,)
        if len(maxes) not in (1, 2) or any(m is not None and (not isinstance(m, int) or m < self.min) for m in maxes):
            raise ValueError(f"Dim: max must be an int >= min ({self.min}), a pair (interpreter, GPU) of them, or "
                             f"None; got {self.max!r}")
        if not isinstance(self.multiple_of, int) or self.multiple_of < 1:
            raise ValueError(f"Dim: multiple_of must be an int >= 1, got {self.multiple_of!r}")
        if not all(isinstance(b, int) and b >= 1 for b in self.blocks):
            raise ValueError(f"Dim: blocks must be ints >= 1, got {self.blocks!r}")

    def largest(self, large: bool) -> int | None:
        if isinstance(self.max, tuple):
            return self.max[1 if large else 0]
        return self.max


@dataclass(frozen=True, init=False)
class Tensor:
    """A tensor argument: its shape (entries above), its dtype (None: the case's dtype; a
    dtype; or a tuple of dtypes drawn among, e.g. tables in fp32 or in the input's dtype),
    its values (a domain, default ``finite()``), extra ``specials`` injected at single
    positions, whether non-contiguous layouts are drawn (``layouts=False``: always
    contiguous, for an argument your kernel documents as contiguous-only), and whether it
    may be None (``optional=True``: a bias, a mask, an initial state; drawn absent or
    present, shrinking toward absent; the reference receives None when it is absent)."""

    shape: tuple
    dtype: torch.dtype | tuple[torch.dtype, ...] | None
    values: Domain
    specials: tuple[float, ...]
    layouts: bool
    optional: bool

    def __init__(self, *shape, dtype=None, values: Domain | None = None, specials: Sequence[float] = (),
                 layouts: bool = True, optional: bool = False):
        where = f"Tensor{shape!r}"
        entries = tuple(parse_entry(e, where) for e in shape)
        if entries.count(BATCH) > 1 or (BATCH in entries and entries[0] != BATCH):
            raise ValueError(f"{where}: '...' may appear once, first (leading batch dims)")
        dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
        if not dtypes or any(d is not None and not isinstance(d, torch.dtype) for d in dtypes):
            raise TypeError(f"{where}: dtype must be None (the case's dtype), a torch dtype or a tuple of them, "
                            f"got {dtype!r}")
        for flag, value in (("layouts", layouts), ("optional", optional)):
            if not isinstance(value, bool):
                raise TypeError(f"{where}: {flag} must be True or False, got {value!r}")
        object.__setattr__(self, "shape", entries)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "values", as_domain(values, where))
        object.__setattr__(self, "specials", tuple(float(s) for s in specials))
        object.__setattr__(self, "layouts", layouts)
        object.__setattr__(self, "optional", optional)

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.shape if isinstance(e, DimExpression))

    def describe(self) -> str:
        return "[" + ", ".join(str(e) for e in self.shape) + "]" + (" or None" if self.optional else "")


@dataclass(frozen=True)
class Scalar:
    """A scalar argument: drawn from ``choices`` (a finite set: flags, modes, a few
    values; a kernel may declare the ones it takes in ``limits['values']``) or from a
    real interval (``low``, ``high``; shrinking toward ``default``)."""

    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    default: Any = None

    def __post_init__(self):
        if self.choices and (self.low is not None or self.high is not None):
            raise ValueError("Scalar: give choices or low/high, not both")
        if not self.choices and (self.low is None or self.high is None):
            raise ValueError("Scalar: give choices=(...) or both low and high")
        if not self.choices and not self.low <= self.high:
            raise ValueError(f"Scalar: need low <= high, got {self.low}, {self.high}")
        if self.choices and not isinstance(self.choices, tuple):
            object.__setattr__(self, "choices", tuple(self.choices))


@dataclass(frozen=True, init=False)
class Output:
    """An output: its dtype (None: the case's dtype), ``exact`` (compared bit for bit
    with the reference rounded to that dtype: quantised formats, integer results; the
    reference must round where the kernel does), an optional shape (entries as for
    :class:`Tensor`; by default read from the reference run on meta tensors), and the
    domain of its upstream gradient where the op has a backward."""

    shape: tuple | None
    dtype: torch.dtype | None
    exact: bool
    upstream: Domain

    def __init__(self, *shape, dtype: torch.dtype | None = None, exact: bool | None = None,
                 upstream: Domain | None = None):
        where = f"Output{shape!r}"
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"{where}: dtype must be None or a torch dtype, got {dtype!r}")
        if exact is None:
            exact = dtype is not None and (not dtype.is_floating_point or dtype.itemsize == 1)
        if not isinstance(exact, bool):
            raise TypeError(f"{where}: exact must be True or False, got {exact!r}")
        object.__setattr__(self, "shape", tuple(parse_entry(e, where) for e in shape) if shape else None)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "exact", exact)
        object.__setattr__(self, "upstream", as_domain(upstream, where))


@dataclass(frozen=True)
class Signature:
    """Inputs (in call order), outputs and dims of one op, checked together."""

    inputs: dict[str, Tensor | Scalar]
    outputs: dict[str, Output]
    dims: dict[str, Dim] = field(default_factory=dict)

    def __post_init__(self):
        for name, spec in self.inputs.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"inputs: argument names must be identifiers, got {name!r}")
            if not isinstance(spec, (Tensor, Scalar)):
                raise TypeError(f"inputs[{name!r}] must be a Tensor(...) or a Scalar(...), got {spec!r}")
        if not any(isinstance(s, Tensor) and not s.optional for s in self.inputs.values()):
            raise ValueError("inputs: an op needs at least one Tensor input that is not optional")
        for name in self.outputs:
            if not isinstance(name, str) or not name.isidentifier() or name in self.inputs:
                raise ValueError(f"outputs: names must be identifiers other than the inputs', got {name!r}")
        named = set(self.dim_names)
        unknown = set(self.dims) - named
        if unknown:
            raise ValueError(f"dims: {sorted(unknown)} appear in no tensor's shape; shapes name {sorted(named)}")
        for name, d in self.dims.items():
            if not isinstance(d, Dim):
                raise TypeError(f"dims[{name!r}] must be a Dim(...), got {d!r}")
        for name, spec in self.tensors.items():
            bound = getattr(spec.values, "low", None), getattr(spec.values, "high", None)
            for b in bound:
                if isinstance(b, str) and b not in named:
                    raise ValueError(f"inputs[{name!r}]: integers(...) names {b!r}, which is no dim of the op")
        for name, out in self.outputs.items():
            for e in out.shape or ():
                if isinstance(e, DimExpression) and e.name not in named:
                    raise ValueError(f"outputs[{name!r}]: its shape names {e.name!r}, which no input has")

    @property
    def tensors(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.inputs.items() if isinstance(v, Tensor)}

    @property
    def scalars(self) -> dict[str, Scalar]:
        return {k: v for k, v in self.inputs.items() if isinstance(v, Scalar)}

    @property
    def dim_names(self) -> tuple[str, ...]:
        """Every named dim, in order of first appearance."""
        seen: list[str] = []
        for spec in self.tensors.values():
            for name in spec.dim_names:
                if name not in seen:
                    seen.append(name)
        return tuple(seen)

    @property
    def has_batch(self) -> bool:
        return any(BATCH in t.shape for t in self.tensors.values())

    def dim(self, name: str) -> Dim:
        return self.dims.get(name, Dim())

    def axis(self, tensor: str, name: str, rank: int) -> int | None:
        """The axis of the dim ``name`` (as itself) in the input ``tensor`` of rank ``rank``,
        batch dims counted; None where it has none."""
        spec = self.tensors.get(tensor)
        if spec is None:
            return None
        batch = rank - (len(spec.shape) - 1) if BATCH in spec.shape else 0
        axis = 0
        for e in spec.shape:
            if e == BATCH:
                axis += batch
                continue
            if isinstance(e, DimExpression) and e.name == name and e.factor == e.divisor == 1:
                return axis
            axis += 1
        return None

    def sizes(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
        """Every named dim's size, read from the input tensors' ``shapes``."""
        out: dict[str, int] = {}
        for tensor, shape in shapes.items():
            if tensor not in self.tensors:
                continue
            for name in self.tensors[tensor].dim_names:
                axis = self.axis(tensor, name, len(shape))
                if axis is not None:
                    out[name] = shape[axis]
        return out

    def first_axis(self, name: str) -> tuple[str, int]:
        """(tensor, axis) where the dim ``name`` first appears as itself (for declared limits;
        an axis from the end when the tensor has batch dims); a tensor that is always passed
        first, an optional one only for a dim no other tensor has."""
        for tensor, spec in sorted(self.tensors.items(), key=lambda item: item[1].optional):
            for i, e in enumerate(spec.shape):
                if isinstance(e, DimExpression) and e.name == name and e.factor == e.divisor == 1:
                    return tensor, (i - len(spec.shape) if BATCH in spec.shape else i)
        raise KeyError(name)
