"""fp64 references for ``attention(q, k, v, causal=False, sm_scale=None, window=(-1, -1),
alibi_slopes=None, softcap=0.0, dropout_p=0.0, seed=0, return_keep=False, *, keep=None) -> (o, lse)``.

    diag    = Nk - Nq                              (masks align to the bottom right)
    s[i, j] = sm_scale * q_i . k_(h // (H / Hkv)) j   (sm_scale defaults to 1 / sqrt(D);
                                                    query head h reads KV head h // group)
    s[i, j] = softcap * tanh(s[i, j] / softcap)    if softcap > 0
    s[i, j] -= slope[b, h] * |i + diag - j|        with alibi_slopes ([H] or [B, H])
    visible = j <= i + diag                        if causal
              i + diag - left <= j <= i + diag + right   for window = (left, right), -1 unbounded
    s[i, j] = -inf            where not visible
    lse[i]  = log sum_j exp(s[i, j])             (stable: max + log sum exp(s - max));
              -inf for a row that sees no key
    p[i, j] = exp(s[i, j] - max_j s[i, j]) / sum_j exp(s[i, j] - max_j s[i, j])   (= exp(s - lse))
    o[i]    = sum_j p[i, j] v_j                  (0 for a row that sees no key)
    dropout: o[i] = sum_j p[i, j] keep[i, j] / (1 - dropout_p) v_j, lse unchanged

Dropout's mask comes from the implementation's RNG, so the references take it as ``keep``
(bool, broadcastable to [B, H, Nq, Nk]: an implementation's ``return_keep=True`` mask); the
contract's ``seed`` and ``return_keep`` are accepted (a call with the contract's arguments
binds) and ignored; ``dropout_p > 0`` without ``keep`` has no reference and raises ValueError.

Shapes: q [B, H, Nq, D], k and v [B, Hkv, Nk, D] with H % Hkv == 0; o [B, H, Nq, D], lse [B, H, Nq].
"""
from __future__ import annotations

import math

import numpy as np
import torch


