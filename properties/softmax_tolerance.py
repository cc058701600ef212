"""Tolerance rules of the softmax family: softmax, its gradient, and the row sum of its output.

Pieces and notation: :mod:`tritoncheck.tolerance`. Evaluated in float64 torch on the
suite's device; arguments NumPy arrays or tensors, results NumPy (the pieces
:func:`softmax_exponent_error` and :func:`softmax_allowance` return tensors)."""
from __future__ import annotations

import math

import numpy as np
import torch

from tritoncheck.oracle import to_numpy
from tritoncheck.tolerance import EXP_ULPS, SAFETY, Precision, float64_on, sum_error, unit_roundoff


def softmax_exponent_error(x, temperature: float, p: Precision) -> tuple[torch.Tensor, torch.Tensor]:
    """Bound E_i on the error of log y_i, and the exact log y_i, for y = softmax(x / T).

    log y_i = (z_i - m) - log s, z = x / T, m = max_j z_j, s = sum_j e^{z_j - m}: element
    i's *own* error o_i in z_i - m, then the normaliser's, every own error weighted:

    * x is exact (the input). For T == 1, z = x exactly; for T != 1, z_i = x_i / T rounds
      (in fp32 in a kernel, in the input dtype in users' ``torch.softmax(x / t)``): u(input) |z_i|.
      Rounding is monotone, so z_m - m = 0 exactly for the max element; any other
      element's z_i - m moves by u(input) (|z_i| + |m|).
    * z_i - m rounds (u |z_i - m|); exp adds EXP_ULPS u plus u |z_i - m| from the
      log2(e) scaling on GPUs: o_i = u(input) (|z_i| + |m|) [i not the max] +
      u (2 |z_i - m| + EXP_ULPS).
    * The normaliser: with term j off by a factor within e^{+-o_j}, log s moves by at
      most log sum_j y_j e^{o_j} (y_j the exact weights; the other side,
      -log sum_j y_j e^{-o_j}, is smaller by convexity). Not linearised: a bf16 rounding of x / T can tie a small logit with the
      max, which only the exact form follows. An online pass's rescaling by
      e^{m_lane - m} has an exponent no larger than |z_j - m|: the same 2 u |z_j - m|. The
      sum of n positive terms adds sum_error(n), the division y = e / s adds u. SAFETY
      applies to every o_j, inside the normaliser too.

    -inf entries are exactly 0 and drop out of n (an exact check covers them). Not
    covered: scaling by log2(e) before subtracting the max (exp2(x log2e - m log2e)),
    off by u (|z_i| + |m|); kernels are held to ``torch.softmax``'s u |z_i - m|.
    """
    z = float64_on(x) / temperature
    finite = torch.isfinite(z)
    zf = torch.where(finite, z, 0.0)
    m = torch.where(finite, z, -math.inf).amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0.0)
    d = zf - m
    log_y = torch.where(finite, d, -math.inf) - torch.log(torch.where(finite, torch.exp(d), 0.0)
                                                          .sum(dim=-1, keepdim=True))
    n = finite.sum(dim=-1, keepdim=True)
    u_div = unit_roundoff(p.dtype) if temperature != 1 else 0.0
    not_max = finite & (zf != m)
    own = SAFETY * (torch.where(not_max, u_div * (zf.abs() + m.abs()), 0.0) + p.compute * (2 * d.abs() + EXP_ULPS))
    own = torch.where(finite, own, 0.0)
    # y_j (e^{o_j} - 1), without 0 * inf for entries whose weight underflows
    grow = torch.where(own < 50, torch.exp(log_y) * torch.expm1(own.clamp(max=50.0)), torch.exp(log_y + own))
    normaliser = torch.log1p(torch.where(finite, grow, 0.0).sum(dim=-1, keepdim=True))
    err = own + normaliser + SAFETY * (p.compute + sum_error(n, p.compute))
    return err, log_y


def softmax_allowance(x, temperature: float, p: Precision) -> torch.Tensor:
    """Error of y_i from its exponent error E_i, before the final store.

    An error of at most E in log y_i moves y_i by at most e^{log y_i + E} (1 - e^{-E}),
    capped at 1: y_i E for small E, the whole [0, 1] for large E (rounding that can
    reorder the logits, e.g. ties from x / T in bf16).
    """
    err, log_y = softmax_exponent_error(x, temperature, p)
    # A -inf entry is exactly 0 whatever E is; E is infinite where rounding x / T near the
    # dtype's max moves the normaliser without bound, and e^{-inf + inf} would be NaN.
    grown = torch.where(torch.isneginf(log_y), 0.0, torch.exp(log_y + err))
    return grown.clamp(max=1.0) * -torch.expm1(-err)


def softmax(x, y, temperature: float, p: Precision) -> np.ndarray:
    """Allowed absolute error of each softmax output: the exponent error, the store."""
    return to_numpy(_softmax(x, y, temperature, p))


def _softmax(x, y, temperature: float, p: Precision) -> torch.Tensor:
    return softmax_allowance(x, temperature, p) + p.store * float64_on(y).abs() + p.floor


