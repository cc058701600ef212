"""fp64 references for linear attention and its ELU + 1 feature map.

Written for reading, not speed (in the style of fla's ``naive.py``). Arrays are
``np.ndarray`` float64; shapes follow ``docs/contract.md``:
``q, k [B, H, N, D]`` (non-negative features), ``v [B, H, N, Dv]``, ``o [B, H, N, Dv]``.

Three forms of the same attention, cross-checked by the tests:

* bidirectional: ``S = sum_j k_j v_j^T``, ``z = sum_j k_j``, ``o_i = q_i S / (q_i . z + eps)``;
* causal, cumsum: ``S_i = sum_{j <= i} k_j v_j^T`` for every i at once (O(N D Dv) memory);
* causal, recurrent: the same state updated token by token (the definition, slowest).
"""
from __future__ import annotations

import numpy as np
import torch


def elu_feature_map(x) -> np.ndarray:
    """``elu(x) + 1 = max(x, 0) + exp(min(x, 0))`` in fp64 (NaN stays NaN)."""
    x = np.asarray(x, dtype=np.float64)
    return np.maximum(x, 0.0) + np.exp(np.minimum(x, 0.0))


def elu_feature_map_torch(x: torch.Tensor) -> torch.Tensor:
    """fp64 PyTorch ``elu(x) + 1``, differentiable; derivative 1 for x > 0, exp(x) for x <= 0.

    Written with ``where`` so that the derivative at x = 0 is exp(0) = 1 (a
    ``clamp_min(x, 0) + exp(clamp_max(x, 0))`` would give 2 there: torch's clamp passes
    the gradient at the boundary on both sides).
    """
    x = x.to(torch.float64)
    return torch.where(x > 0, x + 1.0, torch.exp(torch.clamp(x, max=0.0)))


def _as64(*arrays):
    return tuple(np.asarray(a, dtype=np.float64) for a in arrays)


def linear_attention_bidirectional(q, k, v, eps=1e-6) -> np.ndarray:
    """Every query attends to every key: one state for the whole sequence."""
    q, k, v = _as64(q, k, v)
    S = np.einsum("bhnd,bhne->bhde", k, v)  # sum_j k_j v_j^T   [B, H, D, Dv]
    z = k.sum(axis=2)  # sum_j k_j          [B, H, D]
    num = np.einsum("bhnd,bhde->bhne", q, S)  # q_i S              [B, H, N, Dv]
    den = np.einsum("bhnd,bhd->bhn", q, z) + eps  # q_i . z + eps      [B, H, N]
    return num / den[..., None]


def linear_attention_causal_cumsum(q, k, v, eps=1e-6) -> np.ndarray:
    """Causal through prefix sums: S_i = cumsum_j k_j v_j^T holds the state of every i at once."""
    q, k, v = _as64(q, k, v)
    kv = np.einsum("bhnd,bhne->bhnde", k, v)  # k_j v_j^T            [B, H, N, D, Dv]
    S = np.cumsum(kv, axis=2)  # S_i = sum_{j<=i}     [B, H, N, D, Dv]
    z = np.cumsum(k, axis=2)  # z_i = sum_{j<=i} k_j [B, H, N, D]
    num = np.einsum("bhnd,bhnde->bhne", q, S)
    den = np.einsum("bhnd,bhnd->bhn", q, z) + eps
    return num / den[..., None]


def linear_attention_causal_recurrent(q, k, v, eps=1e-6) -> np.ndarray:
    """Causal, token by token: add k_i v_i^T to the state, then read it with q_i."""
    q, k, v = _as64(q, k, v)
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    o = np.zeros((B, H, N, Dv))
    S = np.zeros((B, H, D, Dv))
    z = np.zeros((B, H, D))
    for i in range(N):
        S = S + k[:, :, i, :, None] * v[:, :, i, None, :]
        z = z + k[:, :, i]
        num = np.einsum("bhd,bhde->bhe", q[:, :, i], S)
        den = np.einsum("bhd,bhd->bh", q[:, :, i], z) + eps
        o[:, :, i] = num / den[..., None]
    return o


def linear_attention(q, k, v, causal=False, eps=1e-6) -> np.ndarray:
    """The contract's ``linear_attention`` in fp64: the bidirectional form, or the causal cumsum form."""
    if causal:
        return linear_attention_causal_cumsum(q, k, v, eps)
    return linear_attention_bidirectional(q, k, v, eps)


# --------------------------------------------------------------- fp64 PyTorch, on any device

# elements of the [B, H, block, D, E] float64 outer products a causal read forms at once (128 MiB)
STATE_BLOCK_ELEMENTS = 2**24


def causal_state_reads(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``q_i . sum_{j <= i} k_j x_j^T`` for every i ([B, H, N, E]) in q's dtype and device:
    the causal cumsum form a block of positions at a time (the earlier blocks' state
    carried), so memory stays STATE_BLOCK_ELEMENTS whatever N. An inf or NaN at position j
    reaches positions i >= j only, as in :func:`linear_attention_causal_cumsum`."""
    b, h, n, d = q.shape
    e = x.shape[-1]
    out = q.new_empty(b, h, n, e)
    state = q.new_zeros(b, h, d, e)
    block = max(1, STATE_BLOCK_ELEMENTS // max(1, b * h * d * e))
    for n0 in range(0, n, block):
        sl = slice(n0, min(n, n0 + block))
        prefix = torch.cumsum(k[:, :, sl, :, None] * x[:, :, sl, None, :], dim=2) + state[:, :, None]
        out[:, :, sl] = torch.einsum("bhnd,bhnde->bhne", q[:, :, sl], prefix)
        state = prefix[:, :, -1]
    return out


def linear_attention_torch(q, k, v, causal=False, eps=1e-6) -> torch.Tensor:
    """PyTorch float64 :func:`linear_attention` on the inputs' device (the GPU's fp64
    reference: no host round trip for the N D Dv work of the causal form)."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    if causal:
        num = causal_state_reads(q, k, v)
        den = (q * torch.cumsum(k, dim=2)).sum(-1) + eps
    else:
        num = q @ (k.transpose(-1, -2) @ v)
        den = (q * k.sum(dim=2, keepdim=True)).sum(-1) + eps
    return num / den[..., None]
