"""Block-scaled low-precision GEMM in Triton: fp8 (e4m3fn, e5m2) or int8 operands with
float32 scales per tensor, per row / column or per block, as DeepSeek-V3 and vLLM quantise.

``scaled_mm(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16)`` with ``a [M, K]``
and ``b [K, N]`` in one format::

    c[m, n] = sum_k (a[m, k] sa(m, k)) (b[k, n] sb(k, n)) + bias[n]     rounded once to out_dtype

``a_scale`` is ``[1 or M, 1 or ceil(K / 128)]`` (per tensor, per row, per 1 x 128 block
along K) and ``b_scale`` ``[1 or ceil(K / 128), 1 or N or ceil(N / 128)]`` (per tensor, per
column, per 128 x 128 block); a K (or N) that is not a multiple of 128 ends in a short block
with a scale of its own. A scale axis of size 1 is read with stride 0 (broadcast).

One program per ``[BLOCK_M, BLOCK_N]`` tile of ``c`` walks K in steps of ``BLOCK_K`` (which
divides 128, so a step never straddles two scale blocks):

* scales constant along K (per tensor, row, column): ``acc += a @ b`` (``tl.dot``) over the
  whole of K (fp8: fp32 accumulator; int8: int32, exact), then ``acc * (sa sb)``;
* a scale that varies along K (a block scale on either side): each step's ``tl.dot(a, b)``
  is scaled by that block's ``sa sb`` and added into an fp32 accumulator.

The products of two fp8 or int8 values are exact in fp32 (int32), so under the interpreter
(which computes an fp8 ``tl.dot`` in fp32; e5m2 operands are converted to fp32 before it
there, since its fp8 dot reads e5m2 subnormals wrongly: tritoncheck/backend.py) the only roundings are fp32 sums, the scales'
two products, the bias and the store. On an sm_90 GPU the fp8 tensor core keeps fewer bits
than fp32 in its accumulation (13 fraction bits, truncating: the PyTorch blog "Some matrix
multiplication engines are not as accurate as we thought"; DeepSeek-V3 reports about 14);
every ``tl.dot`` here passes ``max_num_imprecise_acc=32``, so Triton adds the tensor core's
partial sum into the fp32 accumulator after every 32 products (one wgmma), and the kernel
declares it (``scaled_mm.fp8_accumulation``; tritoncheck/declarations.py). int8 products and
sums are exact in int32 whatever K (|sum| < 2^31 while K < 2^17).

Offsets are int64 (row, column and K indices are cast before a stride multiplies them):
``M * K``, ``K * N`` and ``M * N`` may pass 2**31. Any strides of every input are read in
place; ``c`` is a new contiguous tensor.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.specialisation import unspecialised_jit

__all__ = ["scaled_mm"]

FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SCALE_BLOCK = 128  # the contract's quantisation block along K (and N for b's block scales)
IMPRECISE_EVERY = 32  # products between promotions of the fp8 tensor core's partial sum to fp32


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _blocks(device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps); BLOCK_K divides SCALE_BLOCK and tl.dot needs >= 16."""
    if device.type == "cuda" and not _interpreting():
        return 128, 128, 128, 8
    return 32, 32, 32, 4


# --------------------------------------------------------------------------- kernels


