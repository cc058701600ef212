"""RMSNorm and residual add + RMSNorm in Triton.

``rms_norm(x, weight, eps)`` normalises over the last dim of ``x [..., N]``::

    ms   = sum_j x_j^2 / N
    rstd = 1 / sqrt(ms + eps)
    y    = x * rstd * weight

``add_rms_norm(x, residual, weight, eps)`` returns ``(y, h)`` with ``h = x + residual``
rounded to the input dtype (what a transformer carries to its next residual add) and
``y = rms_norm(h)``: the normalisation reads the rounded ``h``, as the unfused
``h = x + residual; y = rms_norm(h)`` does.

Casting: everything after the loads runs in fp32 and ``y`` is rounded to the input dtype
once, from ``x * rstd * weight`` (``rms_norm_cast = "after_weight"``; Llama/HF instead
round ``x * rstd`` to the input dtype before the weight, ``"before_weight"``).

Masked lanes (the padding of the last column block) load 0, which is the identity of
the sum of squares, so no lane needs re-masking (unlike layer norm's ``x - mean``).

Rounding of ``h`` to bfloat16: :func:`_round_to_bf16` rounds to nearest even by integer
arithmetic. ``.to(tl.bfloat16)`` does the same on a GPU, but the Triton interpreter
truncates fp32 -> bf16 conversions (``tritoncheck/tolerance.py``), and ``h`` is promised
to be exactly ``x + residual`` as PyTorch rounds it. fp16 conversions round to nearest on
both backends. An fp16 or bf16 sum formed in fp32 and rounded once is correctly rounded
(fp32's 24 bits are at least twice the 11 or 8 bits plus 2, so the double rounding is
innocuous).

Backward, with ``g = weight * dy``, ``x_hat = x * rstd`` and ``c1 = mean_j(g_j x_hat_j)``::

    dx      = rstd * (g - x_hat * c1)       (+ dh for add_rms_norm, for x and residual)
    dweight = sum over rows of dy * x_hat

``dweight`` is reduced deterministically as layer norm's is (``kernels/norms.py``): the rows
are split into ``G`` groups, one program per group adds its rows into its own row of an
fp32 ``[G, N]`` partial buffer, and a second kernel sums the ``G`` partials in the fixed
order ``g = 0 .. G-1``. No atomics.

Batch invariance: the forward runs one program per row, with a block size that depends
on ``N`` and the device only, so a row's ``y`` (and ``h``) is bitwise the same whatever
other rows are in the call (declared ``batch_invariant = True``).

Rows longer than one block loop over column blocks of ``BLOCK_N`` columns, capped at
``MAX_BLOCK_N_CUDA`` (4096) on a GPU and ``MAX_BLOCK_N_INTERPRET`` (64) under the
interpreter, layer norm's caps (``kernels/norms.py``; tests may lower either, read at call time). Layouts: ``x [..., N]`` is
viewed as ``[M, N]`` (a copy only when the leading dims do not merge) and its strides
are passed to the kernels, as are the weight's.
"""
from __future__ import annotations

import math
import numbers

import torch
import triton
import triton.language as tl

# The launch sizing (column blocks, backward row groups) and the tensor checks are layer
# norm's: one row-wise normalisation per program, the same caps on each backend.
from tritoncheck.kernels.norms import (
    DTYPES,
    _check_tensor,
    _interpreting,
    _rows,
    block_n_for,
    groups_for,
    num_warps_for,
)
from tritoncheck.kernels.specialisation import unspecialised_jit

__all__ = ["rms_norm", "add_rms_norm"]

# --------------------------------------------------------------------------- kernels


@triton.jit
def _round_to_bf16(v):
    # fp32 -> bf16 rounded to nearest, ties to even: add 0x7FFF plus the kept lowest
    # bit, drop the low 16 bits. Finite inputs only (the op's domain).
    bits = v.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _residual_sum(x, r, DTYPE: tl.constexpr):
    # h = x + residual in fp32, rounded once to the input dtype (module docstring)
    s = x.to(tl.float32) + r.to(tl.float32)
    if DTYPE == tl.bfloat16:
        return _round_to_bf16(s)
    return s.to(DTYPE)


