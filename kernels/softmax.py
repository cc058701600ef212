"""Row softmax with temperature, forward and backward, in Triton.

    y[r, j] = exp(x[r, j] / T - m_r) / s_r,   m_r = max_j x[r, j] / T,
                                              s_r = sum_j exp(x[r, j] / T - m_r)

One program owns one row. A row that fits in one block is loaded once (registers
hold it); a longer row takes two passes over column blocks: an *online* pass that
keeps, per lane, a running max ``m`` and a sum ``s`` rescaled whenever ``m`` grows
(``s <- s * exp(m_old - m_new) + exp(z - m_new)``), then a pass that writes
``exp(z - M) / S``. Masked lanes load ``-inf``, the identity of ``max``, and so
contribute ``exp(-inf) = 0``, the identity of the sum.

Backward: dx = y * (dy - sum_j dy_j y_j), the same row structure.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.specialisation import unspecialised_jit

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _max_block() -> int:
    # Under the interpreter a smaller block keeps each program cheap and makes
    # modest rows (> 1024) take the multi-block path that long rows take on GPU.
    return 1024 if os.environ.get("TRITON_INTERPRET") == "1" else 8192


@unspecialised_jit
def _softmax_fwd_kernel(
    X,  # input, [rows, N] viewed through (stride_xr, stride_xc)
    Y,  # output, [rows, N] contiguous, same dtype as X
    stride_xr,  # elements between rows of X
    stride_xc,  # elements between columns of X
    N,  # row length
    temperature,  # T > 0; z = x / T is an IEEE division, so it rounds as the contract's formula
    BLOCK: tl.constexpr,
    SINGLE_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_xr
    y_row = Y + row * N
    cols = tl.arange(0, BLOCK)
    if SINGLE_BLOCK:
        mask = cols < N
        x = tl.load(x_row + cols * stride_xc, mask=mask, other=float("-inf")).to(tl.float32)
        z = tl.div_rn(x, temperature)
        m = tl.max(z, axis=0)
        e = tl.exp(z - m)
        s = tl.sum(e, axis=0)
        tl.store(y_row + cols, (e / s).to(Y.dtype.element_ty), mask=mask)
    else:
        # Online pass: per-lane running max and rescaled sum.
        m_lane = tl.full([BLOCK], float("-inf"), tl.float32)
        s_lane = tl.zeros([BLOCK], tl.float32)
        for start in range(0, N, BLOCK):
            offs = start + cols
            x = tl.load(x_row + offs * stride_xc, mask=offs < N, other=float("-inf")).to(tl.float32)
            z = tl.div_rn(x, temperature)
            m_new = tl.maximum(m_lane, z)
            # A lane that has seen only -inf keeps s = 0; exp(-inf - -inf) would be NaN.
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_lane = s_lane * tl.exp(m_lane - m_ref) + tl.exp(z - m_ref)
            m_lane = m_new
        m = tl.max(m_lane, axis=0)
        m_ref = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(s_lane * tl.exp(m_lane - m_ref), axis=0)
        # An all -inf row leaves m = -inf and s = 0: z - m is NaN, as torch.softmax gives.
        for start in range(0, N, BLOCK):
            offs = start + cols
            mask = offs < N
            # z must be bitwise the z of the first pass: near fp32's max one ulp is ~1e31, and
            # exp(z - m) of an argmax that came out one ulp larger is inf. `/` lowers to an
            # approximate division on NVIDIA that LLVM may compile differently in each loop;
            # div_rn is IEEE round-to-nearest everywhere (and is the contract's x / T).
            x = tl.load(x_row + offs * stride_xc, mask=mask, other=float("-inf")).to(tl.float32)
            z = tl.div_rn(x, temperature)
            tl.store(y_row + offs, (tl.exp(z - m) / s).to(Y.dtype.element_ty), mask=mask)


@unspecialised_jit
def _softmax_bwd_kernel(
    Y,  # forward output, [rows, N] contiguous
    DY,  # upstream gradient, [rows, N] viewed through (stride_dr, stride_dc)
    DX,  # gradient of x, [rows, N] contiguous
    stride_dr,
    stride_dc,
    N,
    temperature,
    BLOCK: tl.constexpr,
):
    # dx = y * (dy - <dy, y>) / T: the Jacobian of softmax is diag(y) - y y^T.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    dot = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        offs = start + cols
        mask = offs < N
        y = tl.load(Y + row * N + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dr + offs * stride_dc, mask=mask, other=0.0).to(tl.float32)
        dot += y * dy
    total = tl.sum(dot, axis=0)
    for start in range(0, N, BLOCK):
        offs = start + cols
        mask = offs < N
        y = tl.load(Y + row * N + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dr + offs * stride_dc, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * N + offs, (y * (dy - total) / temperature).to(DX.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    # A view when the leading dims collapse to one stride (contiguous, transposed
    # 2-D, sliced rows); otherwise reshape copies, which the contract allows.
    return t.reshape(-1, t.shape[-1])


def _launch_fwd(x2: torch.Tensor, temperature: float) -> torch.Tensor:
    rows, n = x2.shape
    y = torch.empty((rows, n), dtype=x2.dtype, device=x2.device)
    block = min(triton.next_power_of_2(n), _max_block())
    _softmax_fwd_kernel[(rows,)](
        x2, y, x2.stride(0), x2.stride(1), n, temperature,
        BLOCK=block, SINGLE_BLOCK=n <= block, num_warps=4 if block <= 2048 else 8,
    )
    return y


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, temperature):
        y2 = _launch_fwd(_rows(x), temperature)
        ctx.save_for_backward(y2)
        ctx.temperature = temperature
        ctx.shape = x.shape
        return y2.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        (y2,) = ctx.saved_tensors
        rows, n = y2.shape
        dy2 = _rows(dy)
        dx = torch.empty_like(y2)
        block = min(triton.next_power_of_2(n), _max_block())
        _softmax_bwd_kernel[(rows,)](
            y2, dy2, dx, dy2.stride(0), dy2.stride(1), n, ctx.temperature, BLOCK=block,
        )
        return dx.view(ctx.shape), None


def softmax(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Softmax of ``x / temperature`` over the last dim (see the module docstring)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"softmax: x has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if x.dim() == 0:
        raise ValueError("softmax: x must have at least one dim, got a 0-d tensor")
    if x.numel() == 0:
        raise ValueError(f"softmax: x is empty (shape {tuple(x.shape)})")
    if x.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"softmax: x is on {x.device}: needs a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors")
    if isinstance(temperature, torch.Tensor) or not isinstance(temperature, (int, float)):
        raise TypeError(f"softmax: temperature must be a Python float, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"softmax: temperature must be finite and > 0, got {temperature}")
    return _Softmax.apply(x, float(temperature))


softmax.dtypes = DTYPES
softmax.supports_backward = True
