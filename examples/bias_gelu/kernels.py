"""A fused bias + GELU epilogue in Triton: ``y = gelu(x + bias)``, the bias broadcast over rows.

``bias_gelu(x, bias, approximate="none")`` with ``x [M, N]`` and ``bias [N]`` or None (no
bias: ``y = gelu(x)``; float32, float16 or bfloat16, one dtype, any strides) returns
``y [M, N]`` in that dtype, computed in fp32 and rounded once::

    z = x[m, n] + bias[n]
    approximate == "none":  y = z Phi(z)       = 0.5 z (1 + erf(z / sqrt(2)))
    approximate == "tanh":  y = z sigmoid(2 u) = 0.5 z (1 + tanh(u)),  u = sqrt(2 / pi) (z + 0.044715 z^3)

The tanh form is evaluated as ``z / (1 + exp(-2 u))``: ``1 + tanh(u)`` would cancel to 0
for very negative z (where the true value is ``2 exp(2 u)``), and the quotient saturates
to ``z`` or ``-0`` without NaN when ``u`` or ``exp`` overflow.

This is the epilogue alone, as it follows a GEMM whose output was already written (or as
the body of a GEMM's epilogue, where ``x`` is the fp32 accumulator tile): checked alone,
its allowance is the activation's own rounding, not a K-long sum's, so an erf/tanh
mix-up (at most 4.7e-4 absolute, at |z| = 2.7, but 10 % relative at z = -3 and 45 % at
z = -4) cannot hide under a product's error.

Tiles: one program per square ``[BLOCK, BLOCK]`` tile of ``y``; rows past M and columns
past N are masked. Row offsets are int64 (``m * stride`` passes 2**31 once x does).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["bias_gelu"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
APPROXIMATIONS = ("none", "tanh")
BLOCK = 32
SQRT1_2 = 0.7071067811865476  # 1 / sqrt(2)
SQRT_2_OVER_PI = 0.7978845608028654


@triton.jit(do_not_specialize=("M", "N", "stride_xm", "stride_xn", "stride_b", "stride_ym", "stride_yn"),
            do_not_specialize_on_alignment=("X", "BIAS", "Y"))
def _bias_gelu_kernel(
    X,  # *[M, N] input, strides (stride_xm, stride_xn)
    BIAS,  # *[N] bias, stride stride_b (not read without HAS_BIAS)
    Y,  # *[M, N] output, strides (stride_ym, stride_yn)
    M, N,
    stride_xm, stride_xn, stride_b, stride_ym, stride_yn,
    HAS_BIAS: tl.constexpr,  # a bias was passed (None: y = gelu(x))
    TANH: tl.constexpr,  # the tanh approximation instead of erf
    BLOCK: tl.constexpr, SQRT1_2: tl.constexpr, SQRT_2_OVER_PI: tl.constexpr,
):
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    x = tl.load(X + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(BIAS + offs_n * stride_b, mask=offs_n < N, other=0.0).to(tl.float32)
        z = x + bias[None, :]
    else:
        z = x
    if TANH:
        u = SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)
        y = z / (1.0 + tl.exp(-2.0 * u))
    else:
        y = 0.5 * z * (1.0 + tl.math.erf(z * SQRT1_2))
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, y.to(Y.dtype.element_ty), mask=mask)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias), or gelu(x) without a bias (module docstring)."""
    for name, t in (("x", x), ("bias", x if bias is None else bias)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"bias_gelu: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"bias_gelu: {name} has dtype {t.dtype}; supported: float32, float16, bfloat16")
    if x.dim() != 2:
        raise ValueError(f"bias_gelu: x must be [M, N], got {list(x.shape)}")
    if bias is not None:
        if x.dtype != bias.dtype:
            raise TypeError(f"bias_gelu: x and bias must have one dtype, got {x.dtype} and {bias.dtype}")
        if bias.dim() != 1 or bias.shape[0] != x.shape[1]:
            raise ValueError(f"bias_gelu: bias must be [N] = [{x.shape[1]}], got {list(bias.shape)}")
        if x.device != bias.device:
            raise ValueError(f"bias_gelu: x is on {x.device} and bias on {bias.device}")
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"bias_gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    M, N = x.shape
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if M == 0 or N == 0:
        return y
    grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))
    has_bias = bias is not None
    _bias_gelu_kernel[grid](
        x, bias if has_bias else x, y, M, N, x.stride(0), x.stride(1), bias.stride(0) if has_bias else 0,
        y.stride(0), y.stride(1),
        HAS_BIAS=has_bias, TANH=approximate == "tanh", BLOCK=BLOCK, SQRT1_2=SQRT1_2, SQRT_2_OVER_PI=SQRT_2_OVER_PI)
    return y


bias_gelu.dtypes = DTYPES
bias_gelu.supports_backward = False  # an inference epilogue: forward only
