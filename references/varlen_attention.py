"""fp64 references for ``varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False,
sm_scale=None, window=(-1, -1), softcap=0.0) -> (o, lse)``.

The packed op is the dense one (``references/attention.py``) run on each sequence alone::

    for b in range(B):
        rows = cu_seqlens_q[b] : cu_seqlens_q[b + 1],  keys = cu_seqlens_k[b] : cu_seqlens_k[b + 1]
        o[rows], lse[:, rows] = attention(q[rows], k[keys], v[keys], causal, sm_scale, window, softcap)

with [T, H, D] seen as [1, H, T, D]: masks align to each sequence's own bottom right
(diag_b = Nk_b - Nq_b). A sequence of zero keys has rows that see no key (o = 0, lse = -inf);
one of zero queries has no rows. Shapes: q [Tq, H, D], k, v [Tk, Hkv, D]; o [Tq, H, D], lse
[H, Tq].
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.references import attention as dense


def sequences(cu_seqlens_q, cu_seqlens_k) -> list[tuple[slice, slice]]:
    """(query rows, key rows) of each sequence, from the offsets (tensors or array-likes)."""
    cq = [int(x) for x in (cu_seqlens_q.tolist() if hasattr(cu_seqlens_q, "tolist") else cu_seqlens_q)]
    ck = [int(x) for x in (cu_seqlens_k.tolist() if hasattr(cu_seqlens_k, "tolist") else cu_seqlens_k)]
    return [(slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])) for b in range(len(cq) - 1)]


def as_dense(t, rows: slice):
    """Rows ``rows`` of a packed [T, H, D] tensor as a dense [1, H, n, D] one (NumPy or torch)."""
    part = t[rows]
    return part.transpose(0, 1)[None] if isinstance(part, torch.Tensor) else np.swapaxes(part, 0, 1)[None]


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None, window=(-1, -1),
                     softcap=0.0):
    """NumPy float64 reference: (o [Tq, H, D], lse [H, Tq]) as float64 ndarrays."""
    q = np.asarray(q, dtype=np.float64)
    k, v = (np.asarray(t, dtype=np.float64) for t in (k, v))
    scale = dense._scale(sm_scale, q.shape[-1])
    o = np.zeros(q.shape)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for rows, keys in sequences(cu_seqlens_q, cu_seqlens_k):
        if rows.stop == rows.start or keys.stop == keys.start:
            continue  # no rows, or rows that see no key: o = 0, lse = -inf
        o_b, lse_b = dense.attention(as_dense(q, rows), as_dense(k, keys), as_dense(v, keys), causal, scale,
                                     tuple(window), None, softcap)
        o[rows] = np.swapaxes(o_b[0], 0, 1)
        lse[:, rows] = lse_b[0]
    return o, lse


def varlen_attention_torch(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None, window=(-1, -1),
                           softcap=0.0):
    """PyTorch float64 reference, differentiable in q, k, v: (o, lse). Rows that see no key
    get o = 0 and zero gradients."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    scale = dense._scale(sm_scale, q.shape[-1])
    o_parts, lse_parts = [], []
    for rows, keys in sequences(cu_seqlens_q, cu_seqlens_k):
        n = rows.stop - rows.start
        if n == 0:
            continue
        if keys.stop == keys.start:
            o_parts.append(q[rows] * 0.0)  # tied to q so that its rows get a zero gradient
            lse_parts.append(torch.full((q.shape[1], n), float("-inf"), dtype=torch.float64, device=q.device))
            continue
        o_b, lse_b = dense.attention_torch(as_dense(q, rows), as_dense(k, keys), as_dense(v, keys), causal, scale,
                                           tuple(window), None, softcap)
        o_parts.append(o_b[0].transpose(0, 1))
        lse_parts.append(lse_b[0])
    o = torch.cat(o_parts, dim=0) if o_parts else q * 0.0
    lse = torch.cat(lse_parts, dim=1) if lse_parts else torch.empty((q.shape[1], 0), dtype=torch.float64)
    # k and v unused when no sequence has both rows and keys: tie them in with weight 0
    return o + 0.0 * (k.flatten()[:1].sum() + v.flatten()[:1].sum()), lse