def _scale(sm_scale, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


def visible_pairs(n_q: int, n_k: int, causal: bool = False, window=(-1, -1)) -> np.ndarray:
    """[Nq, Nk] bool: the (query i, key j) pairs a call keeps, bottom-right aligned
    (:func:`visible_pairs_torch` on the host, as a NumPy array)."""
    return visible_pairs_torch(n_q, n_k, causal, window).numpy()


def visible_pairs_torch(n_q: int, n_k: int, causal: bool = False, window=(-1, -1), device=None,
                        rows: slice | None = None) -> torch.Tensor:
    """[rows, Nk] bool on ``device``: the (query i, key j) pairs a call keeps, bottom-right
    aligned, for query rows ``rows`` (default: all), built where it is used (no N x N host
    array on the way to a GPU)."""
    rows = slice(0, n_q) if rows is None else rows
    i = torch.arange(rows.start, rows.stop, device=device)[:, None] + (n_k - n_q)  # row i's diagonal key
    j = torch.arange(n_k, device=device)[None, :]
    left, right = window
    keep = torch.ones(rows.stop - rows.start, n_k, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def alibi_bias_torch(slopes: torch.Tensor, n_q: int, n_k: int, rows: slice | None = None) -> torch.Tensor:
    """:func:`alibi_bias` in float64 torch where ``slopes`` ([H] or [B, H]) are, for query
    rows ``rows`` (default: all): [B or 1, H, rows, Nk]."""
    rows = slice(0, n_q) if rows is None else rows
    slopes = slopes.detach().to(torch.float64)
    i = torch.arange(rows.start, rows.stop, device=slopes.device, dtype=torch.float64)[:, None] + (n_k - n_q)
    dist = (i - torch.arange(n_k, device=slopes.device, dtype=torch.float64)[None, :]).abs()
    return -slopes.reshape((1,) * (2 - slopes.dim()) + tuple(slopes.shape) + (1, 1)) * dist


def alibi_bias(slopes, shape, n_q: int, n_k: int):
    """fp64 ALiBi bias -slope |i + Nk - Nq - j| for scores of ``shape`` [B, H, Nq, Nk]
    (NumPy), from slopes [H] or [B, H] (any array-like)."""
    slopes = np.asarray(slopes, dtype=np.float64)
    dist = np.abs(np.arange(n_q)[:, None] + (n_k - n_q) - np.arange(n_k)[None, :]).astype(np.float64)
    return -np.broadcast_to(slopes.reshape(slopes.shape + (1, 1)), shape[:-2] + (1, 1)) * dist


def _scores(raw, scale: float, softcap: float = 0.0, alibi_slopes=None):
    """Scores from dot products (NumPy or torch, fp64): scaled, softcapped, ALiBi-biased."""
    slopes = alibi_slopes
    s = raw * scale
    if softcap:
        s = softcap * (torch.tanh(s / softcap) if isinstance(s, torch.Tensor) else np.tanh(s / softcap))
    if slopes is not None:
        n_q, n_k = s.shape[-2], s.shape[-1]
        if isinstance(s, torch.Tensor):
            return s + alibi_bias_torch(torch.as_tensor(slopes, device=s.device), n_q, n_k)
        slopes = slopes.detach().cpu().numpy() if isinstance(slopes, torch.Tensor) else slopes
        s = s + alibi_bias(slopes, tuple(s.shape), n_q, n_k)
    return s


def _dropout_factor(dropout_p, keep, torch_like=None):
    """keep / (1 - dropout_p) (fp64, NumPy or torch like ``torch_like``), or None without dropout."""
    if keep is None:
        if dropout_p:
            raise ValueError("attention reference: dropout_p > 0 needs the implementation's keep mask (keep=...); "
                             "the mask comes from its RNG")
        return None
    if torch_like is not None:
        keep = torch.as_tensor(keep, device=torch_like.device)
        return keep.to(torch.float64) / (1.0 - float(dropout_p))
    return np.asarray(keep, dtype=np.float64) / (1.0 - float(dropout_p))


def repeat_kv(t, heads: int):
    """k or v [B, Hkv, N, D] with each KV head repeated for its group of query heads:
    [B, heads, N, D] (NumPy array or torch tensor), KV head h // (heads / Hkv) at head h."""
    group = heads // t.shape[-3]
    if isinstance(t, torch.Tensor):
        return t.repeat_interleave(group, dim=-3)
    return np.repeat(t, group, axis=-3)


def attention(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0,
              dropout_p=0.0, seed=0, return_keep=False, *, keep=None):
    """NumPy float64 reference; takes array-likes, returns (o, lse) as float64 ndarrays. With
    ``keep`` (the implementation's mask) P is multiplied by keep / (1 - dropout_p) before P V."""
    q = np.asarray(q, dtype=np.float64)
    k = repeat_kv(np.asarray(k, dtype=np.float64), q.shape[-3])
    v = repeat_kv(np.asarray(v, dtype=np.float64), q.shape[-3])
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = _scale(sm_scale, q.shape[-1])

    scores = _scores(q @ np.swapaxes(k, -1, -2), scale, softcap, alibi_slopes)  # [..., Nq, Nk]
    visible = visible_pairs(n_q, n_k, causal, tuple(window))
    scores = np.where(visible, scores, -np.inf)

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
        lse = row_max + np.log(total)  # -inf for a row without a visible key
        p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)  # such a row: o = 0
    factor = _dropout_factor(dropout_p, keep)
    if factor is not None:
        p = p * factor  # after the softmax: lse is dropout-free
    o = p @ v
    return o, lse[..., 0]


def attention_torch(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0,
                    dropout_p=0.0, seed=0, return_keep=False, *, keep=None):
    """PyTorch float64 reference, differentiable in q, k, v; returns (o, lse). A row that
    sees no key gives o = 0, lse = -inf and zero gradients (its softmax is never formed).
    ``keep``: the implementation's dropout mask, as in :func:`attention`."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    k, v = repeat_kv(k, q.shape[-3]), repeat_kv(v, q.shape[-3])
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = _scale(sm_scale, q.shape[-1])

    scores = _scores(q @ k.transpose(-1, -2), scale, softcap, alibi_slopes)
    visible = visible_pairs_torch(n_q, n_k, causal, tuple(window), q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    empty = ~visible.any(dim=-1)[:, None]  # [Nq, 1]
    # an empty row's softmax would be 0/0: give it finite scores, then weight 0
    p = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    factor = _dropout_factor(dropout_p, keep, torch_like=q)
    if factor is not None:
        p = p * factor
    o = p @ v
    return o, lse