@unspecialised_jit
def _rms_norm_fwd_kernel(
    X,  # *T [M, N] input, strides (stride_xm, stride_xn)
    R,  # *T [M, N] residual (add_rms_norm only), strides (stride_rm, stride_rn)
    W,  # *T [N] weight, stride stride_w
    Y,  # *T [M, N] output, contiguous
    H,  # *T [M, N] x + residual (add_rms_norm only), contiguous
    RSTD,  # *fp32 [M] 1 / sqrt(ms + eps), saved for backward
    stride_xm, stride_xn, stride_rm, stride_rn, stride_w,
    N,
    eps,
    BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_xm
    r_row = R + row * stride_rm
    offs = tl.arange(0, BLOCK_N)

    # Pass 1: sum of squares (masked lanes load 0, the identity of the sum); h is stored here.
    sq_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + offs
        mask = cols < N
        h = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(r_row + cols * stride_rn, mask=mask, other=0.0)
            h = _residual_sum(h, r, X.dtype.element_ty)
            tl.store(H + row * N + cols, h, mask=mask)
        h = h.to(tl.float32)
        sq_acc += h * h
    ms = tl.sum(sq_acc, axis=0) / N
    rstd = 1.0 / tl.sqrt(ms + eps)
    tl.store(RSTD + row, rstd)

    # Pass 2: normalise and scale in fp32, round once. h is formed again from x and
    # residual (not read back from H: another thread of this program may have stored it).
    for start in range(0, N, BLOCK_N):
        cols = start + offs
        mask = cols < N
        h = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(r_row + cols * stride_rn, mask=mask, other=0.0)
            h = _residual_sum(h, r, X.dtype.element_ty)
        h = h.to(tl.float32)
        w = tl.load(W + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
        y = h * rstd * w
        tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)


@unspecialised_jit
def _rms_norm_bwd_dx_kernel(
    DY,  # *T [M, N] upstream gradient of y, strides (stride_dym, stride_dyn)
    DH,  # *T [M, N] upstream gradient of h (add_rms_norm only), strides (stride_dhm, stride_dhn)
    X,  # *T [M, N] the normalised input (x, or h for add_rms_norm), strides (stride_xm, stride_xn)
    W,  # *T [N] weight, stride stride_w
    RSTD,  # *fp32 [M] saved rstd
    DX,  # *T [M, N] gradient of x, contiguous
    DW_PART,  # *fp32 [G, N] partial sums of dy * x_hat, one row per group (zeroed)
    stride_dym, stride_dyn, stride_dhm, stride_dhn, stride_xm, stride_xn, stride_w,
    M, N,
    ROWS_PER_GROUP,  # group g owns rows [g R, (g + 1) R)
    BLOCK_N: tl.constexpr,
    HAS_DH: tl.constexpr,
):
    group = tl.program_id(0).to(tl.int64)
    row_start = group * ROWS_PER_GROUP
    row_end = tl.minimum(row_start + ROWS_PER_GROUP, M)
    dw_row = DW_PART + group * N
    offs = tl.arange(0, BLOCK_N)
    for row in range(row_start, row_end):
        rstd = tl.load(RSTD + row)
        x_row = X + row * stride_xm
        dy_row = DY + row * stride_dym
        dx_row = DX + row * N

        # Pass A: c1 = mean(w dy x_hat); masked lanes hold x = 0, so x_hat = 0 there.
        c1_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            mask = cols < N
            x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
            c1_acc += w * dy * (x * rstd)
        c1 = tl.sum(c1_acc, axis=0) / N

        # Pass B: dx, and this row's share of the group's dweight partial (this program
        # alone touches dw_row: no race, no atomics).
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            mask = cols < N
            x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
            xhat = x * rstd
            dx = (w * dy - xhat * c1) * rstd
            if HAS_DH:
                dx += tl.load(DH + row * stride_dhm + cols * stride_dhn, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_row + cols, dx.to(DX.dtype.element_ty), mask=mask)
            dw_part = tl.load(dw_row + cols, mask=mask, other=0.0)
            tl.store(dw_row + cols, dw_part + dy * xhat, mask=mask)


@unspecialised_jit
def _rms_norm_bwd_dw_kernel(
    DW_PART,  # *fp32 [G, N] partial sums of dy * x_hat
    DW,  # *T [N] gradient of weight, contiguous
    G, N,
    BLOCK_N: tl.constexpr,
):
    # One program per column block; the G partials are added in the fixed order 0 .. G-1.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for g in range(0, G):
        dw += tl.load(DW_PART + g * N + cols, mask=mask, other=0.0)
    tl.store(DW + cols, dw.to(DW.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- validation


_NO_RESIDUAL = object()  # rms_norm's calls: add_rms_norm's residual is a tensor, never None


def _check_inputs(x, weight, eps, residual=_NO_RESIDUAL) -> int:
    """Refuse bad input naming the argument; returns N."""
    with_residual = residual is not _NO_RESIDUAL
    named = [("x", x)] + ([("residual", residual)] if with_residual else []) + [("weight", weight)]
    for name, t in named:
        _check_tensor(name, t)
    for name, t in named[1:]:
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has dtype {x.dtype}; they must match")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; all tensors must be on one device")
    if x.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"x is on {x.device}: needs a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors")
    if x.dim() < 1:
        raise ValueError(f"x must have at least one dim [..., N], got shape {tuple(x.shape)}")
    n = x.shape[-1]
    if n == 0:
        raise ValueError(f"x has an empty last dim (shape {tuple(x.shape)}): RMSNorm over 0 elements is undefined")
    if with_residual and residual.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)} but x has shape {tuple(x.shape)}; "
                         "they must match")
    if tuple(weight.shape) != (n,):
        raise ValueError(f"weight must have shape ({n},) (x's last dim), got {tuple(weight.shape)}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be finite and > 0, got {eps}")
    return n


