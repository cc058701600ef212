"""Attention implementations shaped like real libraries rather than the whole contract, for
tests/test_applicability.py: the five-argument signature most code has, the same behind an
autograd Function's ``apply``, SDPA with a logsumexp of the fp32 scores, and an o-only
``[B, N, H, D]`` function with ``softmax_scale`` / ``is_causal``, checked with declarations
alone. Each correct one has a buggy twin (a causal mask one key too wide, an lse without
the scale, top-left instead of bottom-right causal alignment) that the suite must fail.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tritoncheck.controls.attention import sdpa as _sdpa


def _scores(q, k, causal: bool, sm_scale, reach: int = 0):
    """fp32 scaled scores [B, H, Nq, Nk], k repeated per group of query heads, with the
    bottom-right causal mask (``reach`` keys past the diagonal: 0 is right, 1 is a bug)."""
    heads, n_q, n_k = q.shape[1], q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(n_q, device=q.device)[:, None]
        j = torch.arange(n_k, device=q.device)[None, :]
        s = s.masked_fill(j > i + (n_k - n_q) + reach, float("-inf"))
    return s


def _plain(q, k, v, causal=False, sm_scale=None, reach: int = 0):
    """(o, lse) in fp32 arithmetic, o in q's dtype; a row that sees no key gives o = 0,
    lse = -inf and zero gradients."""
    s = _scores(q, k, causal, sm_scale, reach)
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return (p @ v.float()).to(q.dtype), torch.logsumexp(s, dim=-1)


def attention(q, k, v, causal=False, sm_scale=None):
    """The most common signature: no window, ALiBi, softcap or dropout."""
    return _plain(q, k, v, causal, sm_scale)


def attention_wide_causal(q, k, v, causal=False, sm_scale=None):
    """Bug: causal rows see one key past their diagonal."""
    return _plain(q, k, v, causal, sm_scale, reach=1)


attention.uses_triton = attention_wide_causal.uses_triton = False


class _Attention(torch.autograd.Function):
    """The plain attention as Liger-Kernel, fla and the Triton tutorials expose kernels:
    forward(ctx, ...) and backward(ctx, ...), called through ``apply``."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, sm_scale=None):
        ctx.save_for_backward(q, k, v)
        ctx.args = (causal, sm_scale)
        o, lse = _plain(q, k, v, causal, sm_scale)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v = (t.detach().requires_grad_(True) for t in ctx.saved_tensors)
        with torch.enable_grad():
            o, _ = _plain(q, k, v, *ctx.args)
        return (*torch.autograd.grad(o, (q, k, v), do), None, None)


class _WideCausalAttention(torch.autograd.Function):
    """Bug: the forward's causal rows see one key past their diagonal."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, sm_scale=None):
        ctx.save_for_backward(q, k, v)
        ctx.args = (causal, sm_scale)
        o, lse = _plain(q, k, v, causal, sm_scale, reach=1)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v = (t.detach().requires_grad_(True) for t in ctx.saved_tensors)
        with torch.enable_grad():
            o, _ = _plain(q, k, v, *ctx.args, reach=1)
        return (*torch.autograd.grad(o, (q, k, v), do), None, None)


attention_apply = _Attention.apply
attention_apply_wide_causal = _WideCausalAttention.apply


def sdpa_attention(q, k, v, causal=False, sm_scale=None):
    """``F.scaled_dot_product_attention`` for o (bottom-right causal as an explicit mask),
    ``torch.logsumexp`` of the fp32 scores for lse: a correct plain attention."""
    s = _scores(q, k, causal, sm_scale)
    mask = ~torch.isneginf(s) if causal else None
    heads = q.shape[1]
    k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale)
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    return o.masked_fill(empty, 0.0), torch.logsumexp(s, dim=-1)


def sdpa_attention_unscaled_lse(q, k, v, causal=False, sm_scale=None):
    """Bug: lse of the scores before sm_scale."""
    o, _ = sdpa_attention(q, k, v, causal, sm_scale)
    return o, torch.logsumexp(_scores(q, k, causal, 1.0), dim=-1)


sdpa_attention.uses_triton = sdpa_attention_unscaled_lse.uses_triton = False
sdpa_attention.supports_backward = sdpa_attention_unscaled_lse.supports_backward = False


def flash_attn_func(q, k, v, *, softmax_scale=None, is_causal=False):
    """o only, q [B, Nq, H, D] and k, v [B, Nk, Hkv, D], flash-attn's argument names."""
    o, _ = _plain(*(t.transpose(1, 2) for t in (q, k, v)), is_causal, softmax_scale)
    return o.transpose(1, 2)


def flash_attn_func_top_left(q, k, v, *, softmax_scale=None, is_causal=False):
    """Bug: causal aligned top-left (row i sees keys j <= i), not bottom-right."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    o, _ = _plain(q, k, v, is_causal, softmax_scale, reach=q.shape[-2] - k.shape[-2])
    return o.transpose(1, 2)


for _fn in (flash_attn_func, flash_attn_func_top_left):
    _fn.returns = ("o",)
    _fn.layout = "bnhd"
    _fn.argument_names = {"sm_scale": "softmax_scale", "causal": "is_causal"}
    _fn.uses_triton = False


def sdpa_without_softcap(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0):
    """Takes a softcap argument but implements none, and says so: {"values": {"softcap": (0.0,)}}."""
    if softcap != 0.0:
        raise NotImplementedError("softcap is not implemented")
    return _sdpa(q, k, v, causal, sm_scale, window, alibi_slopes, softcap)


sdpa_without_softcap.limits = {"values": {"softcap": (0.0,)}}


def sdpa_without_window(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0):
    """Takes a window argument but no sliding window, and says so: {"values": {"window": ((-1, -1),)}}."""
    if tuple(window) != (-1, -1):
        raise NotImplementedError("sliding windows are not implemented")
    return _sdpa(q, k, v, causal, sm_scale, window, alibi_slopes, softcap)


sdpa_without_window.limits = {"values": {"window": ((-1, -1),)}}
