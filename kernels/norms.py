"""Layer norm and fused dropout + residual + layer norm in Triton.

``layer_norm(x, weight, bias, eps)`` normalises over the last dim of ``x [..., N]``::

    mean = sum_j x_j / N
    var  = sum_j (x_j - mean)^2 / N              (biased; two passes, see below)
    rstd = 1 / sqrt(var + eps)
    x_hat = (x - mean) * rstd
    y    = x_hat * weight + bias

Statistics are accumulated in fp32 whatever the input dtype. The variance is computed
in two passes over the row (mean first, then the mean of squared deviations), never as
``E[x^2] - E[x]^2``, which loses every significant digit when ``|mean| >> std`` (mean
1e4, std 1 in fp32: ``x^2 ~ 1e8`` has an ulp of 8). The second pass also sums the
deviations, ``dev = sum(x - mean) / N``, which is minus the rounding error of the fp32
mean; it refines the mean (``mean += dev``) and the variance (``-= dev^2``): the
corrected two-pass algorithm (Chan, Golub & LeVeque 1983). Without it a constant row
of 10000.2 can give ``x - mean = ulp(1e4) ~ 1e-3`` instead of 0 and ``y - bias ~ 0.3``;
with it constant rows give ``y == bias`` exactly. The refined mean and rstd are saved
for backward. Lanes past the end of the row (the padding of the last column block) are
excluded from every sum: they load 0 for the mean (the identity of a sum) and are set
to 0 *after* subtracting the mean in the second pass (``x - mean`` on a padded lane
would be ``-mean``, not 0).

Backward, with ``g = weight * dy`` and ``c1 = mean_j(g_j x_hat_j)``, ``c2 = mean_j(g_j)``::

    dx      = rstd * (g - c2 - x_hat * c1)
    dweight = sum over rows of dy * x_hat
    dbias   = sum over rows of dy

``dweight``/``dbias`` are reduced deterministically: the rows are split into ``G``
groups, one program per group accumulates its rows into its own row of an fp32
``[G, N]`` partial buffer (read-modify-write of memory no other program touches), and
a second kernel sums the ``G`` partials in the fixed order ``g = 0 .. G-1``. No atomics.
``G = cdiv(M, cdiv(M, cap))`` with cap ``MAX_GROUPS_CUDA`` (256) on a GPU and
``MAX_GROUPS_INTERPRET`` (4) under the interpreter, so groups hold several rows as
soon as ``M > cap``. The same shape on the same backend always uses the same ``G``.

``dropout_residual_layer_norm(x, residual, weight, bias, p, seed, eps)`` is one fused
kernel::

    keep = tl.rand(seed, row * N + col) >= p     (Philox; uniform in [0, 1))
    h    = where(keep, x / (1 - p), 0) + residual
    y    = layer_norm(h, weight, bias, eps)

The RNG offset is the element's *logical* index ``row * N + col`` of the flattened
``[M, N]`` view, independent of the strides of ``x``: every element gets its own
random number, rows never share a mask, and the same seed gives the same mask on any
layout. ``>=`` (not ``>``) makes ``p = 0`` keep everything even when Philox returns
exactly 0.0. ``x / (1 - p)`` is computed as ``x * scale`` with ``scale = 1 / (1 - p)``
rounded once from fp64 to fp32. ``keep`` is returned as a bool tensor of ``x``'s shape.
The kernel recomputes ``h`` (and its random numbers, which are deterministic) in each
of its three passes instead of holding the row in registers, so rows of any length work.

Rows longer than one block: every kernel loops over column blocks of ``BLOCK_N``
columns; ``BLOCK_N = clamp(next_power_of_2(N), MIN_BLOCK_N, max_block_n(device))``
where the cap is ``MAX_BLOCK_N_CUDA`` (4096) on a GPU and ``MAX_BLOCK_N_INTERPRET``
(64) under the Triton interpreter, so the multi-block path is exercised on modest N on
CPU too. Tests may lower either constant (the wrapper reads them at call time).

Layouts: ``x [..., N]`` is viewed as ``[M, N]`` with two strides when the leading dims
can be merged (``torch.reshape`` returns a view then); otherwise it is copied. The
column stride, the row stride and the strides of weight/bias are passed to the
kernels, so transposed, step-sliced and offset views are read in place.
"""
from __future__ import annotations

