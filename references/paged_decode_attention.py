"""fp64 references for ``paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens,
sm_scale=None) -> o``.

Sequence b's keys and values are gathered from the cache in logical order (token j at slot
j % page_size of page block_table[b, j // page_size], j < seq_lens[b]); o[b] is the dense op
(``references/attention.py``) of the one query q[b] over them: the last row of the dense
causal op on the gathered sequence, which sees every key. seq_lens[b] = 0 gives o[b] = 0.
Shapes: q [B, H, D], caches [P, page_size, Hkv, D], block_table [B, max_pages], seq_lens [B].
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
    if isinstance(cache, torch.Tensor):
        return cache[pages].reshape(-1, *cache.shape[2:])[:n] if pages else cache[:0, 0]
    return cache[pages].reshape(-1, *cache.shape[2:])[:n] if pages else cache[:0, 0]


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
    """NumPy float64 reference: o [B, H, D] as a float64 ndarray."""
    q = np.asarray(q, dtype=np.float64)
    k_cache, v_cache = (np.asarray(t, dtype=np.float64) for t in (k_cache, v_cache))
    table, lens = np.asarray(block_table), np.asarray(seq_lens)
    o = np.zeros(q.shape)
    for b in range(q.shape[0]):
        if lens[b] == 0:
            continue
        k, v = (np.swapaxes(gathered(c, table, lens, b), 0, 1)[None] for c in (k_cache, v_cache))
        o_b, _ = dense.attention(q[b][None, :, None, :], k, v, False, sm_scale)
        o[b] = o_b[0, :, 0]
    return o


def paged_decode_attention_torch(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
    """PyTorch float64 reference: o [B, H, D]."""
    q, k_cache, v_cache = (t.to(torch.float64) for t in (q, k_cache, v_cache))
    table, lens = block_table.tolist(), seq_lens.tolist()
    rows = []
    for b in range(q.shape[0]):
        if lens[b] == 0:
            rows.append(torch.zeros_like(q[b]))
            continue
        k, v = (gathered(c, table, lens, b).transpose(0, 1)[None] for c in (k_cache, v_cache))
        o_b, _ = dense.attention_torch(q[b][None, :, None, :], k, v, False, sm_scale)
        rows.append(o_b[0, :, 0])
    return torch.stack(rows)