@triton.jit
def _dot(a, b, acc, IS_INT: tl.constexpr, IMPRECISE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b: int8 into int32 (exact), fp8 into fp32 with the tensor core's partial sum
    promoted to fp32 every IMPRECISE products; UPCAST (e5m2 under the interpreter, whose fp8
    tl.dot misreads e5m2 subnormals): the operands converted to fp32 first (exact), an fp32 dot."""
    if IS_INT:
        # not tl.dot(a, b, acc): compiling for the GPU (not under the interpreter), Triton 3.6's
        # semantic.dot fails a bare assertion on an int8 dot given an int32 accumulator (found on
        # sm_90); the sum is exact in int32 either way
        return acc + tl.dot(a, b, out_dtype=tl.int32)
    elif UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, max_num_imprecise_acc=IMPRECISE)


@unspecialised_jit
def _scaled_mm_kernel(
    A, B,  # *fp8 or *int8: a [M, K], b [K, N], any strides
    A_SCALE,  # *fp32: a_scale entry (m, k // 128), stride 0 along an axis of size 1
    B_SCALE,  # *fp32: b_scale entry (k // 128, n // B_N_GROUP), stride 0 along an axis of size 1
    BIAS,  # *out_dtype [N] (read when HAS_BIAS)
    C,  # *out_dtype [M, N], contiguous
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn,
    stride_sam, stride_sak, stride_sbk, stride_sbn, stride_bias,
    SCALE_IN_LOOP: tl.constexpr,  # a scale varies along K: each step is scaled by its block's sa sb
    B_N_GROUP: tl.constexpr,  # columns per b_scale entry: 1 (per column) or SCALE_BLOCK
    HAS_BIAS: tl.constexpr, IS_INT: tl.constexpr, IMPRECISE: tl.constexpr, UPCAST: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    a_ptrs = A + rows[:, None] * stride_am
    b_ptrs = B + cols[None, :] * stride_bn
    sa_ptrs = A_SCALE + rows * stride_sam
    sb_ptrs = B_SCALE + (cols // B_N_GROUP) * stride_sbn
    if SCALE_IN_LOOP:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            k_ok = ks < K
            a = tl.load(a_ptrs + ks[None, :] * stride_ak, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs + ks[:, None] * stride_bk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            if IS_INT:
                part = _dot(a, b, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32), IS_INT, IMPRECISE, UPCAST)
                part = part.to(tl.float32)
            else:
                part = _dot(a, b, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_INT, IMPRECISE, UPCAST)
            # the step lies in one scale block (BLOCK_K divides SCALE_BLOCK): c += (a b) (sa sb)
            kb = k0 // SCALE_BLOCK
            sa = tl.load(sa_ptrs + kb * stride_sak, mask=row_ok, other=0.0)
            sb = tl.load(sb_ptrs + kb * stride_sbk, mask=col_ok, other=0.0)
            acc += part * (sa[:, None] * sb[None, :])
    else:
        if IS_INT:
            acc_k = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
        else:
            acc_k = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            k_ok = ks < K
            a = tl.load(a_ptrs + ks[None, :] * stride_ak, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs + ks[:, None] * stride_bk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc_k = _dot(a, b, acc_k, IS_INT, IMPRECISE, UPCAST)
        # one scale per row and per column: c = (sum_k a b) (sa sb)
        sa = tl.load(sa_ptrs, mask=row_ok, other=0.0)
        sb = tl.load(sb_ptrs, mask=col_ok, other=0.0)
        acc = acc_k.to(tl.float32) * (sa[:, None] * sb[None, :])
    if HAS_BIAS:
        acc += tl.load(BIAS + cols * stride_bias, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(C + rows[:, None] * N + cols[None, :], acc.to(C.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


# --------------------------------------------------------------------------- wrapper


def _blocks_of(n: int) -> int:
    return -(-n // SCALE_BLOCK)


def _scale_axes(name: str, scale, shape: tuple[int, int], allowed: tuple[tuple[int, ...], tuple[int, ...]],
                device: torch.device) -> tuple[int | None, int | None]:
    """The group of each axis of ``scale`` (None: broadcast), validated against the contract."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scaled_mm: {name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise TypeError(f"scaled_mm: {name} must be float32, got {scale.dtype}")
    if scale.device != device:
        raise ValueError(f"scaled_mm: {name} is on {scale.device}, a is on {device}")
    if scale.dim() != 2:
        raise ValueError(f"scaled_mm: {name} must be 2-D, got shape {tuple(scale.shape)}")
    out = []
    for axis, (count, size, groups) in enumerate(zip(scale.shape, shape, allowed)):
        if count == 1:
            out.append(None)
            continue
        group = next((g for g in groups if count == -(-size // g)), None)
        if group is None:
            want = " or ".join(str(-(-size // g)) for g in groups)
            raise ValueError(f"scaled_mm: {name} has {count} entries along axis {axis}; with a [M, K] and b [K, N] "
                             f"of shapes giving {tuple(shape)} there it takes 1 or {want}")
        out.append(group)
    return out[0], out[1]


def _check_operand(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"scaled_mm: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FORMATS:
        raise TypeError(f"scaled_mm: {name} has dtype {t.dtype}; supported: float8_e4m3fn, float8_e5m2, int8")
    if t.dim() != 2:
        raise ValueError(f"scaled_mm: {name} must be 2-D, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"scaled_mm: {name} is empty (shape {tuple(t.shape)})")


def scaled_mm(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
              bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``(a * a_scale) @ (b * b_scale) + bias`` in ``out_dtype`` (see the module docstring)."""
    _check_operand("a", a)
    _check_operand("b", b)
    if b.dtype != a.dtype:
        raise TypeError(f"scaled_mm: b has dtype {b.dtype}, a has {a.dtype}: both must be one format")
    if b.device != a.device:
        raise ValueError(f"scaled_mm: b is on {b.device}, a is on {a.device}")
    if a.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"scaled_mm: a is on {a.device}: needs a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors")
    (m, k), (kb, n) = a.shape, b.shape
    if kb != k:
        raise ValueError(f"scaled_mm: b has {kb} rows, a has {k} columns (K): a [M, K] @ b [K, N]")
    if not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"scaled_mm: out_dtype must be a torch.dtype, got {type(out_dtype).__name__}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"scaled_mm: out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    a_groups = _scale_axes("a_scale", a_scale, (m, k), ((1,), (SCALE_BLOCK,)), a.device)
    b_groups = _scale_axes("b_scale", b_scale, (k, n), ((SCALE_BLOCK,), (1, SCALE_BLOCK)), a.device)
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"scaled_mm: bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.dtype != out_dtype:
            raise TypeError(f"scaled_mm: bias has dtype {bias.dtype}; it must be in out_dtype, {out_dtype}")
        if bias.device != a.device:
            raise ValueError(f"scaled_mm: bias is on {bias.device}, a is on {a.device}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"scaled_mm: bias must have shape ({n},) for b [K, {n}], got {tuple(bias.shape)}")
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    block_m, block_n, block_k, warps = _blocks(a.device)

    def stride(t: torch.Tensor, axis: int) -> int:
        return t.stride(axis) if t.shape[axis] > 1 else 0  # a broadcast axis: every index reads entry 0

    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _scaled_mm_kernel[grid](
        a, b, a_scale, b_scale, bias if bias is not None else c, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        stride(a_scale, 0), stride(a_scale, 1), stride(b_scale, 0), stride(b_scale, 1),
        bias.stride(0) if bias is not None else 0,
        SCALE_IN_LOOP=a_groups[1] is not None or b_groups[0] is not None,
        B_N_GROUP=b_groups[1] or 1, HAS_BIAS=bias is not None, IS_INT=a.dtype == torch.int8,
        IMPRECISE=IMPRECISE_EVERY, UPCAST=_interpreting() and a.dtype == torch.float8_e5m2, SCALE_BLOCK=SCALE_BLOCK,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )
    return c


scaled_mm.dtypes = FORMATS
scaled_mm.supports_backward = False
scaled_mm.fp8_accumulation = {"fraction_bits": 13, "promote_every": IMPRECISE_EVERY}
scaled_mm.e5m2_dot_upcast = True
