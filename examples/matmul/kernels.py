"""A tiled matrix product in Triton, and its split-K variant, forward and backward.

``matmul(a, b)`` and ``matmul_split_k(a, b)`` with ``a [M, K]``, ``b [K, N]`` (float32,
float16 or bfloat16, the same dtype, any strides) return ``c = a @ b`` ``[M, N]`` in that
dtype: every product exact in fp32 (fp32 inputs: tf32 products on NVIDIA GPUs, as Triton's
``tl.dot`` defaults to), sums accumulated in fp32, rounded once to the output dtype::

    c[m, n] = round( sum_k a[m, k] b[k, n] )

Tiling (the Triton tutorial's shape): one program owns a ``[BLOCK_M, BLOCK_N]`` tile of
``c``, programs ordered in groups of ``GROUP_M`` tile rows so that neighbouring programs
share tiles of ``a`` and ``b`` in the L2 cache, and walks K in steps of ``BLOCK_K``; the
last step is masked (loads 0 past K), so any K is summed whole. Row and column offsets
are int64 (``m * stride_am`` passes 2**31 once ``a`` does); the K walk advances the
pointers by ``BLOCK_K * stride`` (64-bit pointer arithmetic), so a K past 2**31 elements
(the backward's ``a^T @ dc`` over a long M) is safe too.

Split-K: ``SPLIT_K`` programs share one output tile, split ``s`` summing the K blocks
``s, s + SPLIT_K, s + 2 SPLIT_K, ...`` into an fp32 workspace ``[SPLIT_K, M, N]``; a second
kernel adds the splits in order (deterministic: no atomics) and rounds once. It pays off
when the output has few tiles and K is long (the backward's ``db = a^T @ dc``);
``SPLIT_K = min(MAX_SPLIT_K, cdiv(K, BLOCK_K))``, so every split holds at least one block.

Backward (both variants, the same kernels on transposed views): ``da = dc @ b^T``,
``db = a^T @ dc``, each rounded once to the input dtype.

bfloat16 under the Triton interpreter: the interpreter holds bf16 as 16-bit integers and
its ``tl.dot`` multiplies those (triton#11584), so the tiles are widened to fp32 before
the dot there (``UPCAST``), by their bits: the interpreter's own bf16 -> fp32 cast garbles
subnormals (1e-39 reads as 4.4e-39), which a large value in the other operand turns into
an error far past the product's rounding. Compiled, bf16 goes to the tensor cores as it is.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["matmul", "matmul_split_k"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M = 64, 64, 32, 8
MAX_SPLIT_K = 16

# Compiled once per dtype and constexprs: the sizes, strides and pointers are runtime
# values (Triton would otherwise compile again for each stride divisible by 16, equal to 1,
# or pointer alignment it meets: hundreds of variants over a fuzzing run's layouts).
_RUNTIME = ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cs", "stride_cm",
            "stride_cn", "SPLIT_K")
_POINTERS = ("A", "B", "C")


@triton.jit
def _widen_bf16(t):
    """bf16 -> fp32 by the bits (exact, subnormals included)."""
    return ((t.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=_RUNTIME, do_not_specialize_on_alignment=_POINTERS)
def _matmul_kernel(
    A,  # *[M, K] input, strides (stride_am, stride_ak)
    B,  # *[K, N] input, strides (stride_bk, stride_bn)
    C,  # *[SPLIT_K, M, N] output (SPLIT_K = 1: c itself, in its dtype) or fp32 workspace
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cs, stride_cm, stride_cn,
    SPLIT_K,  # programs sharing one output tile along axis 1 of the grid
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UPCAST: tl.constexpr,  # widen bf16 tiles to fp32 before tl.dot (under the interpreter)
):
    # tile (pid_m, pid_n) from the grouped order: GROUP_M tile rows sweep the columns together
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m

    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + offs_m[:, None] * stride_am + (pid_k * BLOCK_K + offs_k)[None, :] * stride_ak
    b_ptrs = B + (pid_k * BLOCK_K + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn
    # this split's K blocks are pid_k, pid_k + SPLIT_K, ...: the pointers step over SPLIT_K blocks
    step_a = stride_ak.to(tl.int64) * BLOCK_K * SPLIT_K
    step_b = stride_bk.to(tl.int64) * BLOCK_K * SPLIT_K

    # c_tile = sum over the K blocks of a_tile @ b_tile, in fp32; lanes past K (the last
    # block's tail) and past M, N load 0, the identity of the sum
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(pid_k, tl.cdiv(K, BLOCK_K), SPLIT_K):
        k_left = K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        if UPCAST:
            a = _widen_bf16(a)
            b = _widen_bf16(b)
        acc += tl.dot(a, b)
        a_ptrs += step_a
        b_ptrs += step_b

    c_ptrs = C + pid_k.to(tl.int64) * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit(do_not_specialize=("M", "N", "SPLIT_K", "stride_ws", "stride_wm", "stride_cm", "stride_cn"),
            do_not_specialize_on_alignment=("WS", "C"))
def _sum_splits_kernel(
    WS,  # *fp32 [SPLIT_K, M, N] partial sums, strides (stride_ws, stride_wm, 1)
    C,  # *[M, N] output, strides (stride_cm, stride_cn)
    M, N, SPLIT_K,
    stride_ws, stride_wm, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # c = round(sum_s ws[s]), the splits added in order 0, 1, ..., SPLIT_K - 1
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws_ptrs = WS + offs_m[:, None] * stride_wm + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _split in range(0, SPLIT_K):
        acc += tl.load(ws_ptrs, mask=mask, other=0.0)
        ws_ptrs += stride_ws  # 64-bit pointer steps: SPLIT_K * M * N may pass 2**31
    tl.store(C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(C.dtype.element_ty), mask=mask)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _product(a: torch.Tensor, b: torch.Tensor, split_k: bool) -> torch.Tensor:
    """a @ b for 2-D tensors already checked, one launch (two with split-K)."""
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    splits = min(MAX_SPLIT_K, triton.cdiv(K, BLOCK_K)) if split_k else 1
    out = c if splits == 1 else torch.empty((splits, M, N), device=a.device, dtype=torch.float32)
    out_strides = (0, c.stride(0), c.stride(1)) if splits == 1 else out.stride()
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), splits)
    _matmul_kernel[grid](
        a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), *out_strides, splits,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
        UPCAST=_interpreted() and a.dtype == torch.bfloat16)
    if splits > 1:
        _sum_splits_kernel[(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))](
            out, c, M, N, splits, out.stride(0), out.stride(1), c.stride(0), c.stride(1),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return c


class _MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, split_k):
        ctx.save_for_backward(a, b)
        ctx.split_k = split_k
        return _product(a, b, split_k)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        da = _product(dc, b.t(), ctx.split_k) if ctx.needs_input_grad[0] else None
        db = _product(a.t(), dc, ctx.split_k) if ctx.needs_input_grad[1] else None
        return da, db, None


def _checked(a, b) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"matmul: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"matmul: {name} has dtype {t.dtype}; supported: float32, float16, bfloat16")
        if t.dim() != 2:
            raise ValueError(f"matmul: {name} must be 2-D, got shape {list(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: a and b must have one dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: a is {list(a.shape)} and b is {list(b.shape)}: a's columns must equal b's rows")
    if a.device != b.device:
        raise ValueError(f"matmul: a is on {a.device} and b on {b.device}")


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (module docstring), one tile of ``c`` per program."""
    _checked(a, b)
    return _MatMul.apply(a, b, False)


def matmul_split_k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (module docstring), K split among up to MAX_SPLIT_K programs per tile."""
    _checked(a, b)
    return _MatMul.apply(a, b, True)


for _fn in (matmul, matmul_split_k):
    _fn.dtypes = DTYPES
    _fn.supports_backward = True
    _fn.fp32_dot_precision = "tf32"  # tl.dot's default for fp32 operands on NVIDIA GPUs