def softmax_grad(x, y, dy, dx, temperature: float, p: Precision) -> np.ndarray:
    """Allowed absolute error of dx = y * (dy - <dy, y>) / T.

    The saved output y is off by a_j, the forward allowance (its floor included: a y_j
    in fp16's subnormals is good to its spacing, which a large dy_j amplifies); <dy, y>
    errs by sum_j |dy_j| a_j + sum_j |dy_j y_j| sum_error(n), y_i (dy_i - <dy, y>) by
    a_i |dy_i - <dy, y>| + |y_i| times that; then the division by T (input dtype) and the
    store round.

    The products g_j = dy_j y_j may be formed in the input dtype: PyTorch's own backward
    does (aten's softmax_backward_cuda makes ``grad * output`` a tensor of the input
    dtype, then its kernel stores g_i - y_i sum_j g_j). Each product errs by
    r_j = u(input) |g_j|, or, below the dtype's smallest normal, by up to half a
    subnormal spacing: r_i itself, and y_i sum_j r_j through the sum. The relative part
    is summed worst case like the other terms; the subnormal part too (y_i times half a
    spacing per subnormal product, no SAFETY: it is exact), since the roundings of a row
    are not independent where its values repeat. Without this term a float16 row of 2045
    with dy ~ 1e-3 (every product a subnormal) failed PyTorch's own result (issue 36).

    Below the smallest normal: g_i and the gradient of z = x / T each round to the
    subnormal grid (half a spacing each) before the division's backward scales them by
    1/T, and for T != 1 the stored dx rounds once more: a floor of (1/T + [T != 1]/2)
    spacings, at least one.
    """
    x, y, dy, dx = (float64_on(t) for t in (x, y, dy, dx))
    a = _softmax(x, y, temperature, p)
    n = torch.isfinite(x).sum(dim=-1, keepdim=True)
    inner = (dy * y).sum(dim=-1, keepdim=True)
    inner_err = (dy.abs() * a + (dy * y).abs() * sum_error(n, p.compute)).sum(dim=-1, keepdim=True)
    products = (dy * y).abs()
    rounded = unit_roundoff(p.dtype) * products  # r_j's relative part
    subnormal = torch.where(products < float(torch.finfo(p.dtype).tiny), p.floor / 2, 0.0)
    bound = (a * ((dy - inner).abs() + inner_err) + y.abs() * inner_err
             + rounded + y.abs() * rounded.sum(dim=-1, keepdim=True))
    through_sum = y.abs() * subnormal.sum(dim=-1, keepdim=True)
    floor = p.floor * max(1.0, 1.0 / temperature + (0.5 if temperature != 1 else 0.0))
    return to_numpy((SAFETY * bound + through_sum) / temperature + 2 * p.store * dx.abs() + floor)


def softmax_row_sum(x, y, temperature: float, p: Precision) -> np.ndarray:
    """Allowed deviation of each row sum of a softmax output y from 1, derived for the
    sum itself (not the sum of the elements' allowances).

    A softmax that normalises by the sum of its own exponentials, y_i = e_i / S with
    e_i = exp(z_i - m) (1 + eta_i), S = sum_j e_j (1 + sigma), once per row or online,
    sums to 1 / (1 + sigma) exactly: the exponent errors, the rounding of z = x / T and
    the choice of m cancel. What is left:

    * sigma: a sum of n positive terms, ``sum_error(n)``; an online form's rescaling by
      exp(m_old - m_new) is one more rounding on a partial sum, which that model covers.
    * a numerator recomputed (two-pass online) or rescaled differently from its term in
      S: exp(z_i - m) against exp(z_i - m_k) exp(m_k - m), the arguments rounded by
      u |z_i - m| (m_k between z_i and m) twice, plus EXP_ULPS u per exp; weighted by y_i:
      u (2 EXP_ULPS + 2 sum_i y_i |z_i - m|), where sum_i y_i (m - z_i) = H(y) - log S
      <= log n whatever the logits.
    * the division e_i / S: u in the sum.
    * each y_i's store: u_out |y_i|, or below the smallest normal the floor, summed.
    * the check's own fp64 sum: n u64.

    ``y`` is the implementation's own output (clipped to [0, 1]), so no reference is
    needed. -inf entries contribute exactly 0 and drop out of n.
    """
    x, y = float64_on(x), float64_on(y)
    z = x / temperature
    finite = torch.isfinite(z)
    m = torch.where(finite, z, -math.inf).amax(dim=-1, keepdim=True)
    gap = torch.where(finite & torch.isfinite(m), m - z, 0.0)
    w = torch.where(torch.isfinite(y), y, 0.0).clamp(0.0, 1.0)
    n = finite.sum(dim=-1)
    numerator = p.compute * (2 * EXP_ULPS + 1 + 2 * (w * gap).sum(dim=-1))
    tiny = float(torch.finfo(p.dtype).tiny)
    store = p.store * w.sum(dim=-1) + p.floor * (finite & (w < tiny)).sum(dim=-1)
    return to_numpy(SAFETY * (sum_error(n, p.compute) + numerator) + store + x.shape[-1] * unit_roundoff(torch.float64))
