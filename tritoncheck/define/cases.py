"""The cases of a defined op, drawn from its signature alone.

Sizes: one dim, the *lead* (any dim not declared ``long=False``, shrinking toward the
first), is drawn as a row length (:func:`tritoncheck.strategies.lengths`): its everyday
range, now and then past 4096 (up to 2**16 + 1 on the interpreter, 2**17 + 3 on a GPU), and
once each on purpose at 2^k - 1, 2^k, 2^k + 1 and past 4096 and 65536 before the random
draws (the harness's length classes). The other dims follow, each inside what is left of
two budgets: the elements of any one tensor (``ELEMENTS``) and the work, the product of
every distinct dim (``WORK``: a matrix product's M N K), so that a long lead leaves the
others short. Sizes at 2^k +- 1, small primes and any declared ``blocks`` edges are drawn
as often as uniform ones (:func:`tritoncheck.strategies.sizes`); ``--shapes N`` (the quick
profile) draws each dim from a small pool (:mod:`tritoncheck.shape_pool`). An
implementation's declared limits bound every dim and scalar.

Values: each tensor's domain (``finite()`` by default) chooses the families, the cap and
the injected specials; layouts are drawn for every tensor (permuted, sliced with NaN gaps,
offset) unless its ``layouts=False``; an ``optional`` tensor is drawn absent (None, a
parameter of the case) or present. Scalars come from their choices or interval.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import torch
from hypothesis import strategies as st

from tritoncheck.config import CONFIG
from tritoncheck.define.signature import BATCH, DimExpression, Scalar, Tensor
from tritoncheck.limits import NO_LIMITS, Limits, OutsideLimits
from tritoncheck.strategies import Case, TensorSpec, tensors

if TYPE_CHECKING:
    from tritoncheck.define.op import Definition

ELEMENTS = (2**12, 2**20)  # (interpreter, GPU): elements of one tensor, the lead's long draws aside
WORK = (2**16, 2**26)  # (interpreter, GPU): the product of every distinct dim
LONG_MAX = (2**16 + 1, 2**17 + 3)  # (interpreter, GPU): the lead dim's longest draw
EVERYDAY_MAX = (64, 1024)  # a dim's everyday largest size unless its Dim says otherwise
BATCH_RANK = 2  # leading batch dims ("...") drawn: 0 to this many


def _pick(pair):
    return CONFIG.pick(*pair)


def _scaled(limits: Limits, dim: str, m: int) -> Limits:
    """The limits of ``dim`` in units of ``m`` (a dim drawn as k * m)."""
    if m == 1 or not limits.bounds(dim):
        return limits
    sizes = dict(limits.sizes)
    if dim in sizes:
        sizes[dim] = tuple(n // m for n in sizes[dim] if n % m == 0)
        if not sizes[dim]:
            raise OutsideLimits(f"the declared sizes of {dim} hold no multiple of {m}")
    lo = {**limits.min_size, **({dim: -(-limits.min_size[dim] // m)} if dim in limits.min_size else {})}
    hi = {**limits.max_size, **({dim: max(1, limits.max_size[dim] // m)} if dim in limits.max_size else {})}
    return dataclasses.replace(limits, min_size=lo, max_size=hi, sizes=sizes)


def _product(values) -> int:
    return math.prod(values) if values else 1


@st.composite
def sizes_of(draw, definition: "Definition", limits: Limits = NO_LIMITS) -> tuple[dict[str, int], tuple[int, ...]]:
    """The named dims' sizes and the batch shape of one case."""
    sig = definition.signature
    names = list(sig.dim_names)
    long_names = [n for n in names if sig.dim(n).long]
    lead = draw(st.sampled_from(long_names)) if long_names else None
    order = ([lead] if lead else []) + [n for n in names if n != lead]
    elements, work = _pick(ELEMENTS), _pick(WORK)
    sizes: dict[str, int] = {}
    for name in order:
        dim = sig.dim(name)
        m = dim.multiple_of
        everyday = dim.largest(CONFIG.size == "large") or _pick(EVERYDAY_MAX)
        room = min([elements // _others(t, name, sizes) for t in sig.tensors.values() if name in t.dim_names]
                   + [work // _product(list(sizes.values()))])
        hi = max(dim.min, min(everyday, room))
        scaled = _scaled(limits, name, m)
        lo_k, hi_k = -(-dim.min // m), max(-(-dim.min // m), hi // m)
        if name == lead:
            long_max = max(hi_k, min(_pick(LONG_MAX), dim.largest(CONFIG.size == "large") or _pick(LONG_MAX)) // m)
            k = draw(scaled.length(definition.name, name, lo_k, hi_k, long_max=long_max,
                                   long_percent=CONFIG.long_percent(), blocks=tuple(b // m for b in dim.blocks)))
        else:
            k = draw(scaled.specialised(definition.name, name, lo_k, hi_k, blocks=tuple(b // m for b in dim.blocks),
                                        span=(lo_k, max(hi_k, (dim.largest(CONFIG.size == "large")
                                                               or _pick(EVERYDAY_MAX)) // m))))
        sizes[name] = k * m
    batch: tuple[int, ...] = ()
    if sig.has_batch:
        room = max(1, min(elements // max(_largest_tensor(definition, sizes), 1), work // _product(list(sizes.values()))))
        rank = draw(st.integers(0, BATCH_RANK))
        batch = tuple(draw(st.lists(st.integers(1, max(1, min(room, 8))), min_size=rank, max_size=rank)
                           .filter(lambda b: _product(b) <= room)))
    return sizes, batch


def _others(tensor: Tensor, name: str, sizes: dict[str, int]) -> int:
    """The product of the known sizes of ``tensor``'s entries other than ``name``'s."""
    return max(1, _product([_known(e, sizes) for e in tensor.shape
                            if e != BATCH and not (isinstance(e, DimExpression) and e.name == name)]))


def _known(entry, sizes: dict[str, int]) -> int:
    """A shape entry's size where it is known yet (an undrawn dim counts 1)."""
    if isinstance(entry, int):
        return entry
    if isinstance(entry, DimExpression):
        return max(1, entry.size(sizes)) if entry.name in sizes else 1
    return 1


def _largest_tensor(definition: "Definition", sizes: dict[str, int]) -> int:
    return max(_product([_known(e, sizes) for e in t.shape if e != BATCH]) for t in definition.signature.tensors.values())


def shape_of(tensor: Tensor, sizes: dict[str, int], batch: tuple[int, ...]) -> tuple[int, ...]:
    out: list[int] = []
    for e in tensor.shape:
        if e == BATCH:
            out.extend(batch)
        elif isinstance(e, int):
            out.append(e)
        else:
            out.append(e.size(sizes))
    return tuple(out)


@st.composite
def scalar_values(draw, name: str, scalar: Scalar, limits: Limits):
    if scalar.choices:
        return draw(limits.choice(name, scalar.choices))
    if name in limits.fixed:
        return limits.fixed[name]
    if name in limits.values:
        return draw(st.sampled_from(limits.values[name]))
    ends = [v for v in (scalar.default, scalar.low, scalar.high) if v is not None]
    return draw(st.one_of(st.sampled_from(ends), st.floats(scalar.low, scalar.high, allow_nan=False)))


@st.composite
def cases(draw, definition: "Definition", dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """One call of the op (module docstring)."""
    sig = definition.signature
    sizes, batch = draw(sizes_of(definition, limits))
    specs: dict[str, TensorSpec] = {}
    params: dict[str, object] = {}
    for name, spec in sig.inputs.items():
        if isinstance(spec, Scalar):
            params[name] = draw(scalar_values(name, spec, limits))
            continue
        if spec.optional and not draw(st.booleans()):  # shrinks toward absent
            params[name] = None
            continue
        dtypes = spec.dtype if isinstance(spec.dtype, tuple) else (spec.dtype,)
        chosen = draw(st.sampled_from(tuple(dict.fromkeys(d or dtype for d in dtypes))))
        shape = shape_of(spec, sizes, batch)
        domain = spec.values
        specials = (domain.specials(chosen) + list(spec.specials)) if chosen.is_floating_point else []
        drawn = draw(tensors(shape, chosen, families=domain.families, max_magnitude=domain.cap(chosen)
                             if chosen.is_floating_point else None, specials=specials, layout=spec.layouts))
        specs[name] = dataclasses.replace(drawn, domain=domain.stored(sizes))
    return Case(definition.name, str(dtype).replace("torch.", ""), tuple(sig.inputs), specs, params)
