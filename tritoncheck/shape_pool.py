"""A per-run pool of the sizes that kernels specialise or autotune on (``--shapes N``).

Autotuned kernels key their configs on sizes: flash-linear-attention compiles and
benchmarks about 114 configs for every new (B, H, D, Dv, dtype), its ``elu_p1`` 60 for
every new last dim (84 s on an H100 for one new D, 0.4 s once the Triton cache holds
it). A fuzz run that draws every dim afresh recompiles on nearly every example. With
``--shapes N`` the dims a kernel specialises on (head dims, heads, batch, the last dim
of row-wise ops) are drawn only from a small pool per (op, dim), fixed at the start of
the run and the same for every dtype, while sequence lengths and row counts still vary
freely: a bounded number of compilations (and autotune sweeps) per such dim and dtype,
whatever the example count. One pool for all dtypes, not one per dtype: a kernel keyed
on a dim compiles (and autotunes) each value once per dtype anyway, and separate pools
multiplied the values by the dtypes (18 distinct ``elu_feature_map`` last dims at
``--shapes 1`` over three dtypes, each a 30-config ``elu_p1`` sweep in fla), while a
dtype-specific bug at a size shows in the pool's other draws and in other runs
(``--shapes-seed``).

A pool holds the block boundaries in its range (16, 32, 64, 128 and the op's own block
sizes) and N sizes besides them, drawn at random, half of them next to a block edge (one
short, one past, one past two blocks: where masking bugs live; a pool of boundaries
alone would hold only aligned sizes and never a masked tail).
It is a pure function of (seed, op, dim, range), so every xdist worker builds the
same pool. Without ``--shapes`` every dim is drawn by :func:`strategies.sizes`.
"""
from __future__ import annotations

import functools
import zlib
from typing import Sequence

import numpy as np
from hypothesis import strategies as st

from tritoncheck.config import CONFIG
from tritoncheck.strategies import block_edges, interesting_sizes
from tritoncheck.strategies import sizes as free_sizes

BOUNDARIES = (16, 32, 64, 128)


@functools.lru_cache(maxsize=None)
def pool(op: str, dim: str, lo: int, hi: int, blocks: tuple[int, ...], count: int, seed: int) -> tuple[int, ...]:
    """The run's sizes for one (op, dim) over [lo, hi], ascending (shrinks to the smallest)."""
    if not 1 <= lo <= hi or count < 1:
        raise ValueError(f"shape pool {op}/{dim}: need 1 <= lo <= hi and count >= 1, got {lo}, {hi}, {count}")
    chosen = {v for v in BOUNDARIES + blocks if lo <= v <= hi}
    rng = np.random.default_rng(zlib.crc32(f"{seed}:{op}:{dim}".encode()))
    near_edges = block_edges(lo, hi, blocks + BOUNDARIES) or [lo]
    others = interesting_sizes(lo, hi)
    target = min(len(chosen) + count, hi - lo + 1)
    while len(chosen) < target:
        source = near_edges if rng.random() < 0.5 else (others if others and rng.random() < 0.5 else None)
        chosen.add(int(rng.choice(source)) if source else int(rng.integers(lo, hi + 1)))
    return tuple(sorted(chosen))


def sizes(op: str, dim: str, min_size: int, max_size: int, *, blocks: Sequence[int] = (),
          span: tuple[int, int] | None = None) -> st.SearchStrategy[int]:
    """A size for ``dim`` of ``op``: with ``--shapes N`` one of the run's pool within
    [min_size, max_size] (the pool spans ``span``, default that same range: pass the
    widest range when the bounds depend on earlier draws, so every worker builds the same
    pool); min_size when no pool value fits. Without it, :func:`strategies.sizes`."""
    if CONFIG.shapes is None:
        return free_sizes(min_size, max_size, blocks=blocks)
    lo, hi = span or (min_size, max_size)
    values = [v for v in pool(op, dim, lo, hi, tuple(blocks), CONFIG.shapes, CONFIG.shapes_seed)
              if min_size <= v <= max_size]
    return st.sampled_from(values or [min_size])


def choice(op: str, dim: str, values: Sequence[int]) -> st.SearchStrategy[int]:
    """One of ``values`` (a dim the contract draws from a list, such as head dims):
    with ``--shapes N``, its boundaries and N others, fixed for the run."""
    values = sorted(set(values))
    if CONFIG.shapes is None:
        return st.sampled_from(values)
    rng = np.random.default_rng(zlib.crc32(f"{CONFIG.shapes_seed}:{op}:{dim}".encode()))
    first = [v for v in values if v in BOUNDARIES]
    rest = [v for v in values if v not in BOUNDARIES]
    rng.shuffle(rest)
    return st.sampled_from(sorted(first + rest[:CONFIG.shapes]))
