"""fp64 references for ``paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens,
sm_scale=None, num_splits=None) -> o``.

Sequence b's keys and values are gathered from the cache in logical order (token j at slot
j % page_size of page block_table[b, j // page_size], j < seq_lens[b]); its T query tokens
are the sequence's last T tokens, so o[b] is the dense causal op (``references/attention.py``,
bottom-right aligned) of q[b]'s T rows over them: the last T rows of the dense causal op on
the gathered sequence. A row that sees no key (seq_lens[b] < T for the first rows, every row
of an empty sequence) is 0. ``num_splits`` changes how an implementation sums, not the
exact result: the references ignore it.
Shapes: q [B, T, H, D] or [B, H, D] (T = 1), caches [P, page_size, Hkv, D], block_table
[B, max_pages], seq_lens [B]; o q's shape.
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.references import attention as dense


def gathered(cache, block_table, seq_lens, b: int):
    """Sequence b's tokens of ``cache`` in logical order, [n, Hkv, D] (NumPy or torch)."""
    n = int(seq_lens[b])
    page_size = cache.shape[1]
    pages = [int(p) for p in block_table[b][: -(-n // page_size)]] if n else []
    return cache[pages].reshape(-1, *cache.shape[2:])[:n] if pages else cache[:0, 0]


def query_rows(q):
    """q as [B, T, H, D]: a rank-3 q is T = 1 (a view)."""
    return q[:, None] if q.ndim == 3 else q


def sequence_attention(q_b, k_b, v_b, sm_scale, attention=dense.attention):
    """The dense causal op of one sequence's T query rows q_b [T, H, D] over its gathered
    keys and values [n, Hkv, D] (NumPy, or torch with ``attention=dense.attention_torch``):
    (o [T, H, D], lse [T, H])."""
    swap = (lambda t: t.transpose(0, 1)) if isinstance(q_b, torch.Tensor) else (lambda t: np.swapaxes(t, 0, 1))
    o, lse = attention(swap(q_b)[None], swap(k_b)[None], swap(v_b)[None], True, sm_scale)
    return swap(o[0]), lse[0].T


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None, num_splits=None):
    """NumPy float64 reference: o (q's shape) as a float64 ndarray."""
    q = np.asarray(q, dtype=np.float64)
    k_cache, v_cache = (np.asarray(t, dtype=np.float64) for t in (k_cache, v_cache))
    table, lens = np.asarray(block_table), np.asarray(seq_lens)
    rows = query_rows(q)
    o = np.zeros(rows.shape)
    for b in range(rows.shape[0]):
        if lens[b] == 0:
            continue
        k, v = (gathered(c, table, lens, b) for c in (k_cache, v_cache))
        o[b] = sequence_attention(rows[b], k, v, sm_scale)[0]
    return o.reshape(q.shape)


def paged_decode_attention_torch(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None, num_splits=None):
    """PyTorch float64 reference: o (q's shape)."""
    q, k_cache, v_cache = (t.to(torch.float64) for t in (q, k_cache, v_cache))
    table, lens = block_table.tolist(), seq_lens.tolist()
    rows = query_rows(q)
    out = []
    for b in range(rows.shape[0]):
        if lens[b] == 0:
            out.append(torch.zeros_like(rows[b]))
            continue
        k, v = (gathered(c, table, lens, b) for c in (k_cache, v_cache))
        out.append(sequence_attention(rows[b], k, v, sm_scale, dense.attention_torch)[0])
    return torch.stack(out).reshape(q.shape)
