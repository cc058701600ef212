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

With ``--shape-classes K`` as well (opt-in, e.g. K = 1 with the quick profile), the pool keeps the sizes of
K power-of-two classes only, ``(2^(k-1), 2^k]`` for 2^k one of BOUNDARIES, chosen per run
(``--shapes-seed``): the class's edge 2^k, one short of it, one past the edge below
(2^(k-1) + 1) and N others inside. Why: a kernel compiles once per constexpr, and kernels
derive their block constexprs from a size by ``next_power_of_2`` (every project kernel:
BLOCK_D of a head dim, BLOCK of a row); a size of another class is another compilation of
every kernel the op launches, times every variant and dtype (attention: 4 head-dim classes
were 4 times its compilations, docs/speed.md). Inside one class, Triton's own integer
classes (divisible by 16 or not) are both present (2^k and 2^k - 1), and the masked
tail (a size short of its block) with them; what it leaves to the deeper profiles is a
kernel that goes wrong in one class only (the gpu profile draws every size). A range of at
most 16 sizes (batch, heads) keeps all of them: one class would be one batch size, and
batch and head indexing bugs need two.
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


SMALL_RANGE = 16  # a range of at most this many sizes keeps them all under --shape-classes


@functools.lru_cache(maxsize=None)
def pool(op: str, dim: str, lo: int, hi: int, blocks: tuple[int, ...], count: int, seed: int,
         classes: int | None = None) -> tuple[int, ...]:
    """The run's sizes for one (op, dim) over [lo, hi], ascending (shrinks to the smallest);
    ``classes``: only the sizes of that many power-of-two classes (see the module docstring)."""
    if not 1 <= lo <= hi or count < 1:
        raise ValueError(f"shape pool {op}/{dim}: need 1 <= lo <= hi and count >= 1, got {lo}, {hi}, {count}")
    rng = np.random.default_rng(zlib.crc32(f"{seed}:{op}:{dim}".encode()))
    edges = [b for b in BOUNDARIES if lo <= b <= hi]
    if classes is not None and hi - lo + 1 > SMALL_RANGE and edges:
        return _class_pool(edges, lo, count, classes, rng)
    chosen = {v for v in BOUNDARIES + blocks if lo <= v <= hi}
    near_edges = block_edges(lo, hi, blocks + BOUNDARIES) or [lo]
    others = interesting_sizes(lo, hi)
    target = min(len(chosen) + count, hi - lo + 1)
    while len(chosen) < target:
        source = near_edges if rng.random() < 0.5 else (others if others and rng.random() < 0.5 else None)
        chosen.add(int(rng.choice(source)) if source else int(rng.integers(lo, hi + 1)))
    return tuple(sorted(chosen))


def _class_pool(edges: list[int], lo: int, count: int, classes: int, rng) -> tuple[int, ...]:
    """Sizes of ``classes`` of the classes (edge / 2, edge] (``edges`` inside the range):
    the edge, one short of it, one past the edge below, and ``count`` others in the class."""
    chosen: set[int] = set()
    for edge in rng.choice(edges, size=min(classes, len(edges)), replace=False):
        low = max(lo, int(edge) // 2 + 1)
        inside = {v for v in (int(edge), int(edge) - 1, low) if v >= lo}
        target = min(len(inside) + count, int(edge) - low + 1)
        while len(inside) < target:
            inside.add(int(rng.integers(low, int(edge) + 1)))
        chosen |= inside
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
    run_pool = pool(op, dim, lo, hi, tuple(blocks), CONFIG.shapes, CONFIG.shapes_seed, CONFIG.shape_classes)
    values = [v for v in run_pool if min_size <= v <= max_size]
    return st.sampled_from(values or [min_size])


def choice(op: str, dim: str, values: Sequence[int]) -> st.SearchStrategy[int]:
    """One of ``values`` (a dim the contract draws from a list, such as head dims):
    with ``--shapes N``, its boundaries and N others, fixed for the run; with
    ``--shape-classes K`` as well, the values of K power-of-two classes, each holding a
    value off its power of two where one exists (a head dim the kernel masks)."""
    values = sorted(set(values))
    if CONFIG.shapes is None:
        return st.sampled_from(values)
    rng = np.random.default_rng(zlib.crc32(f"{CONFIG.shapes_seed}:{op}:{dim}".encode()))
    if CONFIG.shape_classes is not None:
        return st.sampled_from(_class_values(values, CONFIG.shape_classes, rng))
    first = [v for v in values if v in BOUNDARIES]
    rest = [v for v in values if v not in BOUNDARIES]
    rng.shuffle(rest)
    return st.sampled_from(sorted(first + rest[:CONFIG.shapes]))


def _class_values(values: list[int], classes: int, rng) -> list[int]:
    """The values of ``classes`` power-of-two classes of ``values`` (those holding a power
    of two and a value off it first), chosen by ``rng``."""
    by_class: dict[int, list[int]] = {}
    for v in values:
        by_class.setdefault(1 << (v - 1).bit_length(), []).append(v)
    mixed = [c for c, vs in by_class.items() if len(vs) > 1 and c in vs]
    candidates = sorted(mixed or by_class)
    picked = rng.choice(candidates, size=min(classes, len(candidates)), replace=False)
    return sorted(v for c in picked for v in by_class[int(c)])


def run_subset(op: str, name: str, values: Sequence, count: int) -> tuple:
    """``count`` consecutive ``values`` from an index fixed for the run (``--shapes-seed``)
    with ``--shape-classes`` (opt-in), else all of them: the settings a check
    compares across (chunk sizes), each a compilation of every kernel of the call."""
    values = tuple(values)
    if CONFIG.shape_classes is None or len(values) <= count:
        return values
    rng = np.random.default_rng(zlib.crc32(f"{CONFIG.shapes_seed}:{op}:{name}".encode()))
    start = int(rng.integers(0, len(values) - count + 1))
    return values[start:start + count]
