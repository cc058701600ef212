"""Tolerance rules of the elementwise family: rope (and its pair norms) and swiglu, with gradients.

Pieces and notation: :mod:`tritoncheck.tolerance`. Evaluated in float64 torch on the
suite's device; arguments NumPy arrays or tensors, results NumPy."""
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

    y_2i = x_2i c - x_2i+1 s, y_2i+1 = x_2i s + x_2i+1 c: two products and a sum, in fp32
    u32 (|x_2i c| + |x_2i+1 s|) + u32 |y| before the store. Plain PyTorch (``torch_rope``)
    casts the tables to x's dtype (u_cast = u(x), 0 for the same dtype or x in float32)
    and rounds products and sum in x's dtype, so the rule allows (u_cast + u(x))
    (|x_2i c| + |x_2i+1 s|) plus the store: kernels are held to what users get from
    PyTorch, not to their fp32 bound. Near underflow: a floor for each product and the
    store. The backward is the transposed rotation of dy by the same tables, with nothing
    kept in x's dtype from the forward: the same rule.
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

    [[c, -s], [s, c]] is a rotation scaled by r = sqrt(c^2 + s^2) whatever the tables
    hold, so the exact pair has norm r |x| (computed in fp64: no assumption on the
    tables). | |y_hat| - |y| | <= |(e_0, e_1)|: the component errors add in quadrature.
    Each e_k is SAFETY u(x) times its two products (as in ``rope``), its store
    (u_out |y_k|) and three floors. Tables cast to x's dtype move the norm factor by at
    most u_cast: u_cast r |x|. Returns (r |x|, allowance) per pair."""
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

    e errs by u (EXP_ULPS + |g|) relative (exp, and the log2(e) scaling of its argument),
    which s = 1 / (1 + e) or e / (1 + e) carries times (1 - s). 1 + e and the division
    round (2 u); for g >= 0 and e < u, 1 + e rounds to 1, an error of e: 2 min(u, e).
    """
    _, one_minus, e = _swiglu_sigmoid_parts(g)
    rounding = torch.where(g >= 0, 2 * e.clamp(max=u), 2 * u)
    return u * (EXP_ULPS + g.abs()) * one_minus + rounding


def _swiglu_flush(g: torch.Tensor) -> torch.Tensor:
    """Where sigmoid(g) is below fp32's smallest normal (g < -87.3): it may be flushed to
    zero (GPU FTZ; ``torch.sigmoid``/``F.silu`` give 0 from g < -88.7, where exp(-g)
    overflows), and the products that carry it lose their whole value."""
    s, _, _ = _swiglu_sigmoid_parts(g)
    return s < float(torch.finfo(torch.float32).tiny)


def _swiglu_subnormal_read(v: torch.Tensor) -> torch.Tensor:
    """How far an operand may be misread: 2 tiny(fp32) where it is nonzero and below
    fp32's smallest normal, else 0. GPU .ftz arithmetic reads it as 0; the interpreter's
    bf16 -> fp32 ``_convert_float`` garbles it into another value below tiny(fp32). A
    large factor (swiglu's gate up to 1.3e19) makes that visible."""
    tiny = float(torch.finfo(torch.float32).tiny)
    return torch.where((v != 0) & (v.abs() < tiny), 2 * tiny, 0.0)


def swiglu(gate, up, y, p: Precision) -> np.ndarray:
    """Allowed absolute error of y = gate sigmoid(gate) up.

    The fp32 sigmoid's relative error (:func:`_swiglu_sigmoid_error`), two products
    (2 u), the store. ``F.silu(gate) * up`` rounds silu(gate) to the input dtype first:
    u(input) |y| more, and its subnormal spacing times |up|. y may be flushed to 0 where
    sigmoid(gate) is (:func:`_swiglu_flush`). A subnormal operand misread by 2 tiny(fp32)
    (:func:`_swiglu_subnormal_read`) costs that times y's partial derivative in it
    (|gate sigmoid(gate)| for up, at most 1.1 |up| for gate).
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

    s carries ds = r_s s (:func:`_swiglu_sigmoid_error`); t moves by |1 + g (1 - 2 s)| ds
    (g ds for large g, bounded since ds shrinks with exp(-g)); forming t rounds
    u (|t| + 3 |g s (1 - s)|); the products with dy and up 2 u. Autograd of
    ``F.silu(gate) * up`` in the input dtype rounds dy * up (dgate) or silu(gate) (dup) to
    it first: u(input) of the result, and its subnormal spacing times the other factor;
    the same covers a fused kernel that saves silu(gate) in the input dtype (dgate needs
    s in fp32, which no such kernel lowers). Then the store, and the FTZ region and
    misread operands as in :func:`swiglu` (|dt/dgate| <= 1).
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
