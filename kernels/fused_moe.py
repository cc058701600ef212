"""Fused mixture-of-experts layer in Triton: routing, tokens sorted by expert into blocks,
two grouped GEMMs with SwiGLU between them, the weighted sum over each token's experts.

``fused_moe(x, w1, w2, topk_weights=None, topk_ids=None, router_logits=None, top_k=None,
renormalize=True, w1_scale=None, w2_scale=None)`` with ``x [T, H]``, ``w1 [E, 2I, H]`` (gate
rows, then up rows), ``w2 [E, H, I]``::

    y[t] = sum_j w[t, j] * W2[e] (silu(W1[e, :I] x[t]) * W1[e, I:] x[t])      e = ids[t, j]

Routing: ``topk_ids [T, k]`` (int32 or int64) and ``topk_weights [T, k]`` (float32) as given,
or ``router_logits [T, E]``: a float32 softmax, ``torch.topk``, and (``renormalize``) the k
weights divided by their float32 sum.

Alignment (what vLLM's ``moe_align_block_size`` does, in PyTorch here): the T k (token, slot)
pairs, numbered ``p = t k + j``, are sorted by expert (stable: by pair within an expert); each
expert's run is padded to a multiple of BLOCK_M with the sentinel ``T k`` (a padding row: never
loaded, never stored), so every block of BLOCK_M rows belongs to one expert; ``block_expert``
names it. An expert that no pair names gets no block, and its weights are never read.

``_gate_up_kernel`` (one program per (block, BLOCK_N columns of I)): both projections over H in
steps of BLOCK_K with fp32 accumulators, SwiGLU in fp32, ``h`` stored in x's dtype into
``[T k, I]`` at the pair's row (as vLLM keeps its intermediate in the activation dtype).
``_down_kernel`` (one program per (block, BLOCK_N columns of H)): ``h @ W2[e]^T`` over I in
fp32, times the pair's weight, stored in fp32 at the pair's row of ``[T k, H]``; the k rows of
a token are then summed in fp32 (``torch.sum``, a fixed order) and rounded once to x's dtype.

float32 x: tl.dot's default, tf32 on NVIDIA GPUs (undeclared: the rule charges it). bfloat16 under
the interpreter (whose tl.dot reads bf16 operands as integers: tritoncheck/backend.py): the
operands are converted to fp32 before each dot (exact), ``bf16_dot_upcast`` declared.

fp8 weights (``float8_e4m3fn`` with float32 scales per expert ``[E, 1, 1]``, per output channel
``[E, N, 1]`` or per 128 x 128 block ``[E, ceil(N/128), ceil(K/128)]`` over each expert's
``[N, K]`` matrix): each BLOCK_K step's weights are converted to x's dtype (exact: e4m3 fits
float16 and bfloat16), its dot taken in fp32 and scaled by the step's scales (BLOCK_K divides
128: a step never straddles two scale blocks).

Offsets are int64: the pair rows (``p * I``, ``p * H`` pass 2**31 once T k I does), tokens and
experts are cast before a stride multiplies them.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.specialisation import unspecialised_jit

__all__ = ["fused_moe"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn
SCALE_BLOCK = 128  # the quantisation block of fp8 weights, along N and K


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _blocks(device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps); BLOCK_K divides SCALE_BLOCK, tl.dot needs >= 16."""
    if device.type == "cuda" and not _interpreting():
        return 64, 64, 64, 4
    # the interpreter's cost is per program and per step, not per element: wide tiles, narrow rows
    return 32, 128, 128, 4


# --------------------------------------------------------------------------- kernels


