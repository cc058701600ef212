"""A correct plain-PyTorch paged_decode_attention: gather, then the dense control.

``gathered_naive_torch`` gathers each sequence's keys and values from the cache through the
block table (on the host: the table and lengths are read with ``tolist``) and runs
``tritoncheck.controls.attention.naive_torch`` on the one query row in the input dtype. An
empty sequence gets o = 0.
"""
from __future__ import annotations

import torch

from tritoncheck.controls.attention import naive_torch


def gathered_naive_torch(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
    page_size = k_cache.shape[1]
    table, lens = block_table.tolist(), seq_lens.tolist()
    rows = []
    for b, n in enumerate(lens):
        if n == 0:
            rows.append(torch.zeros_like(q[b]))
            continue
        pages = table[b][: -(-n // page_size)]
        k, v = (c[pages].reshape(-1, *c.shape[2:])[:n].transpose(0, 1)[None] for c in (k_cache, v_cache))
        o_b, _ = naive_torch(q[b][None, :, None, :], k, v, False, sm_scale)
        rows.append(o_b[0, :, 0])
    return torch.stack(rows)


gathered_naive_torch.uses_triton = False  # plain PyTorch: no interpreter limits apply