# --------------------------------------------------------------------------- launches


def _forward(x2: torch.Tensor, r2: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(y, h or None, rstd) of the ``[M, N]`` rows."""
    m, n = x2.shape
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    h = torch.empty((m, n), dtype=x2.dtype, device=x2.device) if r2 is not None else None
    rstd = torch.empty((m,), dtype=torch.float32, device=x2.device)
    if m > 0:
        block_n = block_n_for(n, x2.device)
        r = r2 if r2 is not None else x2  # unread without a residual
        _rms_norm_fwd_kernel[(m,)](
            x2, r, weight, y, h if h is not None else y, rstd,
            x2.stride(0), x2.stride(1), r.stride(0), r.stride(1), weight.stride(0),
            n, float(eps),
            BLOCK_N=block_n, HAS_RESIDUAL=r2 is not None, num_warps=num_warps_for(block_n),
        )
    return y, h, rstd


def _backward(dy: torch.Tensor, dh: torch.Tensor | None, x2: torch.Tensor, weight: torch.Tensor,
              rstd: torch.Tensor):
    """(dx, dweight) of the ``[M, N]`` rows; ``dh`` is added to dx (add_rms_norm)."""
    m, n = x2.shape
    dx = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    dw = torch.zeros((n,), dtype=weight.dtype, device=x2.device)
    if m > 0:
        dy2 = _rows(dy, n)
        dh2 = _rows(dh, n) if dh is not None else dy2  # unread without dh
        block_n = block_n_for(n, x2.device)
        num_groups, rows_per_group = groups_for(m, x2.device)
        dw_part = torch.zeros((num_groups, n), dtype=torch.float32, device=x2.device)
        _rms_norm_bwd_dx_kernel[(num_groups,)](
            dy2, dh2, x2, weight, rstd, dx, dw_part,
            dy2.stride(0), dy2.stride(1), dh2.stride(0), dh2.stride(1), x2.stride(0), x2.stride(1),
            weight.stride(0),
            m, n, rows_per_group,
            BLOCK_N=block_n, HAS_DH=dh is not None, num_warps=num_warps_for(block_n),
        )
        _rms_norm_bwd_dw_kernel[(triton.cdiv(n, block_n),)](dw_part, dw, num_groups, n, BLOCK_N=block_n)
    return dx, dw


class _RmsNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        n = x.shape[-1]
        x2 = _rows(x, n)
        y, _, rstd = _forward(x2, None, weight, eps)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(dy, None, x2, weight, rstd)
        needs = ctx.needs_input_grad
        return (dx.view(ctx.x_shape) if needs[0] else None, dw if needs[1] else None, None)


class _AddRmsNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        n = x.shape[-1]
        y, h, rstd = _forward(_rows(x, n), _rows(residual, n), weight, eps)
        ctx.save_for_backward(h, weight, rstd)  # the backward normalises h, as the forward did
        ctx.x_shape = x.shape
        return y.view(x.shape), h.view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, dh):
        h2, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(dy, dh, h2, weight, rstd)
        dx = dx.view(ctx.x_shape)
        needs = ctx.needs_input_grad
        # x and residual get the same gradient, as two tensors (one may be modified in place)
        return (dx if needs[0] else None, dx.clone() if needs[1] else None, dw if needs[2] else None, None)


def rms_norm(x, weight, eps=1e-6):
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the last dim of ``x``.

    Differentiable in ``x`` and ``weight`` (Triton backward). See the module docstring.
    """
    _check_inputs(x, weight, eps)
    return _RmsNormFn.apply(x, weight, eps)


def add_rms_norm(x, residual, weight, eps=1e-6):
    """``h = x + residual`` (in the input dtype), ``y = rms_norm(h, weight, eps)``; returns ``(y, h)``.

    Differentiable in ``x``, ``residual`` and ``weight``, through ``y`` and ``h``.
    """
    _check_inputs(x, weight, eps, residual=residual)
    return _AddRmsNormFn.apply(x, residual, weight, eps)


for _fn in (rms_norm, add_rms_norm):
    _fn.dtypes = DTYPES
    _fn.supports_backward = True
    _fn.rms_norm_cast = "after_weight"
    _fn.batch_invariant = True
