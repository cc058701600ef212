"""Properties every chunked linear-recurrence scan owes its users, whatever its recurrence.

A chunked scan (gated delta rule, Mamba-2's SSD, chunked linear attention with a state)
takes per-token tensors along a sequence axis, an optional initial state, optional packed
sequence offsets, and returns per-token outputs and the final state. The recurrence
itself is the family's; what follows from "it is a recurrence" is shared here:

* the chunk size is an implementation detail (:func:`chunk_size_invariant`);
* the sequence cut into pieces, each call started from the previous call's final state,
  gives one call's outputs and final state (:func:`pieces_equal_one_call`: two pieces,
  or one token a call, which is decoding);
* packed sequences (``cu_seqlens``) give each sequence's separate call
  (:func:`packed_equal_separate_calls`).

Each compares the implementation with itself: the two sides approximate the same fp64
value, each within the family's derived allowance of it, so they may differ by twice
that (the family passes ``allowed(values) -> {output: allowance}`` for the whole call).
The state handed from one call to the next is the contract's float32 final state: the
rounding of a float32 state is one more u(fp32) of it, inside any rule that admits a
per-token rounding error.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from hypothesis import strategies as st

from tritoncheck import generic
from tritoncheck.oracle import assert_close, to_numpy
from tritoncheck.registry import Implementation
from tritoncheck.strategies import TensorSpec


@dataclass(frozen=True)
class ScanLayout:
    """Where a scan's sequence lives: ``tokens`` maps each per-token tensor (arguments and
    outputs) to its sequence axis; ``state_in`` / ``state_out`` name the initial-state
    argument and the final-state output ([N, ...]: one per sequence); ``offsets`` the
    packed-sequence argument (batch 1, sequences one after another on the sequence axis)."""

    tokens: Mapping[str, int]
    state_in: str
    state_out: str
    offsets: str
    outputs: tuple[str, ...]


def offsets_spec(lengths: list[int], dtype: str = "int32") -> TensorSpec:
    """Packed-sequence offsets [N + 1] (0, then the running sum of ``lengths``) as a
    TensorSpec: zeros with every offset injected, so a failing case prints and replays them."""
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    return TensorSpec((len(cu),), dtype, family="indices", scale=1.0,
                      injections=tuple((i, float(c)) for i, c in enumerate(cu)))


def scale_into(tensors_: list[torch.Tensor], size: float, limit: float) -> None:
    """Scale the tensors (in place) by the power of two that brings ``size`` to at most ``limit``."""
    if size > limit:
        factor = 2.0 ** -math.ceil(math.log2(size / limit))
        for t in tensors_:
            t.mul_(factor)


def largest(t: torch.Tensor | None) -> float:
    return float(t.abs().max()) if t is not None and t.numel() else 0.0


@st.composite
def packed_lengths(draw, total_max: int, chunks: Sequence[int]) -> list[int]:
    """Packed sequence lengths: one to four sequences, zero-length ones among them, lengths at
    the chunk edges as often as anywhere."""
    count = draw(st.integers(1, 4))
    per = max(1, total_max // count)
    edges = [n for n in {c + d for c in chunks for d in (-1, 0, 1)} if n <= per]
    one = st.one_of(st.integers(0, per), st.sampled_from(edges)) if edges else st.integers(0, per)
    lengths = draw(st.lists(one, min_size=count, max_size=count))
    if sum(lengths) == 0:
        lengths[0] = 1
    return lengths


def cut_position(n: int, seed: int, chunks: Sequence[int]) -> int:
    """A cut inside a sequence of ``n`` tokens: at a chunk edge or beside one as often as anywhere."""
    picks = sorted({e for c in chunks for e in (c - 1, c, c + 1)} | {1, n // 2, n - 1, 1 + seed % max(n - 1, 1)})
    picks = [i for i in picks if 1 <= i <= n - 1]
    return picks[seed % len(picks)]


def declares_chunk_sizes(impl: Implementation) -> str | None:
    """A check's ``requires``: why an implementation cannot be checked for chunk-size invariance."""
    return None if getattr(impl.fn, "chunk_sizes", None) else \
        f"{impl.name} declares no chunk_sizes (no chunk_size keyword to vary)"


def cases_with(**fixed):
    """A check's ``cases``: the op's strategy with some structure fixed (``varlen=True``...)."""
    return lambda op, dtype: op.cases(dtype, **fixed)