@unspecialised_jit
def _gate_up_kernel(
    X,  # *dtype [T, H], any strides
    W1,  # *dtype or *fp8 [E, 2I, H], any strides: rows [0, I) gate, [I, 2I) up
    W1_SCALE,  # *fp32 [E, 1|2I|ceil(2I/128), 1|ceil(H/128)] (read when HAS_SCALE), stride 0 on size-1 axes
    H_OUT,  # *dtype [T k, I], contiguous: silu(gate) * up of each pair
    SORTED_PAIRS,  # *int32 [num_blocks * BLOCK_M]: pair numbers by expert, padding = NUM_PAIRS
    BLOCK_EXPERT,  # *int32 [num_blocks]: each block's expert
    NUM_PAIRS, HIDDEN, INTER, TOP_K,
    stride_xt, stride_xh, stride_we, stride_wn, stride_wk,
    stride_se, stride_sn, stride_sk,
    HAS_SCALE: tl.constexpr, SCALE_N_GROUP: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(BLOCK_EXPERT + block).to(tl.int64)
    pairs = tl.load(SORTED_PAIRS + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = pairs < NUM_PAIRS
    tokens = pairs // TOP_K
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < INTER
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    x_ptrs = X + tokens[:, None] * stride_xt
    w_expert = W1 + expert * stride_we
    gate_ptrs = w_expert + cols[None, :] * stride_wn
    up_ptrs = w_expert + (cols + INTER)[None, :] * stride_wn
    s_expert = W1_SCALE + expert * stride_se
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        ks = k0 + offs_k
        k_ok = ks < HIDDEN
        a = tl.load(x_ptrs + ks[None, :] * stride_xh, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & col_ok[None, :]
        # DOT_DTYPE: x's, fp8 weights converted to it (exact); bf16 under the interpreter: fp32 (exact)
        bg = tl.load(gate_ptrs + ks[:, None] * stride_wk, mask=w_mask, other=0.0).to(DOT_DTYPE)
        bu = tl.load(up_ptrs + ks[:, None] * stride_wk, mask=w_mask, other=0.0).to(DOT_DTYPE)
        a = a.to(DOT_DTYPE)
        if HAS_SCALE:
            # the step lies in one scale block along K: (x w) * s, the products exact in fp32
            kb = k0 // SCALE_BLOCK
            sg = tl.load(s_expert + (cols // SCALE_N_GROUP) * stride_sn + kb * stride_sk, mask=col_ok, other=0.0)
            su = tl.load(s_expert + ((cols + INTER) // SCALE_N_GROUP) * stride_sn + kb * stride_sk, mask=col_ok,
                         other=0.0)
            acc_g += tl.dot(a, bg, input_precision=PRECISION) * sg[None, :]
            acc_u += tl.dot(a, bu, input_precision=PRECISION) * su[None, :]
        else:
            acc_g = tl.dot(a, bg, acc_g, input_precision=PRECISION)
            acc_u = tl.dot(a, bu, acc_u, input_precision=PRECISION)
    # silu(g) u = g sigmoid(g) u, in fp32
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(H_OUT + pairs[:, None] * INTER + cols[None, :], h.to(H_OUT.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@unspecialised_jit
def _down_kernel(
    HBUF,  # *dtype [T k, I], contiguous
    W2,  # *dtype or *fp8 [E, H, I], any strides
    W2_SCALE,  # *fp32 [E, 1|H|ceil(H/128), 1|ceil(I/128)] (read when HAS_SCALE)
    WEIGHTS,  # *fp32 [T, k], any strides: each pair's routing weight
    OUT,  # *fp32 [T k, H], contiguous: each pair's weighted expert output
    SORTED_PAIRS, BLOCK_EXPERT,  # as in _gate_up_kernel
    NUM_PAIRS, HIDDEN, INTER, TOP_K,
    stride_wt, stride_wj,
    stride_we, stride_wn, stride_wk,
    stride_se, stride_sn, stride_sk,
    HAS_SCALE: tl.constexpr, SCALE_N_GROUP: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(BLOCK_EXPERT + block).to(tl.int64)
    pairs = tl.load(SORTED_PAIRS + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = pairs < NUM_PAIRS
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < HIDDEN
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    h_ptrs = HBUF + pairs[:, None] * INTER
    w_ptrs = W2 + expert * stride_we + cols[None, :] * stride_wn
    s_ptrs = W2_SCALE + expert * stride_se + (cols // SCALE_N_GROUP) * stride_sn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        ks = k0 + offs_k
        k_ok = ks < INTER
        a = tl.load(h_ptrs + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        b = tl.load(w_ptrs + ks[:, None] * stride_wk, mask=k_ok[:, None] & col_ok[None, :], other=0.0).to(DOT_DTYPE)
        if HAS_SCALE:
            s = tl.load(s_ptrs + (k0 // SCALE_BLOCK) * stride_sk, mask=col_ok, other=0.0)
            acc += tl.dot(a, b, input_precision=PRECISION) * s[None, :]
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
    weight = tl.load(WEIGHTS + (pairs // TOP_K) * stride_wt + (pairs % TOP_K) * stride_wj, mask=row_ok, other=0.0)
    acc = acc * weight[:, None]
    tl.store(OUT + pairs[:, None] * HIDDEN + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])


# --------------------------------------------------------------------------- routing and alignment


def _route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights fp32 [T, k], topk_ids int64 [T, k]) from the logits."""
    p = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(p, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _align(ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_pairs int32 [num_blocks * block_m], block_expert int32 [num_blocks]): the pairs
    sorted by expert, each expert's run padded to whole blocks with the sentinel T k."""
    device = ids.device
    flat = ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    counts = torch.bincount(flat, minlength=experts)
    blocks = (counts + block_m - 1) // block_m
    block_start = torch.cumsum(blocks, 0) - blocks  # each expert's first block
    first = torch.cumsum(counts, 0) - counts  # each expert's first position in sorted order
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    rank = torch.arange(num_pairs, device=device) - first[expert_of]
    slot = block_start[expert_of] * block_m + rank
    num_blocks = int(blocks.sum())
    sorted_pairs = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_pairs[slot] = order.to(torch.int32)
    block_expert = torch.repeat_interleave(torch.arange(experts, device=device), blocks).to(torch.int32)
    return sorted_pairs, block_expert


# --------------------------------------------------------------------------- wrapper


def _tensor(name: str, t, device: torch.device | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"fused_moe: {name} must be a torch.Tensor, got {type(t).__name__}")
    if device is not None and t.device != device:
        raise ValueError(f"fused_moe: {name} is on {t.device}, x is on {device}")
    return t


def _scale_axes(name: str, scale, w: torch.Tensor, device) -> tuple[int | None, int | None]:
    """The scale's groups over each expert's [N, K] matrix (None: one scale for the axis)."""
    _tensor(name, scale, device)
    if scale.dtype != torch.float32:
        raise TypeError(f"fused_moe: {name} must be float32, got {scale.dtype}")
    if scale.dim() != 3 or scale.shape[0] != w.shape[0]:
        raise ValueError(f"fused_moe: {name} must be [E, n, k] with E = {w.shape[0]}, got {tuple(scale.shape)}")
    n, k = w.shape[1], w.shape[2]
    n_group = {1: None, n: 1, -(-n // SCALE_BLOCK): SCALE_BLOCK}.get(scale.shape[1], 0)
    k_group = {1: None, -(-k // SCALE_BLOCK): SCALE_BLOCK}.get(scale.shape[2], 0)
    if n_group == 0 or k_group == 0:
        raise ValueError(f"fused_moe: {name} has shape {tuple(scale.shape)}; for weights [E, {n}, {k}] it takes "
                         f"[E, 1 or {n} or {-(-n // SCALE_BLOCK)}, 1 or {-(-k // SCALE_BLOCK)}]")
    return n_group, k_group


def _check_routing(x, experts, topk_weights, topk_ids, router_logits, top_k, renormalize):
    t = x.shape[0]
    if router_logits is not None:
        if topk_weights is not None or topk_ids is not None:
            raise ValueError("fused_moe: pass router_logits or topk_weights and topk_ids, not both")
        _tensor("router_logits", router_logits, x.device)
        if router_logits.dtype not in DTYPES:
            raise TypeError(f"fused_moe: router_logits must be float32, float16 or bfloat16, got {router_logits.dtype}")
        if tuple(router_logits.shape) != (t, experts):
            raise ValueError(f"fused_moe: router_logits must be [T, E] = [{t}, {experts}], got "
                             f"{tuple(router_logits.shape)}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
            raise ValueError(f"fused_moe: top_k must be an int in [1, E = {experts}] with router_logits, got {top_k!r}")
        if not isinstance(renormalize, bool):
            raise TypeError(f"fused_moe: renormalize must be a bool, got {type(renormalize).__name__}")
        return
    if topk_weights is None or topk_ids is None:
        raise ValueError("fused_moe: pass topk_weights and topk_ids, or router_logits and top_k")
    if top_k is not None:
        raise ValueError(f"fused_moe: top_k={top_k!r} is for router_logits; topk_ids gives k")
    _tensor("topk_ids", topk_ids, x.device)
    _tensor("topk_weights", topk_weights, x.device)
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"fused_moe: topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_weights.dtype != torch.float32:
        raise TypeError(f"fused_moe: topk_weights must be float32, got {topk_weights.dtype}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_ids.shape[1] < 1:
        raise ValueError(f"fused_moe: topk_ids must be [T, k] with T = {t}, k >= 1, got {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"fused_moe: topk_weights has shape {tuple(topk_weights.shape)}, topk_ids "
                         f"{tuple(topk_ids.shape)}: both [T, k]")
    low, high = int(topk_ids.min()), int(topk_ids.max())
    if low < 0 or high >= experts:
        raise ValueError(f"fused_moe: topk_ids holds {low if low < 0 else high}, outside [0, E = {experts})")


def _check_weights(x, w1, w2, w1_scale, w2_scale):
    for name, w in (("w1", w1), ("w2", w2)):
        _tensor(name, w, x.device)
        if w.dim() != 3:
            raise ValueError(f"fused_moe: {name} must be 3-D, got shape {tuple(w.shape)}")
        if w.dtype != x.dtype and w.dtype != FP8:
            raise TypeError(f"fused_moe: {name} has dtype {w.dtype}; it must be x's ({x.dtype}) or float8_e4m3fn "
                            "with a scale")
    experts, two_i, hidden = w1.shape
    if hidden != x.shape[1]:
        raise ValueError(f"fused_moe: w1 is [E, 2I, H] with H = {hidden}, x has H = {x.shape[1]}")
    if two_i == 0 or two_i % 2:
        raise ValueError(f"fused_moe: w1's second dim must be 2I (gate and up rows), got {two_i}")
    if tuple(w2.shape) != (experts, hidden, two_i // 2):
        raise ValueError(f"fused_moe: w2 must be [E, H, I] = [{experts}, {hidden}, {two_i // 2}], got {tuple(w2.shape)}")
    if w1.dtype != w2.dtype:
        raise TypeError(f"fused_moe: w2 has dtype {w2.dtype}, w1 {w1.dtype}: both the same")
    quantised = w1.dtype == FP8
    for name, scale in (("w1_scale", w1_scale), ("w2_scale", w2_scale)):
        if quantised and scale is None:
            raise ValueError(f"fused_moe: float8_e4m3fn weights need {name}")
        if not quantised and scale is not None:
            raise ValueError(f"fused_moe: {name} is given but the weights are {w1.dtype}, not float8_e4m3fn")


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor | None = None,
              topk_ids: torch.Tensor | None = None, router_logits: torch.Tensor | None = None,
              top_k: int | None = None, renormalize: bool = True, w1_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The MoE layer's output ``y [T, H]`` in x's dtype (see the module docstring)."""
    _tensor("x", x)
    if x.dtype not in DTYPES:
        raise TypeError(f"fused_moe: x has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if x.dim() != 2 or x.numel() == 0:
        raise ValueError(f"fused_moe: x must be a non-empty [T, H], got shape {tuple(x.shape)}")
    if x.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"fused_moe: x is on {x.device}: needs a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors")
    _check_weights(x, w1, w2, w1_scale, w2_scale)
    experts, two_i, hidden = w1.shape
    inter = two_i // 2
    _check_routing(x, experts, topk_weights, topk_ids, router_logits, top_k, renormalize)
    s1 = _scale_axes("w1_scale", w1_scale, w1, x.device) if w1_scale is not None else (1, None)
    s2 = _scale_axes("w2_scale", w2_scale, w2, x.device) if w2_scale is not None else (1, None)
    if router_logits is not None:
        topk_weights, topk_ids = _route(router_logits, top_k, renormalize)
    tokens, top = topk_ids.shape
    num_pairs = tokens * top
    block_m, block_n, block_k, warps = _blocks(x.device)
    sorted_pairs, block_expert = _align(topk_ids, experts, block_m)
    num_blocks = block_expert.numel()
    # the dots' operand type: x's; bfloat16 under the interpreter goes through fp32 ("ieee")
    upcast = _interpreting() and x.dtype == torch.bfloat16
    dot_dtype = tl.float32 if upcast else {torch.float32: tl.float32, torch.float16: tl.float16,
                                           torch.bfloat16: tl.bfloat16}[x.dtype]
    dot_precision = "ieee" if upcast else "tf32"
    h = torch.empty((num_pairs, inter), dtype=x.dtype, device=x.device)
    out = torch.empty((num_pairs, hidden), dtype=torch.float32, device=x.device)

    def scale_strides(scale):
        if scale is None:
            return 0, 0, 0
        return tuple(scale.stride(a) if scale.shape[a] > 1 else 0 for a in range(3))

    if num_blocks:
        _gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
            x, w1, w1_scale if w1_scale is not None else x, h, sorted_pairs, block_expert,
            num_pairs, hidden, inter, top,
            x.stride(0), x.stride(1), w1.stride(0), w1.stride(1), w1.stride(2), *scale_strides(w1_scale),
            HAS_SCALE=w1_scale is not None, SCALE_N_GROUP=s1[0] or 1, SCALE_BLOCK=SCALE_BLOCK, DOT_DTYPE=dot_dtype, PRECISION=dot_precision,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
        _down_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
            h, w2, w2_scale if w2_scale is not None else x, topk_weights, out, sorted_pairs, block_expert,
            num_pairs, hidden, inter, top,
            topk_weights.stride(0), topk_weights.stride(1),
            w2.stride(0), w2.stride(1), w2.stride(2), *scale_strides(w2_scale),
            HAS_SCALE=w2_scale is not None, SCALE_N_GROUP=s2[0] or 1, SCALE_BLOCK=SCALE_BLOCK, DOT_DTYPE=dot_dtype, PRECISION=dot_precision,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    return out.view(tokens, top, hidden).sum(dim=1).to(x.dtype)


fused_moe.dtypes = DTYPES
fused_moe.supports_backward = False
fused_moe.bf16_dot_upcast = True