import math
import numbers
import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.specialisation import unspecialised_jit

__all__ = ["layer_norm", "dropout_residual_layer_norm"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Block-size buckets (powers of two) for the column loop.
MIN_BLOCK_N = 16
MAX_BLOCK_N_CUDA = 4096
MAX_BLOCK_N_INTERPRET = 64
# Number of row groups (= rows of the dweight/dbias partial buffer) in backward.
MAX_GROUPS_CUDA = 256
MAX_GROUPS_INTERPRET = 4


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def max_block_n(device: torch.device) -> int:
    return MAX_BLOCK_N_CUDA if device.type == "cuda" and not _interpreting() else MAX_BLOCK_N_INTERPRET


def block_n_for(n: int, device: torch.device) -> int:
    """Bucketed column block: next power of two of ``n``, clamped."""
    return max(MIN_BLOCK_N, min(triton.next_power_of_2(n), max_block_n(device)))


def num_warps_for(block_n: int) -> int:
    """Warps per program: about 256 columns per warp, 1 to 16 (ignored by the interpreter)."""
    return max(1, min(block_n // 256, 16))


def groups_for(m: int, device: torch.device) -> tuple[int, int]:
    """(number of row groups G, rows per group) for the backward partial sums."""
    cap = MAX_GROUPS_CUDA if device.type == "cuda" and not _interpreting() else MAX_GROUPS_INTERPRET
    rows_per_group = triton.cdiv(m, min(m, cap))
    return triton.cdiv(m, rows_per_group), rows_per_group


# --------------------------------------------------------------------------- kernels


@unspecialised_jit
def _layer_norm_fwd_kernel(
    X,  # *T [M, N] input, strides (stride_xm, stride_xn)
    W,  # *T [N] weight, stride stride_w
    B,  # *T [N] bias, stride stride_b
    Y,  # *T [M, N] output, contiguous (row stride N)
    MEAN,  # *fp32 [M] per-row mean, saved for backward
    RSTD,  # *fp32 [M] per-row 1/sqrt(var + eps), saved for backward
    stride_xm, stride_xn, stride_w, stride_b,
    N,  # row length
    eps,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_xm
    y_row = Y + row * N
    offs = tl.arange(0, BLOCK_N)

    # Pass 1: mean. Masked lanes load 0, the identity of the sum.
    sum_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + offs
        mask = cols < N
        x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        sum_acc += x
    mean = tl.sum(sum_acc, axis=0) / N

    # Pass 2: variance as the mean of squared deviations (stable for |mean| >> std).
    # A masked lane holds x = 0, so x - mean = -mean there: zero it after subtracting.
    dev_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    sq_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + offs
        mask = cols < N
        x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        xc = tl.where(mask, x - mean, 0.0)
        dev_acc += xc
        sq_acc += xc * xc
    # Corrected two-pass: the fp32 mean is off by its rounding error delta, and
    # dev = sum(x - mean) / N = -delta recovers it: refine the mean and remove dev^2
    # from the variance (a constant row then gives exactly x - mean = 0, y = bias).
    dev = tl.sum(dev_acc, axis=0) / N
    var = tl.maximum(tl.sum(sq_acc, axis=0) / N - dev * dev, 0.0)
    mean = mean + dev
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)

    # Pass 3: normalise, scale, shift.
    for start in range(0, N, BLOCK_N):
        cols = start + offs
        mask = cols < N
        x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + cols * stride_b, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=mask)


@unspecialised_jit
def _layer_norm_bwd_dx_kernel(
    DY,  # *T [M, N] upstream gradient, strides (stride_dym, stride_dyn)
    X,  # *T [M, N] forward input, strides (stride_xm, stride_xn)
    W,  # *T [N] weight, stride stride_w
    MEAN,  # *fp32 [M] saved mean
    RSTD,  # *fp32 [M] saved rstd
    DX,  # *T [M, N] gradient of x, contiguous (row stride N)
    DW_PART,  # *fp32 [G, N] partial sums of dy * x_hat, one row per group (zeroed)
    DB_PART,  # *fp32 [G, N] partial sums of dy, one row per group (zeroed)
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_w,
    M, N,
    ROWS_PER_GROUP,  # rows handled by one program (group g owns rows [g*R, (g+1)*R))
    BLOCK_N: tl.constexpr,
):
    group = tl.program_id(0).to(tl.int64)
    row_start = group * ROWS_PER_GROUP
    row_end = tl.minimum(row_start + ROWS_PER_GROUP, M)
    dw_row = DW_PART + group * N
    db_row = DB_PART + group * N
    offs = tl.arange(0, BLOCK_N)
    for row in range(row_start, row_end):
        mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        x_row = X + row * stride_xm
        dy_row = DY + row * stride_dym
        dx_row = DX + row * N

        # Pass A: c1 = mean(w*dy*x_hat), c2 = mean(w*dy). Masked lanes: g = 0.
        c1_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        c2_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            mask = cols < N
            x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
            xhat = (x - mean) * rstd
            wdy = tl.where(mask, w * dy, 0.0)
            c1_acc += wdy * xhat
            c2_acc += wdy
        c1 = tl.sum(c1_acc, axis=0) / N
        c2 = tl.sum(c2_acc, axis=0) / N

        # Pass B: dx, and this row's contribution to the group's dweight/dbias partials
        # (this program is the only one touching dw_row/db_row: no race, no atomics).
        for start in range(0, N, BLOCK_N):
            cols = start + offs
            mask = cols < N
            x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
            xhat = (x - mean) * rstd
            wdy = w * dy
            dx = (wdy - (xhat * c1 + c2)) * rstd
            tl.store(dx_row + cols, dx.to(DX.dtype.element_ty), mask=mask)
            dw_part = tl.load(dw_row + cols, mask=mask, other=0.0)
            db_part = tl.load(db_row + cols, mask=mask, other=0.0)
            tl.store(dw_row + cols, dw_part + dy * xhat, mask=mask)
            tl.store(db_row + cols, db_part + dy, mask=mask)


@unspecialised_jit
def _layer_norm_bwd_dwdb_kernel(
    DW_PART,  # *fp32 [G, N] partial sums of dy * x_hat
    DB_PART,  # *fp32 [G, N] partial sums of dy
    DW,  # *T [N] gradient of weight, contiguous
    DB,  # *T [N] gradient of bias, contiguous
    G, N,
    BLOCK_N: tl.constexpr,
):
    # One program per column block; the G partials are summed in the fixed order
    # g = 0, 1, ..., G-1, so the result is bitwise reproducible.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for g in range(0, G):
        dw += tl.load(DW_PART + g * N + cols, mask=mask, other=0.0)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    for g_b in range(0, G):
        db += tl.load(DB_PART + g_b * N + cols, mask=mask, other=0.0)
    tl.store(DW + cols, dw.to(DW.dtype.element_ty), mask=mask)
    tl.store(DB + cols, db.to(DB.dtype.element_ty), mask=mask)


@triton.jit
def _keep_mask(seed, offsets, p):
    # Philox uniform in [0, 1); ">=" keeps everything at p = 0. P(keep) = 1 - p.
    return tl.rand(seed, offsets) >= p


@triton.jit
def _dropout_add(x, r, keep, scale):
    # h = where(keep, x / (1 - p), 0) + residual, with scale = 1 / (1 - p).
    return tl.where(keep, x * scale, 0.0) + r


@unspecialised_jit
def _dropout_residual_layer_norm_kernel(
    X,  # *T [M, N] sublayer output (dropped), strides (stride_xm, stride_xn)
    R,  # *T [M, N] residual, strides (stride_rm, stride_rn)
    W,  # *T [N] weight, stride stride_w
    B,  # *T [N] bias, stride stride_b
    Y,  # *T [M, N] output, contiguous
    KEEP,  # *int8 [M, N] keep mask (a torch.bool tensor viewed as uint8), contiguous
    stride_xm, stride_xn, stride_rm, stride_rn, stride_w, stride_b,
    N,
    eps,
    p,  # drop probability, 0 <= p < 1
    scale,  # 1 / (1 - p)
    seed,  # Philox seed
    BLOCK_N: tl.constexpr,
    RNG_INT64: tl.constexpr,  # M * N does not fit in int32: use 64-bit RNG offsets
):
    pid = tl.program_id(0)
    row = pid.to(tl.int64)
    x_row = X + row * stride_xm
    r_row = R + row * stride_rm
    offs = tl.arange(0, BLOCK_N)
    if RNG_INT64:
        rng_base = row * N
    else:
        rng_base = pid * N

    # Pass 1: mean of h. Masked lanes: x = r = 0, so h = 0 (identity of the sum).
    h_sum_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + offs
        mask = cols < N
        x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_row + cols * stride_rn, mask=mask, other=0.0).to(tl.float32)
        keep = _keep_mask(seed, rng_base + cols, p)
        h = _dropout_add(x, r, keep, scale)
        h_sum_acc += h
    h_mean = tl.sum(h_sum_acc, axis=0) / N

    # Pass 2: variance of h, padded lanes zeroed after subtracting the mean.
    h_dev_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    h_sq_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + offs
        mask = cols < N
        x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_row + cols * stride_rn, mask=mask, other=0.0).to(tl.float32)
        keep = _keep_mask(seed, rng_base + cols, p)
        h = _dropout_add(x, r, keep, scale)
        hc = tl.where(mask, h - h_mean, 0.0)
        h_dev_acc += hc
        h_sq_acc += hc * hc
    # Corrected two-pass, as in _layer_norm_fwd_kernel.
    h_dev = tl.sum(h_dev_acc, axis=0) / N
    h_var = tl.maximum(tl.sum(h_sq_acc, axis=0) / N - h_dev * h_dev, 0.0)
    h_mean = h_mean + h_dev
    h_rstd = 1.0 / tl.sqrt(h_var + eps)

    # Pass 3: normalise, scale, shift; store y and the keep mask.
    for start in range(0, N, BLOCK_N):
        cols = start + offs
        mask = cols < N
        x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_row + cols * stride_rn, mask=mask, other=0.0).to(tl.float32)
        keep = _keep_mask(seed, rng_base + cols, p)
        h = _dropout_add(x, r, keep, scale)
        w = tl.load(W + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + cols * stride_b, mask=mask, other=0.0).to(tl.float32)
        y = (h - h_mean) * h_rstd * w + b
        tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)
        tl.store(KEEP + row * N + cols, keep.to(tl.int8), mask=mask)


