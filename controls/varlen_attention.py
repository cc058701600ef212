"""A correct plain-PyTorch varlen_attention: the dense control run sequence by sequence.

``naive_torch_per_sequence`` slices each sequence's tokens out of the packed tensors (the
offsets read on the host), runs ``tritoncheck.controls.attention.naive_torch`` on it as a
dense [1, H, N, D] call in the input dtype, and concatenates the rows. A sequence without
keys gets o = 0, lse = -inf (the dense control needs at least one key).
"""
from __future__ import annotations

import torch

from tritoncheck.controls.attention import naive_torch


def naive_torch_per_sequence(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None, window=(-1, -1),
                             softcap=0.0):
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    o_parts, lse_parts = [], []
    for b in range(len(cq) - 1):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        n = rows.stop - rows.start
        if n == 0:
            continue
        if keys.stop == keys.start:
            o_parts.append(q[rows] * 0)  # tied to q: its rows get a zero gradient
            lse_parts.append(torch.full((q.shape[1], n), float("-inf"), device=q.device))
            continue
        dense = [t[s].transpose(0, 1)[None] for t, s in ((q, rows), (k, keys), (v, keys))]
        o_b, lse_b = naive_torch(*dense, causal, sm_scale if sm_scale is not None else q.shape[-1] ** -0.5,
                                 window, None, softcap)
        o_parts.append(o_b[0].transpose(0, 1))
        lse_parts.append(lse_b[0].float())
    # k and v reach o's first element with weight 0 (autograd needs a path when no sequence reads
    # them): one element each, added to one element, so that their gradient is do[0] * 0 = 0 and
    # no sum (of near-max values, or of the upstream gradient in float16) overflows into 0 * inf
    flat = torch.cat(o_parts).flatten()
    first = flat[:1] + 0 * k.flatten()[:1] + 0 * v.flatten()[:1]
    return torch.cat([first, flat[1:]]).view(-1, *q.shape[1:]), torch.cat(lse_parts, dim=1)


naive_torch_per_sequence.uses_triton = False  # plain PyTorch: no interpreter limits apply
