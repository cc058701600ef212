"""A plain-PyTorch stand-in for ``flag_gems.ops.attention.flash_attn_varlen_func``, for
checking the adapters' plumbing on a machine without a GPU (FlagGems imports only with a
CUDA device and its kernels take CUDA tensors only; README.md, "On CPU").

It implements the function's documented semantics (its docstring, flash-attention 2's):
q ``[total_q, H, D]``; k, v ``[total_k, Hkv, D]`` packed by ``cu_seqlens_k``, or paged
``[num_pages, page_size, Hkv, D]`` read through ``block_table`` with ``seqused_k`` keys per
sequence; masks aligned to each sequence's bottom right; ``window_size`` ``(left, right)``
with -1 unbounded on that side (causal is right = 0); ``softcap * tanh(s / softcap)``;
``softmax_lse`` ``[H, total_q]`` float32. A row that sees no key gets o = 0 and lse = +inf,
flash-attention's convention (the contract's is -inf: the adapter maps it). FlagGems's
argument checks that the adapters must satisfy (``mha_varlan_fwd``'s asserts: float16 or
bfloat16, int32 offsets, k and v of one stride, head dim a multiple of 8 up to 256) are
asserted here too, so that a call the GPU would reject fails here first. It is correct by
construction; it says nothing about FlagGems's kernel, only about how the adapters call it.
"""
from __future__ import annotations

import torch


def _visible(n_q: int, n_k: int, causal: bool, window: tuple[int, int], device) -> torch.Tensor:
    """[n_q, n_k] bool: key j visible to query i (bottom-right aligned)."""
    i = torch.arange(n_q, device=device)[:, None] + (n_k - n_q)
    j = torch.arange(n_k, device=device)[None, :]
    left, right = window
    keep = torch.ones((n_q, n_k), dtype=torch.bool, device=device)
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def _attend(q, k, v, causal, scale, window, softcap):
    """One sequence: q [n_q, H, D], k, v [n_k, Hkv, D] -> (o [n_q, H, D], lse [H, n_q]), in float32."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~_visible(q.shape[0], k.shape[0], causal, window, q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # a row without keys: exp(-inf - -inf) = NaN -> 0
    o = torch.einsum("hqk,khd->qhd", p, v)
    return o, lse.masked_fill(lse == float("-inf"), float("inf"))


def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None,
                           softmax_scale=None, causal=False, window_size=None, softcap=0.0, block_table=None,
                           return_softmax_lse=False):
    assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype
    assert cu_seqlens_q.dtype == torch.int32 and (cu_seqlens_k is None or cu_seqlens_k.dtype == torch.int32)
    assert k.stride() == v.stride() and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
    assert (cu_seqlens_k is None) != (seqused_k is None) and (block_table is None or seqused_k is not None)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    window = (-1, -1) if window_size is None else tuple(window_size)
    cq = cu_seqlens_q.tolist()
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"), device=q.device)
    for b in range(len(cq) - 1):
        rows = slice(cq[b], cq[b + 1])
        if block_table is None:
            keys = slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
            k_b, v_b = k[keys], v[keys]
        else:
            n = int(seqused_k[b])
            slots = torch.arange(n, device=q.device)
            pages = block_table[b].long()[slots // k.shape[1]]
            k_b, v_b = k[pages, slots % k.shape[1]], v[pages, slots % k.shape[1]]
        if rows.stop > rows.start and k_b.shape[0] > 0:
            o[rows], lse[:, rows] = _attend(q[rows], k_b, v_b, causal, scale, window, softcap)
    o = o.to(q.dtype)
    return (o, lse) if return_softmax_lse else o