# --------------------------------------------------------------------------- validation


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} has unsupported dtype {t.dtype}; supported: float32, float16, bfloat16")


def _check_common(x, weight, bias, eps, extra=()) -> int:
    """Checks shared by both ops; returns N. ``extra`` is ((name, tensor), ...) shaped like x."""
    named = [("x", x), *extra, ("weight", weight), ("bias", bias)]
    for name, t in named:
        _check_tensor(name, t)
    for name, t in named[1:]:
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has dtype {x.dtype}; they must match")
    for name, t in named[1:]:
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; all tensors must be on one device")
    if x.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"x is on {x.device}: needs a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors")
    if x.dim() < 1:
        raise ValueError(f"x must have at least one dim [..., N], got shape {tuple(x.shape)}")
    n = x.shape[-1]
    if n == 0:
        raise ValueError(f"x has an empty last dim (shape {tuple(x.shape)}): layer norm over 0 elements is undefined")
    for name, t in extra:
        if t.shape != x.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but x has shape {tuple(x.shape)}; they must match")
    for name, t in (("weight", weight), ("bias", bias)):
        if tuple(t.shape) != (n,):
            raise ValueError(f"{name} must have shape ({n},) (x's last dim), got {tuple(t.shape)}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be finite and > 0, got {eps}")
    return n


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t [..., N]`` as ``[M, N]``: a view when the leading dims merge, else a copy."""
    return t.reshape(-1, n)


# --------------------------------------------------------------------------- layer_norm


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        n = x.shape[-1]
        x2 = _rows(x, n)
        m = x2.shape[0]
        y = torch.empty((m, n), dtype=x.dtype, device=x.device)
        mean = torch.empty((m,), dtype=torch.float32, device=x.device)
        rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
        if m > 0:
            block_n = block_n_for(n, x.device)
            _layer_norm_fwd_kernel[(m,)](
                x2, weight, bias, y, mean, rstd,
                x2.stride(0), x2.stride(1), weight.stride(0), bias.stride(0),
                n, float(eps),
                BLOCK_N=block_n, num_warps=num_warps_for(block_n),
            )
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.x_shape = x.shape
        ctx.bias_dtype = bias.dtype
        return y.view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        m, n = x2.shape
        dx = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
        dw = torch.zeros((n,), dtype=weight.dtype, device=x2.device)
        db = torch.zeros((n,), dtype=ctx.bias_dtype, device=x2.device)
        if m > 0:
            dy2 = _rows(dy, n)
            block_n = block_n_for(n, x2.device)
            num_groups, rows_per_group = groups_for(m, x2.device)
            dw_part = torch.zeros((num_groups, n), dtype=torch.float32, device=x2.device)
            db_part = torch.zeros((num_groups, n), dtype=torch.float32, device=x2.device)
            _layer_norm_bwd_dx_kernel[(num_groups,)](
                dy2, x2, weight, mean, rstd, dx, dw_part, db_part,
                dy2.stride(0), dy2.stride(1), x2.stride(0), x2.stride(1), weight.stride(0),
                m, n, rows_per_group,
                BLOCK_N=block_n, num_warps=num_warps_for(block_n),
            )
            _layer_norm_bwd_dwdb_kernel[(triton.cdiv(n, block_n),)](
                dw_part, db_part, dw, db, num_groups, n,
                BLOCK_N=block_n,
            )
        dx = dx.view(ctx.x_shape)
        needs = ctx.needs_input_grad
        return (dx if needs[0] else None, dw if needs[1] else None, db if needs[2] else None, None)


def layer_norm(x, weight, bias, eps=1e-5):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dim of ``x``.

    Differentiable in ``x``, ``weight`` and ``bias`` (Triton backward). See the module
    docstring for the math, the masking and the block sizes.
    """
    _check_common(x, weight, bias, eps)
    return _LayerNormFn.apply(x, weight, bias, eps)


