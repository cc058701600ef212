"""Per-block fp8 (e4m3fn) quantisation of rows, and its inverse, in Triton.

``quantize_fp8(x)`` with ``x [M, K]`` (float32, float16 or bfloat16, any strides, any K)
cuts each row into blocks of ``QBLOCK = 128`` columns (the last one partial when K is not
a multiple of 128) and returns ``q [M, K]`` in float8_e4m3fn and ``scale [M, cdiv(K, 128)]``
in float32, for row ``m`` and block ``b`` (all in fp32, every division correctly rounded)::

    amax  = max_k |x[m, k]|                    over the block's columns
    scale = max(amax / 448, 2**-126)            448: e4m3's largest finite value
    q     = round_to_nearest_even(x / scale)    onto e4m3's grid, |x / scale| <= 448

The floor 2**-126 (fp32's smallest normal) keeps an all-zero block's scale positive (its
q is 0, not 0 / 0 = NaN) and every scale normal (no subnormal scale for a GPU to flush).

``dequantize_fp8(q, scale)`` returns ``x [M, K]`` in float32, ``x[m, k] = q[m, k] *
scale[m, k // 128]``: exact products of a 4-bit and a 24-bit significand, rounded once.
``scale`` may have more columns than ``cdiv(K, 128)``; the others are not read.

Three details make the kernels agree with the reference bit for bit on both backends:

* divisions are ``tl.math.div_rn``: Triton's ``/`` on fp32 compiles to an approximate
  division on NVIDIA GPUs (``div.full.f32`` / ``div.approx.f32``, up to 2 ulp), and a
  scale one ulp off is a wrong scale and, near a rounding boundary, a wrong q;
* rounding to e4m3 is done in fp32 by ``_round_to_e4m3`` before the cast, which then
  only converts exact values: the Triton 3.9 interpreter's fp32 -> fp8e4nv cast does not
  round to nearest even (ties go away from zero, a carry out of the mantissa can halve
  the value: 7.94 -> 4.0, and subnormal results are truncated), while the GPU's
  ``cvt.rn.satfinite`` does; on the GPU the explicit rounding changes nothing;
* bfloat16 is widened to fp32 by its bits (``_load_fp32``): the interpreter's bf16 -> fp32
  conversion garbles subnormals (1e-39 reads as 4.4e-39), which shifts an all-tiny
  block's scale.

Tiles: quantise, one program per ``[128, 128]`` tile (128 rows, one block); dequantise,
one program per 32 rows, walking the row's blocks and loading the next block's scales
while it writes the current one. Offsets are int64: ``m * stride`` passes 2**31 once x does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["quantize_fp8", "dequantize_fp8"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QBLOCK = 128  # columns sharing one scale
QUANT_ROWS = 128  # rows of a quantise tile
DEQUANT_ROWS = 32  # rows of a dequantise program
E4M3_MAX = 448.0
SCALE_FLOOR = 2.0**-126  # fp32's smallest normal


@triton.jit
def _load_fp32(ptrs, mask):
    """Load and widen to fp32; bf16 by its bits (exact, subnormals included)."""
    v = tl.load(ptrs, mask=mask, other=0.0)
    if v.dtype == tl.bfloat16:
        bits = v.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        return (bits << 16).to(tl.float32, bitcast=True)
    return v.to(tl.float32)


@triton.jit
def _round_to_e4m3(v):
    """v (fp32, |v| <= 448) rounded to nearest even onto e4m3fn's grid, as float8e4nv."""
    # normal range (|v| >= 2**-6): keep 3 of fp32's 23 mantissa bits; adding 2**19 - 1 plus
    # the lowest kept bit before clearing the 20 dropped ones rounds to nearest, ties to even
    # (a carry out of the mantissa moves the exponent, as it should)
    bits = v.to(tl.int32, bitcast=True)
    bits = bits + 0x7FFFF + ((bits >> 20) & 1)
    normal = (bits & -1048576).to(tl.float32, bitcast=True)
    # subnormal range: multiples of 2**-9; |v| + 2**14 has an ulp of 2**-9, so the fp32 add
    # rounds |v| to nearest even there; the sign goes back by its bit (-0.0 stays -0.0)
    sign = v.to(tl.int32, bitcast=True) & -2147483648
    small = (((tl.abs(v) + 16384.0) - 16384.0).to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(v) < 0.015625, small, normal).to(tl.float8e4nv)


@triton.jit(do_not_specialize=("M", "K", "stride_xm", "stride_xk", "stride_qm", "stride_qk", "stride_sm",
                               "stride_sk"),
            do_not_specialize_on_alignment=("X", "Q", "S"))
