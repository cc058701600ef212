"""Tolerance rules of the elementwise family: rope (and its pair norms) and swiglu, with gradients.

The pieces (unit roundoff, sum bounds, floors, SAFETY and the other constants with
their sources) are in :mod:`tritoncheck.tolerance`. The rules are evaluated in float64
torch on the suite's device (the GPU when there is one); arguments may be NumPy arrays
or tensors, results are NumPy."""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.oracle import to_numpy
from tritoncheck.tolerance import EXP_ULPS, SAFETY, Precision, float64_on, unit_roundoff


def _interleave(even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
    """[..., n] from the [..., n/2] halves at even and odd positions."""
    return torch.stack((even, odd), dim=-1).flatten(-2)


def _elementwise_subnormal_spacing(dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return float(info.tiny) * float(info.eps)


def rope(x, cos, sin, y, table_dtype: torch.dtype, p: Precision) -> np.ndarray:
    """Allowed absolute error of each rope output (and of dx, with dy for x and dx for y).

    y_2i = x_2i c - x_2i+1 s, y_2i+1 = x_2i s + x_2i+1 c: two products and a sum.
    In fp32 (the kernel: tables and x loaded and upcast exactly) that is
    u32 (|x_2i c| + |x_2i+1 s|) + u32 |y|, then the store in x's dtype. The plain
    PyTorch form, as users write it (``torch_rope``), casts the tables to x's dtype
    (u(x) per table entry, unless the cast is exact: same dtype, or x in float32) and
    rounds each product and the sum in x's dtype, so the rule allows
    (u_cast + u(x)) (|x_2i c| + |x_2i+1 s|) on top of the store: the kernel is held to
    the accuracy a user gets from PyTorch, not to the tighter bound its fp32
    arithmetic reaches. Near underflow, each of the two products may round into x's
    subnormals (one floor each) besides the store (one more).
    The backward (dx from dy) is the transposed rotation of dy by the same tables:
    nothing is computed in forward and kept in x's dtype, so no second rounding arises.
    """
    u_in = unit_roundoff(p.dtype)
    u_cast = u_in if (table_dtype != p.dtype and p.dtype != torch.float32) else 0.0
    x, cos, sin, y = (float64_on(t) for t in (x, cos, sin, y))
    xa, xb = x[..., 0::2], x[..., 1::2]
    prod = _interleave((xa * cos).abs() + (xb * sin).abs(), (xa * sin).abs() + (xb * cos).abs())
    return to_numpy(SAFETY * (u_cast + u_in) * prod + p.store * y.abs() + 3 * p.floor)


def rope_pair_norm(x, cos, sin, y, table_dtype: torch.dtype, p: Precision) -> tuple[np.ndarray, np.ndarray]:
    """The norm of each output pair (y_2i, y_2i+1) and its allowed error, derived for the
    norm itself.

    [[c, -s], [s, c]] is a rotation scaled by r = sqrt(c^2 + s^2), whatever the tables
    hold, so the exact map of the tables as given sends a pair of norm |x| to one of
    norm r |x| (r = 1 within the tables' rounding for tables of real angles; the check
    compares with r |x|, computed in fp64, and so needs no assumption on the tables). The
    computed pair differs from the exact one by the error vector (e_0, e_1), and
    | |y_hat| - |y| | <= |(e_0, e_1)| = sqrt(e_0^2 + e_1^2): the two component errors add
    in quadrature, not linearly. Each e_k is the component's arithmetic (SAFETY u(x) times
    its two products, as in ``rope``), its store (u_out |y_k|) and three floors near
    underflow. A plain PyTorch rope that casts the tables to x's dtype rotates by the
    cast tables instead: their norm factor moves by at most u_cast, i.e. u_cast r |x|.
    Returns (r |x|, allowance) per pair."""
    u_in = unit_roundoff(p.dtype)
    u_cast = u_in if (table_dtype != p.dtype and p.dtype != torch.float32) else 0.0
    x, cos, sin, y = (float64_on(t) for t in (x, cos, sin, y))
    xa, xb, ya, yb = x[..., 0::2], x[..., 1::2], y[..., 0::2], y[..., 1::2]
    r = torch.hypot(cos, sin)
    norm = r * torch.hypot(xa, xb)
    e0 = SAFETY * u_in * ((xa * cos).abs() + (xb * sin).abs()) + p.store * ya.abs() + 3 * p.floor
    e1 = SAFETY * u_in * ((xa * sin).abs() + (xb * cos).abs()) + p.store * yb.abs() + 3 * p.floor
    return to_numpy(norm), to_numpy(u_cast * norm + torch.hypot(e0, e1) + 2 * unit_roundoff(torch.float64) * norm)


def _swiglu_sigmoid_parts(g: torch.Tensor):
    """sigmoid(g), 1 - sigmoid(g) and exp(-|g|), all exact in fp64 (no cancellation)."""
    e = torch.exp(-g.abs())
    s = torch.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    one_minus = torch.where(g >= 0, e / (1.0 + e), 1.0 / (1.0 + e))
    return s, one_minus, e


def _swiglu_sigmoid_error(g: torch.Tensor, u: float) -> torch.Tensor:
    """Relative error bound of an fp32 sigmoid s(g) from e = exp(-|g|).

    e errs by u (EXP_ULPS + |g|) relative (exp and the log2(e) scaling of its
    argument); through s = 1 / (1 + e) or e / (1 + e) that becomes a relative error
    (1 - s) times as large. 1 + e and the division round (2 u), except that for
    g >= 0 and e below u, 1 + e rounds to 1 with an error of e, not u: 2 min(u, e).
    """
    _, one_minus, e = _swiglu_sigmoid_parts(g)
    rounding = torch.where(g >= 0, 2 * e.clamp(max=u), 2 * u)
    return u * (EXP_ULPS + g.abs()) * one_minus + rounding


def _swiglu_flush(g: torch.Tensor) -> torch.Tensor:
    """Where sigmoid(g) is below fp32's smallest normal (g < -87.3): an fp32
    intermediate that may be flushed to zero (FTZ in GPU exp), and which
    ``torch.sigmoid``/``F.silu`` turn into 0 already at g < -88.7 (exp(-g) overflows
    to inf); the products that carry it then lose their whole value."""
    s, _, _ = _swiglu_sigmoid_parts(g)
    return s < float(torch.finfo(torch.float32).tiny)


def _swiglu_subnormal_read(v: torch.Tensor) -> torch.Tensor:
    """How far an operand may be misread: 2 tiny(fp32) where it is nonzero and below
    fp32's smallest normal, else 0. FTZ arithmetic (GPU .ftz instructions) reads such
    an operand as 0; the Triton interpreter's bf16 -> fp32 conversion garbles it into
    another value below tiny(fp32) (``_convert_float`` normalises the subnormal
    significand, then clamps the exponent at 0 without shifting it back). Either way
    the operand is off by less than 2 tiny(fp32), which a product with a large factor
    (swiglu's gate up to 1.3e19) turns into a visible error."""
    tiny = float(torch.finfo(torch.float32).tiny)
    return torch.where((v != 0) & (v.abs() < tiny), 2 * tiny, 0.0)


def swiglu(gate, up, y, p: Precision) -> np.ndarray:
    """Allowed absolute error of y = gate sigmoid(gate) up.

    The fp32 sigmoid's relative error (:func:`_swiglu_sigmoid_error`), two products
    (2 u), the store. ``F.silu(gate) * up``, as users write it, rounds silu(gate) to the
    input dtype before the product: one more u(input) |y|, and u(input)'s subnormal
    spacing times |up| where silu(gate) is tiny. Where sigmoid(gate) is below fp32's
    smallest normal, y may be flushed to 0 (:func:`_swiglu_flush`). A subnormal gate
    or up may be misread by 2 tiny(fp32) (:func:`_swiglu_subnormal_read`), times the
    partial derivative of y in it (|gate sigmoid(gate)| for up, at most 1.1 |up| for gate).
    """
    u = p.compute
    gate, up, y = (float64_on(t) for t in (gate, up, y))
    ay = y.abs()
    allowed = (SAFETY * (_swiglu_sigmoid_error(gate, u) + 2 * u) * ay + unit_roundoff(p.dtype) * ay
               + _elementwise_subnormal_spacing(p.dtype) * up.abs() + p.store * ay + p.floor)
    s, _, _ = _swiglu_sigmoid_parts(gate)
    allowed = (allowed + _swiglu_subnormal_read(up) * (gate * s).abs()
               + _swiglu_subnormal_read(gate) * 1.1 * up.abs())
    return to_numpy(torch.where(_swiglu_flush(gate), torch.maximum(allowed, ay + p.floor), allowed))


def swiglu_grad(gate, up, dy, dgate, dup, p: Precision) -> tuple[np.ndarray, np.ndarray]:
    """Allowed absolute errors of dgate = dy up t, t = s + g s (1 - s), and dup = dy g s.

    s carries its absolute error ds = r_s s (:func:`_swiglu_sigmoid_error`); t moves by
    |dt/ds| ds = |1 + g (1 - 2 s)| ds (for large g that is g ds: 1 - s cancels,
    bounded because ds shrinks with e = exp(-g)); forming t rounds u (|t| + 3 |g s
    (1 - s)|); the products with dy and up round 2 u. The autograd backward of
    ``F.silu(gate) * up`` in the input dtype first rounds dy * up (dgate) or silu(gate)
    (dup) to the input dtype: one more u(input) of the result, and its subnormal
    spacing times the other factor. Then the store in the input dtype, and the FTZ
    region of sigmoid and the misread subnormal operands as in :func:`swiglu`
    (|dt/dgate| <= 1). That extra u(input) is also what a fused kernel costs that saves
    silu(gate) in the input dtype in forward and scales it by dy in backward (two
    roundings of dup in the input dtype); dgate needs s in fp32, which no such kernel
    stores in a lower precision.
    """
    u = p.compute
    u_in = unit_roundoff(p.dtype)
    sub = _elementwise_subnormal_spacing(p.dtype)
    gate, up, dy, dgate, dup = (float64_on(t) for t in (gate, up, dy, dgate, dup))
    s, one_minus, _ = _swiglu_sigmoid_parts(gate)
    ds = _swiglu_sigmoid_error(gate, u) * s
    t = s + gate * s * one_minus
    dt = (1 + gate * (one_minus - s)).abs() * ds + u * (t.abs() + 3 * (gate * s * one_minus).abs())
    adg = torch.where(torch.isfinite(dgate), dgate.abs(), 0.0)
    adu = torch.where(torch.isfinite(dup), dup.abs(), 0.0)
    flush = _swiglu_flush(gate)
    a_gate = (SAFETY * ((dy * up).abs() * dt + 2 * u * adg) + u_in * adg + sub * t.abs()
              + p.store * adg + p.floor)
    a_up = (SAFETY * (_swiglu_sigmoid_error(gate, u) + 2 * u) * adu + u_in * adu + sub * dy.abs()
            + p.store * adu + p.floor)
    rg, ru, rd = _swiglu_subnormal_read(gate), _swiglu_subnormal_read(up), _swiglu_subnormal_read(dy)
    a_gate = a_gate + ru * (dy * t).abs() + rg * (dy * up).abs() + rd * (up * t).abs()
    a_up = a_up + rg * 1.1 * dy.abs() + rd * (gate * s).abs()
    return (to_numpy(torch.where(flush, torch.maximum(a_gate, adg + p.floor), a_gate)),
            to_numpy(torch.where(flush, torch.maximum(a_up, adu + p.floor), a_up)))