def upstream_with(**fixed):
    """The op's cases (some structure fixed) with an upstream gradient for each differentiated output."""
    def make(op, dtype):
        return generic.with_upstream(dataclasses.replace(op, cases=functools.partial(op.cases, **fixed)), dtype)
    return make


def _call(impl: Implementation, values: Mapping[str, Any], args: tuple[str, ...], extra=None) -> dict:
    return impl.outputs(impl.call(values, args, extra))


def _slice(t: torch.Tensor, axis: int, start: int, end: int) -> torch.Tensor:
    return t.narrow(axis, start, end - start)


def chunk_size_invariant(impl: Implementation, values: Mapping[str, Any], args: tuple[str, ...],
                         allowed: Mapping[str, np.ndarray]) -> None:
    """Every chunk size the implementation declares (``fn.chunk_sizes``, passed as
    ``chunk_size``) gives the same outputs, within twice the allowance."""
    chunks = tuple(impl.fn.chunk_sizes)
    outs = {c: _call(impl, values, args, {"chunk_size": c}) for c in chunks}
    first = chunks[0]
    for c in chunks[1:]:
        for name, got in outs[c].items():
            assert_close(name, got, to_numpy(outs[first][name]), 2 * allowed[name],
                         what=f"chunk_size={c} disagrees with chunk_size={first}", record=False)


def pieces_equal_one_call(impl: Implementation, values: Mapping[str, Any], args: tuple[str, ...],
                          layout: ScanLayout, cuts: list[int], allowed: Mapping[str, np.ndarray],
                          what: str) -> None:
    """The sequence cut at ``cuts`` (token positions, sorted, inside it), each piece called
    with the previous piece's final state as its initial state (the first with the case's),
    gives the one call's per-token outputs and final state, within twice the allowance."""
    whole = _call(impl, values, args)
    n = next(values[a].shape[ax] for a, ax in layout.tokens.items() if a in values)
    bounds = [0, *cuts, n]
    state = values.get(layout.state_in)
    pieces: dict[str, list[torch.Tensor]] = {o: [] for o in layout.outputs if o != layout.state_out}
    for a, b in zip(bounds, bounds[1:]):
        part = dict(values)
        for name, axis in layout.tokens.items():
            if part.get(name) is not None:
                part[name] = _slice(values[name], axis, a, b)
        part[layout.state_in] = state
        outs = _call(impl, part, args)
        for o in pieces:
            pieces[o].append(outs[o].detach())
        state = outs[layout.state_out].detach()
    for o, parts in pieces.items():
        joined = torch.cat(parts, dim=layout.tokens[o])
        assert_close(o, joined, to_numpy(whole[o]), 2 * allowed[o], what=f"{what} (cut at {cuts})", record=False)
    assert_close(layout.state_out, state, to_numpy(whole[layout.state_out]), 2 * allowed[layout.state_out],
                 what=f"{what}: the last piece's final state (cut at {cuts})", record=False)


def packed_equal_separate_calls(impl: Implementation, values: Mapping[str, Any], args: tuple[str, ...],
                                layout: ScanLayout, allowed: Mapping[str, np.ndarray]) -> None:
    """A packed call (batch 1, ``offsets`` delimiting N sequences, an initial state per
    sequence) gives, sequence by sequence, the outputs and final state of a call on that
    sequence alone (no offsets, batch 1, its own initial state), within twice the
    packed call's allowance there."""
    packed = _call(impl, values, args)
    cu = [int(c) for c in values[layout.offsets].tolist()]
    state = values.get(layout.state_in)
    for n, (a, b) in enumerate(zip(cu, cu[1:])):
        alone = dict(values)
        for name, axis in layout.tokens.items():
            if alone.get(name) is not None:
                alone[name] = _slice(values[name], axis, a, b)
        alone[layout.offsets] = None
        alone[layout.state_in] = None if state is None else state[n:n + 1]
        outs = _call(impl, alone, args)
        where = f"sequence {n} (tokens {a}..{b}) of the packed call vs a call on it alone"
        for o in layout.outputs:
            if o == layout.state_out:
                assert_close(o, outs[o], to_numpy(packed[o][n:n + 1]), 2 * allowed[o][n:n + 1], what=where,
                             record=False)
            else:
                axis = layout.tokens[o]
                assert_close(o, outs[o], to_numpy(_slice(packed[o], axis, a, b)),
                             2 * np.take(allowed[o], range(a, b), axis=axis), what=where, record=False)
