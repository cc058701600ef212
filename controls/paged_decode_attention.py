"""A correct plain-PyTorch paged_decode_attention: gather, then one query row of attention.

``gathered_naive_torch`` gathers each sequence's keys and values from the cache through the
block table (on the host: the table and lengths are read with ``tolist``) and computes, in
the input dtype, the scores as elementwise products summed over D (as decode reference code
writes it), a softmax, and P V. An empty sequence gets o = 0.

Why not ``q @ k^T`` (tritoncheck.controls.attention.naive_torch): on torch 2.13's CPU, the
batched matmul of one query row with 17 gathered (transposed) key rows that are equal bit for
bit gave two different scores (-1121.7600 and -1121.7596 for q of scale 1e3 with an outlier);
the dense rule (properties/attention_tolerance.py) gives keys equal to the top key bit for bit
an exact score, so the control failed matches_reference by 19 times the allowance. The
elementwise sum computes every key's score by the same reduction.
"""
from __future__ import annotations

import math

import torch


def gathered_naive_torch(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
    page_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    table, lens = block_table.tolist(), seq_lens.tolist()
    rows = []
    for b, n in enumerate(lens):
        if n == 0:
            rows.append(torch.zeros_like(q[b]))
            continue
        pages = table[b][: -(-n // page_size)]
        # [H, n, D]: the sequence's tokens, each KV head repeated for its group of query heads
        k, v = (c[pages].reshape(-1, *c.shape[2:])[:n].transpose(0, 1).repeat_interleave(group, dim=0)
                for c in (k_cache, v_cache))
        s = (q[b][:, None, :] * k).sum(-1) * scale
        p = torch.softmax(s, dim=-1)
        rows.append((p[:, None, :] @ v)[:, 0])
    return torch.stack(rows)


gathered_naive_torch.uses_triton = False  # plain PyTorch: no interpreter limits apply
