"""Hypothesis strategies for the *structure* of a test case.

A strategy here draws a description (:class:`TensorSpec`, :class:`Case`), never the
bulk values: those come from a seeded NumPy generator when the case is
materialised. Drawing stays cheap whatever the tensor size, a case prints and
replays from a few numbers, and everything that matters still shrinks: sizes toward
1, layouts toward contiguous, value families toward plain normal, scales toward 1,
injected special values toward none, seeds toward 0.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from hypothesis import strategies as st

from tritoncheck import refusals

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Value families, most benign first (Hypothesis shrinks a sampled_from toward the
# first element). What each draws, for a dtype with largest finite value `max`:
FAMILIES = (
    "normal",  # standard normal times `scale`
    "near_max",  # |v| in [max/2, max] (or the op's max_magnitude), random signs
    "tiny",  # |v| around the smallest normal, down into the subnormals
    "constant",  # every element equal
    "outlier",  # normal, plus one element 1e3 times larger (clipped to the range)
    "offset",  # a large common offset (1e4) plus normal noise: cancellation
    "neg_inf_mask",  # normal with about 30% of entries -inf (masking)
    "neg_inf_tail",  # normal, each row -inf from a random column on (a padding mask)
)
SCALES = (1.0, 1e-3, 1e-1, 10.0, 1e3)
# Families outside FAMILIES, drawn only by the ops that name them (quantised GEMM inputs):
OTHER_FAMILIES = (
    "wide",  # random signs, magnitudes log-uniform over the dtype's whole range, its subnormals included
    "scales",  # positive: `scale` * 2^-u, u uniform in [0, SCALE_SPREAD) (full fp32 mantissas)
    "pow2_scales",  # the same rounded to powers of two (a scale that dequantises exactly)
)
SCALE_SPREAD = 8.0  # octaves below `scale` a family of scales spans (blocks whose amax differs)
GARBAGE = float("nan")  # fills the gaps of strided layouts: any read of a gap shows (ints: their min)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}; use float32, float16 or bfloat16")
    return dtype


# ----------------------------------------------------------------------------- sizes

def interesting_sizes(min_size: int, max_size: int) -> list[int]:
    """Sizes where kernels break: 1, small primes, powers of two and their neighbours."""
    picks = {1, 2, 3, 5, 7, 13, 31, 61, 127, 257, 509, 1021, 4099, 65537}
    k = 1
    while k <= 2 * max_size:
        picks.update({k - 1, k, k + 1})
        k *= 2
    return sorted(s for s in picks if min_size <= s <= max_size)


def block_edges(min_size: int, max_size: int, blocks: Sequence[int]) -> list[int]:
    """Sizes at the edges of the blocks a kernel tiles with: one short of a block, a
    block, one past one block (the first masked tail of a multi-block loop), one past two."""
    picks = {e for b in blocks for e in (b - 1, b, b + 1, 2 * b + 1)}
    return sorted(s for s in picks if min_size <= s <= max_size)


def sizes(min_size: int = 1, max_size: int = 1024, *, blocks: Sequence[int] = ()) -> st.SearchStrategy[int]:
    """A size in ``[min_size, max_size]``, drawn evenly from three pools: uniform,
    :func:`interesting_sizes` and :func:`block_edges` of ``blocks``; shrinks toward
    ``min_size``."""
    if not 1 <= min_size <= max_size:
        raise ValueError(f"sizes: need 1 <= min_size <= max_size, got min_size={min_size}, max_size={max_size}")
    interesting = interesting_sizes(min_size, max_size)  # none in e.g. [68, 69]
    pools = [st.integers(min_size, max_size)] + ([st.sampled_from(interesting)] if interesting else [])
    edges = block_edges(min_size, max_size, blocks)
    if edges:
        pools.append(st.sampled_from(edges))
    return st.one_of(*pools)


LONG_FROM = 4095  # the long branch starts just below 4096, a common column-block cap


def lengths(min_size: int, max_size: int, *, long_max: int, long_percent: int,
            blocks: Sequence[int] = ()) -> st.SearchStrategy[int]:
    """A row length: :func:`sizes` in ``[min_size, max_size]`` most of the time, and in
    ``long_percent`` percent of the draws a length in ``[LONG_FROM, long_max]``
    (uniform, or a power of two and its neighbours there: 4096 +- 1, 8192 +- 1, ...,
    65536 +- 1, ...).

    Why: the everyday range is sized for the op's cost, and on the interpreter that
    keeps rows short (softmax stopped near 2100), so a kernel whose blocks are 4096 or
    65536 wide would never run its multi-block path. The long branch reaches past those
    whatever the kernel under test tiles with; drawn rarely, with the caller bounding
    the rows by an element budget, it keeps a CPU run short. The branch is chosen by an
    integer in [0, 999]: the long one in the top ``10 long_percent`` values, the everyday
    one below (0 shrinks to it). Hypothesis draws such a small range evenly, but puts the
    literals it collects from the loaded modules into it: the small ones (0..100) are
    common in the suite's code and land in the everyday branch, so the long band sits at
    the top, where the suite's literals are few. Not a 32-bit range: Hypothesis draws wide
    integers with a bias to small magnitudes, which starves a band at the top."""
    if not 0 <= long_percent <= 100:
        raise ValueError(f"lengths: long_percent must be in [0, 100], got {long_percent}")
    classes = length_classes(min_size, max_size, long_max=long_max, long_percent=long_percent)
    seen, pinned = _seen_length_classes.get(), _pinned_length_class.get()
    if seen is not None:
        seen.append(classes)
    if pinned in classes:
        return st.just(classes[pinned])
    everyday = sizes(min_size, max_size, blocks=blocks)
    if long_percent == 0 or long_max < LONG_FROM:
        return everyday
    long = sizes(max(min_size, LONG_FROM), long_max)
    return st.integers(0, 999).flatmap(lambda r: long if r >= 1000 - 10 * long_percent else everyday)


# ------------------------------------------------------------- size classes, on purpose

# The row lengths every row-wide test tries on purpose, once each, before it draws at
# random (tritoncheck/harness.py run_length_classes; the self-test's hunts the same):
# drawn by chance, a size a kernel (or a cheat) keys on came up in 2-5 % of the draws,
# and at 20 examples a test a third to a half of the tests never met one, always the
# same ones under a derandomized profile. Generic to any kernel, not the suite's own
# block sizes: a power of two 2^k (a tile of that width, or a kernel specialised on
# it), one short of it and one past it (the first masked tail), for the largest k whose
# 2^k + 1 is an everyday length; one past 4096 and one past 65536, where the profile
# draws rows that long (the long branch of ``lengths``: on the interpreter an op's
# ``long_max`` says what it can afford).
LENGTH_CLASSES = ("2^k - 1", "2^k", "2^k + 1", "past 4096", "past 65536")


def length_classes(min_size: int, max_size: int, *, long_max: int, long_percent: int) -> dict[str, int]:
    """The :data:`LENGTH_CLASSES` that a :func:`lengths` draw over these bounds can reach,
    with the length that stands for each."""
    picks = {}
    if max_size >= 2:
        top = 1 << ((max_size - 1).bit_length() - 1)  # the largest 2^k with 2^k + 1 <= max_size
        picks = {"2^k - 1": top - 1, "2^k": top, "2^k + 1": top + 1}
    if long_percent > 0 and long_max >= LONG_FROM:
        picks.update({"past 4096": 4097, "past 65536": 65537})
    top_size = max(max_size, long_max if long_percent else 0)
    out: dict[str, int] = {}
    for name, n in picks.items():  # one run per length: 2^16 + 1 is also the first past 65536
        if min_size <= n <= top_size and n not in out.values():
            out[name] = n
    return out


_seen_length_classes: contextvars.ContextVar[list[dict[str, int]] | None] = contextvars.ContextVar(
    "seen_length_classes", default=None)
_pinned_length_class: contextvars.ContextVar[str | None] = contextvars.ContextVar("pinned_length_class", default=None)


@contextlib.contextmanager
def seeing_length_classes() -> Iterator[list[dict[str, int]]]:
    """Inside, every :func:`lengths` drawn appends its :func:`length_classes` to the list
    yielded (what a strategy's row lengths can reach, found by drawing one case)."""
    seen: list[dict[str, int]] = []
    token = _seen_length_classes.set(seen)
    try:
        yield seen
    finally:
        _seen_length_classes.reset(token)


def length_classes_reached(strategy: st.SearchStrategy) -> dict[str, int]:
    """The length classes that the row lengths of ``strategy``'s cases reach, with their
    lengths, from one derandomized draw (empty for cases without a :func:`lengths`)."""
    from hypothesis import HealthCheck, Phase, given, settings

    @settings(max_examples=1, derandomize=True, database=None, deadline=None, print_blob=False,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def draw_one(case):
        pass

    with seeing_length_classes() as seen:
        draw_one()
    return dict(seen[0]) if seen else {}


@contextlib.contextmanager
def pinned_length_class(name: str) -> Iterator[None]:
    """Inside, every :func:`lengths` that can reach the class ``name`` draws its length;
    the rest of the case is drawn as ever."""
    if name not in LENGTH_CLASSES:
        raise ValueError(f"unknown length class {name!r}; known: {', '.join(LENGTH_CLASSES)}")
    token = _pinned_length_class.set(name)
    try:
        yield
    finally:
        _pinned_length_class.reset(token)


# ---------------------------------------------------------------------------- layouts

@dataclass(frozen=True)
class Layout:
    """How a logical tensor sits in memory.

    ``order`` lists the logical dims from outermost to innermost in memory (the
    identity is row-major); ``step`` > 1 leaves gaps between consecutive elements of
    logical dim ``step_dim`` (a ``[..., ::step]`` slice); ``offset`` is the storage
    offset. The gaps and the offset hold NaN, so a kernel that reads them shows it.
    """

    order: tuple[int, ...]
    step_dim: int = 0
    step: int = 1
    offset: int = 0

    @property
    def contiguous(self) -> bool:
        return self.order == tuple(range(len(self.order))) and self.step == 1 and self.offset == 0

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        """A tensor equal to ``values`` laid out as described."""
        if self.contiguous:
            return values.clone()
        shape = values.shape
        physical = [shape[d] for d in self.order]
        inner = self.order.index(self.step_dim)
        alloc = list(physical)
        alloc[inner] *= self.step
        count = math.prod(alloc)
        garbage = GARBAGE if values.dtype.is_floating_point else torch.iinfo(values.dtype).min
        buf = torch.full((self.offset + count,), garbage, dtype=values.dtype, device=values.device)
        view = buf[self.offset:].view(alloc)
        index = [slice(None)] * len(alloc)
        index[inner] = slice(None, None, self.step)
        view = view[tuple(index)]
        inverse = [self.order.index(d) for d in range(len(self.order))]
        logical = view.permute(inverse)
        logical.copy_(values)
        return logical

    def describe(self) -> str:
        if self.contiguous:
            return "contiguous"
        parts = []
        if self.order != tuple(range(len(self.order))):
            parts.append(f"dims ordered {list(self.order)} in memory")
        if self.step > 1:
            parts.append(f"dim {self.step_dim} sliced ::{self.step}")
        if self.offset:
            parts.append(f"storage offset {self.offset}")
        return ", ".join(parts)


@st.composite
def layouts(draw, rank: int, *, allow_permute: bool = True, allow_step: bool = True,
            allow_offset: bool = True, keep_last: bool = False) -> Layout:
    """Layouts for a rank-``rank`` tensor: contiguous, permuted (transposed views,
    ``[B, N, H, D]`` seen as ``[B, H, N, D]``), step-sliced, storage offset.
    ``keep_last`` keeps the last logical dim innermost (for ops that may assume it)."""
    identity = tuple(range(rank))
    order = identity
    if allow_permute and rank > 1:
        if keep_last:
            head = draw(st.one_of(st.just(identity[:-1]), st.permutations(identity[:-1])))
            order = tuple(head) + (rank - 1,)
        else:
            order = tuple(draw(st.one_of(st.just(identity), st.permutations(identity))))
    step_dim, step = 0, 1
    if allow_step:
        step = draw(st.sampled_from((1, 2, 3)))
        if step > 1:
            step_dim = draw(st.integers(0, rank - 1))
    offset = draw(st.sampled_from((0, 1, 7, 33))) if allow_offset else 0
    return Layout(order=order, step_dim=step_dim, step=step, offset=offset)


# ---------------------------------------------------------------------------- tensors

def finite_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max if dtype.is_floating_point else torch.iinfo(dtype).max)


def _family_values(rng: np.random.Generator, shape: tuple[int, ...], family: str, scale: float,
                   dtype: torch.dtype, max_magnitude: float | None) -> np.ndarray:
    cap = min(finite_max(dtype), max_magnitude or math.inf)
    if family == "normal":
        v = rng.standard_normal(shape) * scale
    elif family == "near_max":
        v = rng.uniform(0.5, 1.0, shape) * cap * rng.choice((-1.0, 1.0), shape)
    elif family == "tiny":
        tiny = float(torch.finfo(dtype).tiny)
        v = tiny * np.exp2(rng.uniform(-12, 4, shape)) * rng.choice((-1.0, 1.0), shape)
    elif family == "constant":
        v = np.full(shape, rng.standard_normal() * scale)
    elif family == "outlier":
        v = rng.standard_normal(shape) * scale
        flat = v.reshape(-1)
        flat[rng.integers(flat.size)] = rng.choice((-1.0, 1.0)) * scale * 1e3
    elif family == "offset":
        v = rng.choice((-1.0, 1.0)) * 1e4 + rng.standard_normal(shape) * scale
    elif family == "neg_inf_mask":
        v = rng.standard_normal(shape) * scale
        v[rng.random(shape) < 0.3] = -np.inf
    elif family == "neg_inf_tail":
        v = rng.standard_normal(shape) * scale
        n = shape[-1] if shape else 1
        starts = rng.integers(1, n + 1, shape[:-1])  # keep at least one finite entry per row
        v[np.arange(n) >= np.asarray(starts)[..., None]] = -np.inf
    elif family in ("cos_of_angles", "sin_of_angles"):
        theta = _rope_angles(rng, shape, scale)
        v = np.cos(theta) if family == "cos_of_angles" else np.sin(theta)
    elif family == "indices":
        v = rng.integers(0, int(scale), shape).astype(np.float64)
    elif family == "wide":
        lowest = float(torch.finfo(dtype).tiny) * float(torch.finfo(dtype).eps) if dtype.is_floating_point else 1.0
        v = np.exp2(rng.uniform(np.log2(lowest), np.log2(cap), shape)) * rng.choice((-1.0, 1.0), shape)
    elif family in ("scales", "pow2_scales"):
        v = scale * np.exp2(-rng.uniform(0.0, SCALE_SPREAD, shape))
        if family == "pow2_scales":
            v = np.exp2(np.round(np.log2(v)))
    else:
        raise ValueError(f"unknown value family {family!r}; known: {', '.join(FAMILIES + OTHER_FAMILIES)}")
    v = np.asarray(v, dtype=np.float64)  # a 0-dim draw (a scalar loss's upstream gradient) is a float
    return np.clip(v, -cap, cap, where=np.isfinite(v), out=v)


ROPE_BASE = 10000.0


def _rope_angles(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Angles theta for a [S, D/2] rotary table: half the seeds the RoPE schedule
    theta[s, i] = (p0 + s) * 10000^(-i / (D/2)) from a first position p0 in
    [0, scale) (long-context offsets), the other half uniform in [-pi, pi)."""
    s, half = shape
    if rng.random() < 0.5:
        p0 = int(rng.integers(0, max(1, int(scale))))
        inv_freq = ROPE_BASE ** (-np.arange(half) / max(half, 1))
        return (p0 + np.arange(s, dtype=np.float64))[:, None] * inv_freq[None, :]
    return rng.uniform(-np.pi, np.pi, shape)


@dataclass(frozen=True)
class TensorSpec:
    """Everything needed to rebuild one input tensor bit for bit."""

    shape: tuple[int, ...]
    dtype: str
    family: str = "normal"
    scale: float = 1.0
    seed: int = 0
    layout: Layout | None = None
    injections: tuple[tuple[int, float], ...] = ()
    max_magnitude: float | None = None
    # a value domain of a defined op (tritoncheck/define/domains.py): (kind, numbers) of the map
    # from the family's draw into it; () for the families' values as drawn
    domain: tuple = ()

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    def materialise(self, device: torch.device | str = "cpu") -> torch.Tensor:
        rng = np.random.default_rng(self.seed)
        dtype = self.torch_dtype
        if self.domain:
            from tritoncheck.define import domains  # the defined ops' maps (a leaf module)
            draw = _family_values(rng, self.shape, self.family, self.scale,
                                  dtype if dtype.is_floating_point else torch.float64, self.max_magnitude)
            values = domains.materialise(draw, self.domain, self.family, rng, dtype)
        elif dtype.is_floating_point:
            values = _family_values(rng, self.shape, self.family, self.scale, dtype, self.max_magnitude)
        elif self.family == "indices":
            values = rng.integers(0, int(self.scale), self.shape)
        else:  # an integer format's values (int8 GEMM operands): the family's, rounded, inside the dtype's range
            values = np.rint(_family_values(rng, self.shape, self.family, self.scale, dtype, self.max_magnitude))
        t = torch.from_numpy(values).to(dtype)
        flat = t.view(-1)
        for index, value in self.injections:
            flat[index % flat.numel()] = value
        t = t.to(device)
        return (self.layout or Layout(tuple(range(len(self.shape))))).apply(t)

    def describe(self) -> str:
        scale = f" scale={self.scale:g}" if self.family not in ("near_max", "tiny", "wide", "indices") else ""
        if self.family == "indices":
            scale = f" in [0, {int(self.scale)})"
        if self.domain:
            from tritoncheck.define import domains
            scale += f" {domains.describe(self.domain)}"
        text = f"shape {list(self.shape)} {self.dtype}, {self.family}{scale}, seed {self.seed}"
        if self.layout is not None and not self.layout.contiguous:
            text += f", {self.layout.describe()}"
        if self.injections:
            text += ", injected " + ", ".join(f"[{i}]={v:g}" for i, v in self.injections)
        return text

    def to_json(self) -> dict:
        d = asdict(self)
        d["injections"] = [[i, _json_float(v)] for i, v in self.injections]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TensorSpec":
        d = dict(d)
        d["shape"] = tuple(d["shape"])
        if d.get("layout") is not None:
            lay = dict(d["layout"])
            lay["order"] = tuple(lay["order"])
            d["layout"] = Layout(**lay)
        d["injections"] = tuple((int(i), float(v)) for i, v in d.get("injections", ()))
        d["domain"] = (d["domain"][0], tuple(d["domain"][1])) if d.get("domain") else ()
        return cls(**d)


_NON_FINITE = ("inf", "-inf", "nan")  # how _json_float writes them; other strings stay strings


def _json_float(v: float):
    return v if math.isfinite(v) else repr(v)  # 'inf', '-inf', 'nan' parse back with float()


def _json_param(v):
    """A scalar argument as JSON: a float (non-finite ones by name), a torch dtype as its name."""
    if isinstance(v, float):
        return _json_float(v)
    return str(v) if isinstance(v, torch.dtype) else v


def _param_from_json(v):
    if v in _NON_FINITE:
        return float(v)
    if isinstance(v, str) and v.startswith("torch.") and isinstance(getattr(torch, v[6:], None), torch.dtype):
        return getattr(torch, v[6:])
    return v


def special_values(dtype: torch.dtype, *, allow_nan: bool = False, allow_inf: bool = False,
                   allow_neg_inf: bool = False, allow_subnormal: bool = True,
                   max_magnitude: float | None = None) -> list[float]:
    """Values worth injecting at single positions, most benign first; the largest
    finite value is the dtype's, or ``max_magnitude`` where the op's domain is smaller."""
    info = torch.finfo(dtype)
    big = float(torch.tensor(min(float(info.max), max_magnitude or math.inf)).to(dtype))
    vals = [0.0, -0.0, 1.0, big, -big, float(info.tiny)]
    if allow_subnormal:
        vals.append(float(info.tiny) * float(info.eps))
    if allow_neg_inf or allow_inf:
        vals.append(-math.inf)
    if allow_inf:
        vals.append(math.inf)
    if allow_nan:
        vals.append(math.nan)
    return vals


@st.composite
def tensors(draw, shape: tuple[int, ...], dtype: torch.dtype, *,
            families: Sequence[str] = ("normal",), scales: Sequence[float] = SCALES,
            specials: Sequence[float] = (), max_injections: int = 2,
            max_magnitude: float | None = None, layout: bool = True,
            keep_last: bool = False) -> TensorSpec:
    """A :class:`TensorSpec` of the given shape and dtype.

    ``families`` and ``specials`` are what the op's contract allows (an op whose
    contract says nothing about -inf should not be fed -inf); ``max_magnitude`` caps
    ``near_max`` and clipping for ops whose fp32 intermediates would overflow on
    legitimate inputs of the dtype's full range.
    """
    bad = [f for f in families if f not in FAMILIES + OTHER_FAMILIES]
    if bad:
        raise ValueError(f"tensors: unknown families {bad}; known: {', '.join(FAMILIES + OTHER_FAMILIES)}")
    family = draw(st.sampled_from(tuple(families)))
    scale = draw(st.sampled_from(tuple(scales)))  # always drawn, so shrinking prefers the first family
    if family in ("near_max", "tiny", "wide"):
        scale = 1.0
    seed = draw(st.integers(0, 2**32 - 1))
    lay = draw(layouts(len(shape), keep_last=keep_last)) if layout and shape else None  # 0-dim: one layout
    injections: tuple = ()
    numel = math.prod(shape)
    # Injections only in some examples: two special values in every row would drown the
    # structure the family was drawn for (an "offset" row plus a 1e18 is no longer a
    # cancellation case: a one-pass variance survived 60 such examples).
    if specials and max_injections and draw(st.booleans()):
        injections = tuple(draw(st.lists(
            st.tuples(st.integers(0, max(numel - 1, 0)), st.sampled_from(tuple(specials))),
            max_size=max_injections,
        )))
    return TensorSpec(shape=tuple(shape), dtype=_dtype_name(dtype), family=family, scale=scale,
                      seed=seed, layout=lay, injections=injections, max_magnitude=max_magnitude)


# ------------------------------------------------------------------------------ cases

@dataclass(frozen=True, repr=False)
class Case:
    """One call of an op: the tensors (in contract argument order) and the scalars.

    ``args`` names the positional arguments in the contract's order; each is a key
    of ``tensors`` or of ``params``. ``kwargs`` are extra keyword arguments beyond
    the contract (e.g. a kernel's ``chunk_size``) and are passed only when present.
    """

    op: str
    dtype: str
    args: tuple[str, ...]
    tensors: Mapping[str, TensorSpec]
    params: Mapping[str, Any] = field(default_factory=dict)
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def replace(self, *, tensors: Mapping[str, TensorSpec] | None = None, **changes) -> "Case":
        params = {**self.params, **{k: v for k, v in changes.items() if k in self.params}}
        kwargs = {**self.kwargs, **{k: v for k, v in changes.items() if k not in self.params}}
        return Case(self.op, self.dtype, self.args, {**self.tensors, **(tensors or {})}, params, kwargs)

    def materialise(self, device: torch.device | str = "cpu") -> dict[str, Any]:
        """Every argument by name: tensors built on ``device``, scalars as they are."""
        values: dict[str, Any] = {name: spec.materialise(device) for name, spec in self.tensors.items()}
        values.update(self.params)
        return values

    def call(self, fn: Callable, values: Mapping[str, Any]):
        """``fn`` on these values; a refusal (tritoncheck/refusals.py) comes out as ``Refusal``."""
        return refusals.call(fn, [values[a] for a in self.args], dict(self.kwargs))

    def describe(self) -> str:
        scalars = ", ".join(f"{k}={v!r}" for k, v in {**self.params, **self.kwargs}.items())
        head = f"{self.op}({', '.join(self.args)}) in {self.dtype}" + (f" with {scalars}" if scalars else "")
        lines = [head] + [f"  {name}: {spec.describe()}" for name, spec in self.tensors.items()]
        return "\n".join(lines)

    __repr__ = describe

    def to_json(self) -> dict:
        return {"op": self.op, "dtype": self.dtype, "args": list(self.args),
                "tensors": {k: v.to_json() for k, v in self.tensors.items()},
                "params": {k: _json_param(v) for k, v in self.params.items()},
                "kwargs": dict(self.kwargs)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Case":
        params = {k: _param_from_json(v) for k, v in d.get("params", {}).items()}
        return cls(op=d["op"], dtype=d["dtype"], args=tuple(d["args"]),
                   tensors={k: TensorSpec.from_json(v) for k, v in d["tensors"].items()},
                   params=params, kwargs=dict(d.get("kwargs", {})))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)