layer_norm.dtypes = DTYPES
layer_norm.supports_backward = True


# --------------------------------------------------------------------------- dropout


def dropout_residual_layer_norm(x, residual, weight, bias, p, seed, eps=1e-5):
    """``h = where(keep, x / (1 - p), 0) + residual; y = layer_norm(h)``; returns ``(y, keep)``.

    ``keep = tl.rand(seed, row * N + col) >= p`` over the flattened ``[M, N]`` view (see
    the module docstring). No backward.
    """
    n = _check_common(x, weight, bias, eps, extra=(("residual", residual),))
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"p must be a real number, got {type(p).__name__}")
    if not (0.0 <= p < 1.0):
        raise ValueError(f"p must satisfy 0 <= p < 1, got {p}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not (0 <= seed < 2**63):
        raise ValueError(f"seed must satisfy 0 <= seed < 2**63, got {seed}")
    x2 = _rows(x, n)
    r2 = _rows(residual, n)
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    keep = torch.empty((m, n), dtype=torch.bool, device=x.device)
    if m > 0:
        block_n = block_n_for(n, x.device)
        _dropout_residual_layer_norm_kernel[(m,)](
            x2, r2, weight, bias, y, keep.view(torch.uint8),
            x2.stride(0), x2.stride(1), r2.stride(0), r2.stride(1), weight.stride(0), bias.stride(0),
            n, float(eps), float(p), float(1.0 / (1.0 - float(p))), seed,
            BLOCK_N=block_n,
            RNG_INT64=(m * n + block_n) >= 2**31,
            num_warps=num_warps_for(block_n),
        )
    return y.view(x.shape), keep.view(x.shape)


dropout_residual_layer_norm.dtypes = DTYPES
dropout_residual_layer_norm.supports_backward = False