def _quantize_kernel(
    X,  # *[M, K] input, strides (stride_xm, stride_xk)
    Q,  # *float8e4nv [M, K] output, strides (stride_qm, stride_qk)
    S,  # *fp32 [M, cdiv(K, QBLOCK)] scales, strides (stride_sm, stride_sk)
    M, K,
    stride_xm, stride_xk, stride_qm, stride_qk, stride_sm, stride_sk,
    BLOCK_M: tl.constexpr, QBLOCK: tl.constexpr, E4M3_MAX: tl.constexpr, SCALE_FLOOR: tl.constexpr,
):
    pid_m = tl.program_id(0)
    block = tl.program_id(1)
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = block.to(tl.int64) * QBLOCK + tl.arange(0, QBLOCK)
    row_ok = offs_m < M
    mask = row_ok[:, None] & (offs_k < K)[None, :]
    # lanes past K (the partial last block) load 0: they do not move the block's amax
    x = _load_fp32(X + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk, mask)

    amax = tl.max(tl.abs(x), axis=1)  # one per row of the block
    scale = tl.maximum(tl.math.div_rn(amax, E4M3_MAX), SCALE_FLOOR)
    q = _round_to_e4m3(tl.math.div_rn(x, scale[:, None]))

    tl.store(Q + offs_m[:, None] * stride_qm + offs_k[None, :] * stride_qk, q, mask=mask)
    tl.store(S + offs_m * stride_sm + block * stride_sk, scale, mask=row_ok)


@triton.jit(do_not_specialize=("M", "K", "stride_qm", "stride_qk", "stride_sm", "stride_sk", "stride_xm",
                               "stride_xk"),
            do_not_specialize_on_alignment=("Q", "S", "X"))
def _dequantize_kernel(
    Q,  # *float8e4nv [M, K] input, strides (stride_qm, stride_qk)
    S,  # *fp32 [M, >= cdiv(K, QBLOCK)] scales, strides (stride_sm, stride_sk)
    X,  # *fp32 [M, K] output, strides (stride_xm, stride_xk)
    M, K,
    stride_qm, stride_qk, stride_sm, stride_sk, stride_xm, stride_xk,
    BLOCK_M: tl.constexpr, QBLOCK: tl.constexpr,
):
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < M
    offs_k = tl.arange(0, QBLOCK).to(tl.int64)
    s_rows = S + offs_m * stride_sm
    last = tl.cdiv(K, QBLOCK) - 1  # the last block, partial when K % QBLOCK != 0
    # x[:, block] = q[:, block] * scale[:, block]; the next block's scales load while this one is written
    s = tl.load(s_rows, mask=row_ok, other=1.0)
    for block in range(0, tl.cdiv(K, QBLOCK)):
        cols = block * QBLOCK + offs_k
        mask = row_ok[:, None] & (cols < K)[None, :]
        q = tl.load(Q + offs_m[:, None] * stride_qm + cols[None, :] * stride_qk, mask=mask, other=0.0)
        tl.store(X + offs_m[:, None] * stride_xm + cols[None, :] * stride_xk, q.to(tl.float32) * s[:, None],
                 mask=mask)
        s = tl.load(s_rows + tl.minimum(block + 1, last).to(tl.int64) * stride_sk, mask=row_ok, other=1.0)


def _checked_2d(name: str, t, dtypes) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(d)[6:] for d in dtypes)}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [M, K], got shape {list(t.shape)}")


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) of x [M, K] per block of 128 columns (module docstring)."""
    _checked_2d("quantize_fp8: x", x, DTYPES)
    M, K = x.shape
    q = torch.empty((M, K), device=x.device, dtype=torch.float8_e4m3fn)
    scale = torch.empty((M, triton.cdiv(K, QBLOCK)), device=x.device, dtype=torch.float32)
    if M == 0 or K == 0:
        return q, scale
    _quantize_kernel[(triton.cdiv(M, QUANT_ROWS), triton.cdiv(K, QBLOCK))](
        x, q, scale, M, K, x.stride(0), x.stride(1), q.stride(0), q.stride(1), scale.stride(0), scale.stride(1),
        BLOCK_M=QUANT_ROWS, QBLOCK=QBLOCK, E4M3_MAX=E4M3_MAX, SCALE_FLOOR=SCALE_FLOOR, num_warps=8)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] in float32 from q [M, K] (float8_e4m3fn) and scale [M, >= cdiv(K, 128)] (module docstring)."""
    _checked_2d("dequantize_fp8: q", q, (torch.float8_e4m3fn,))
    _checked_2d("dequantize_fp8: scale", scale, (torch.float32,))
    M, K = q.shape
    if scale.shape[0] != M or scale.shape[1] < triton.cdiv(K, QBLOCK):
        raise ValueError(f"dequantize_fp8: scale is {list(scale.shape)}; q {list(q.shape)} needs "
                         f"[{M}, >= {triton.cdiv(K, QBLOCK)}] (one scale per block of {QBLOCK} columns)")
    if q.device != scale.device:
        raise ValueError(f"dequantize_fp8: q is on {q.device} and scale on {scale.device}")
    x = torch.empty((M, K), device=q.device, dtype=torch.float32)
    if M == 0 or K == 0:
        return x
    _dequantize_kernel[(triton.cdiv(M, DEQUANT_ROWS),)](
        q, scale, x, M, K, q.stride(0), q.stride(1), scale.stride(0), scale.stride(1), x.stride(0), x.stride(1),
        BLOCK_M=DEQUANT_ROWS, QBLOCK=QBLOCK)
    return x


quantize_fp8.dtypes = DTYPES
dequantize_fp8.dtypes = (torch.float32,)  # the op's case dtype: its output's
