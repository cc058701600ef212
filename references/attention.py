"""fp64 references for ``attention(q, k, v, causal=False, sm_scale=None) -> (o, lse)``.

    s[i, j] = sm_scale * q_i . k_j               (sm_scale defaults to 1 / sqrt(D))
    s[i, j] = -inf            if causal and j > i
    lse[i]  = log sum_j exp(s[i, j])             (computed stably: max + log sum exp(s - max))
    p[i, j] = exp(s[i, j] - max_j s[i, j]) / sum_j exp(s[i, j] - max_j s[i, j])   (= exp(s - lse))
    o[i]    = sum_j p[i, j] v_j

Shapes: q [B, H, Nq, D], k and v [B, H, Nk, D]; o [B, H, Nq, D], lse [B, H, Nq].
"""
from __future__ import annotations

import math

import numpy as np
import torch


def _scale(sm_scale, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


def attention(q, k, v, causal=False, sm_scale=None):
    """NumPy float64 reference; takes array-likes, returns (o, lse) as float64 ndarrays."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = _scale(sm_scale, q.shape[-1])

    scores = (q @ np.swapaxes(k, -1, -2)) * scale  # [..., Nq, Nk]
    if causal:
        future = np.triu(np.ones((n_q, n_k), dtype=bool), k=1)  # key j > query i
        scores = np.where(future, -np.inf, scores)

    # stable logsumexp; a row without a finite max keeps offset 0 (no inf - inf). The
    # weights are exp(s - max) / sum, not exp(s - lse): for scores of 1e16 and more, lse =
    # max + log(sum) rounds to max in fp64 and every weight of a row of equal scores came
    # out 1 instead of 1/n (o was the sum of the values, not their mean; seen with q near
    # bf16's max and a constant k).
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        e = np.exp(scores - row_max)
        total = e.sum(axis=-1, keepdims=True)
        lse = row_max + np.log(total)
        p = e / total
    o = p @ v
    return o, lse[..., 0]


def attention_torch(q, k, v, causal=False, sm_scale=None):
    """PyTorch float64 reference, differentiable in q, k, v; returns (o, lse)."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = _scale(sm_scale, q.shape[-1])

    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.softmax(scores, dim=-1)  # max subtracted first, as in :func:`attention`
    o = p @ v
    return o, lse
