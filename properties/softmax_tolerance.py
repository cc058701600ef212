"""Tolerance rules of the softmax family: softmax, its gradient, and the row sum of its output.

The pieces (unit roundoff, sum bounds, floors, SAFETY and the other constants with
their sources) are in :mod:`tritoncheck.tolerance`. The rules are evaluated in float64
torch on the suite's device (the GPU when there is one); arguments may be NumPy arrays
or tensors, results are NumPy (:func:`softmax_exponent_error` and
:func:`softmax_allowance`, the pieces, return tensors)."""
from __future__ import annotations

import math

import numpy as np
import torch

from tritoncheck.oracle import to_numpy
from tritoncheck.tolerance import EXP_ULPS, SAFETY, Precision, float64_on, sum_error, unit_roundoff


def softmax_exponent_error(x, temperature: float, p: Precision) -> tuple[torch.Tensor, torch.Tensor]:
    """Bound E_i on the error of log y_i, and the exact log y_i, for y = softmax(x / T).

    log y_i = (z_i - m) - log s, z = x / T, m = max_j z_j, s = sum_j e^{z_j - m}. The
    error of element i's own term z_i - m (its *own* error o_i), then the error of the
    normaliser log s, which is the weighted effect of every element's own error:

    * x is exact: it is the input, already in its dtype. For T == 1, z = x exactly.
      For T != 1, z_i = x_i / T rounds: in fp32 inside a kernel, but in the input
      dtype in ``torch.softmax(x / t)``, the way users write it, so by u(input) |z_i|.
      Rounding is monotone, so the max stays the max and z_m - m = 0 exactly for the
      max element whatever the rounding; any other element's z_i - m moves by
      u(input) (|z_i| + |m|).
    * z_i - m rounds (u |z_i - m|); exp adds EXP_ULPS u plus u |z_i - m| from the
      log2(e) scaling on GPUs: o_i = u(input) (|z_i| + |m|) [i not the max] +
      u (2 |z_i - m| + EXP_ULPS).
    * The normaliser: with every term j off by a factor within e^{+-o_j}, log s moves by
      at most log sum_j y_j e^{o_j} (y_j the exact softmax weights; the other side,
      -log sum_j y_j e^{-o_j}, is smaller by convexity). Not linearised: a bf16 rounding
      of x / T can tie a small logit with the max and multiply its weight by e^{o_j},
      which only the exact form follows. An online pass rescales partial sums by
      e^{m_lane - m}, an exponent no larger than |z_j - m| for the terms it carries: the
      same 2 u |z_j - m| per term. The sum of n positive terms adds sum_error(n), the
      division y = e / s adds u. SAFETY applies to every o_j, inside the normaliser too.

    Entries that are -inf are exactly 0 and drop out of n (a separate, exact check
    covers them). An implementation that scales by log2(e) before subtracting the max
    (exp2(x log2e - m log2e)) rounds x log2e by u |z| and so is off by u (|z_i| + |m|)
    where ``torch.softmax`` is off by u |z_i - m|; the rule holds kernels to the latter.

    Why the old rule was wrong: it charged u (|z_i| + |m|) to every element whatever T
    and whichever element, and u(input) |m| to every element through the normaliser.
    For T == 1 nothing rounds there, and for the max element z_m - m = 0 exactly; with
    logits near fp32's max those terms reached 1e31, so the top entry's allowance was
    ~1 and an all-zero output passed (x = [3e38, -3e38, 1e38] in fp32: allowed 1.00000006
    for an expected 1). The normaliser now weighs each element's own error by its
    weight y_j, so a dominant max element contributes only its own small error.
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

    An error of at most E in log y_i moves y_i = e^{log y_i} by at most
    e^{log y_i + E} (1 - e^{-E}), capped at 1: for small E that is y_i E, and for
    large E (inputs whose rounding can reorder the logits, e.g. ties created by
    rounding x / T in bf16) it correctly grows to the whole [0, 1] range.
    """
    err, log_y = softmax_exponent_error(x, temperature, p)
    # A -inf entry is exactly 0 (log y = -inf) whatever E is; E is infinite where rounding
    # x / T near the dtype's max can move the normaliser without bound (bf16, T = 0.5,
    # |x| ~ 1e38), and e^{-inf + inf} was NaN there: an invalid allowance, found by the
    # gpu profile at 200 examples.
    grown = torch.where(torch.isneginf(log_y), 0.0, torch.exp(log_y + err))
    return grown.clamp(max=1.0) * -torch.expm1(-err)


def softmax(x, y, temperature: float, p: Precision) -> np.ndarray:
    """Allowed absolute error of each softmax output: the exponent error, the store."""
    return to_numpy(_softmax(x, y, temperature, p))


def _softmax(x, y, temperature: float, p: Precision) -> torch.Tensor:
    return softmax_allowance(x, temperature, p) + p.store * float64_on(y).abs() + p.floor


def softmax_grad(x, y, dy, dx, temperature: float, p: Precision) -> np.ndarray:
    """Allowed absolute error of dx = y * (dy - <dy, y>) / T.

    The backward reads the saved output y, already off by a_j = the forward
    allowance (exponent error, store rounding, and the underflow floor: a y_j in
    fp16's subnormal range is only good to its spacing, which a large dy_j
    amplifies); <dy, y> then errs by sum_j |dy_j| a_j + sum_j |dy_j y_j| sum_error(n),
    y_i (dy_i - <dy, y>) by a_i |dy_i - <dy, y>| + |y_i| times that; the result is
    rounded on the way (the division by T in the input dtype, the store). Below the
    smallest normal the rounding is absolute: the gradient of z = x / T rounds to the
    subnormal grid (half a spacing) before the division scales it by 1/T, and the store
    rounds once more (half a spacing), so the floor is max(1, 1/T) spacings (seen on an
    H100: torch.softmax(x / 0.5) in fp16, 2 subnormal spacings off an exact -2.2e-8).
    """
    x, y, dy, dx = (float64_on(t) for t in (x, y, dy, dx))
    a = _softmax(x, y, temperature, p)
    n = torch.isfinite(x).sum(dim=-1, keepdim=True)
    inner = (dy * y).sum(dim=-1, keepdim=True)
    inner_err = (dy.abs() * a + (dy * y).abs() * sum_error(n, p.compute)).sum(dim=-1, keepdim=True)
    bound = (a * ((dy - inner).abs() + inner_err) + y.abs() * inner_err) / temperature
    return to_numpy(SAFETY * bound + 2 * p.store * dx.abs() + p.floor * max(1.0, 1.0 / temperature))



def softmax_row_sum(x, y, temperature: float, p: Precision) -> np.ndarray:
    """Allowed deviation of each row sum of a softmax output y from 1, derived for the
    sum itself (not the sum of the elements' allowances).

    Any softmax that normalises by the sum of its own exponentials, y_i = e_i / S with
    e_i = exp(z_i - m) (1 + eta_i) and S = sum_j e_j (1 + sigma), once per row or
    online with rescaling, sums to sum_i e_i / S = 1 / (1 + sigma) exactly whatever the
    e_i are: the exponent errors, the rounding of z = x / T (every e_i sees the same
    rounded z) and the choice of m cancel. What is left:

    * sigma: the normaliser is a sum of n positive terms, ``sum_error(n)``; the online
      form rescales its partial sums by exp(m_old - m_new), a per-term relative error
      that the same sum model covers (each rescale is one more rounding on a partial sum).
    * a numerator that is recomputed (two-pass online softmax) or rescaled differently
      from its term in S: exp(z_i - m) against the term's exp(z_i - m_k) exp(m_k - m), the
      arguments rounded by u |z_i - m_k| + u |m_k - m| = u |z_i - m| (m_k between z_i and
      m) twice, plus EXP_ULPS u per exp; weighted by y_i in the sum:
      u (2 EXP_ULPS + 2 sum_i y_i |z_i - m|), and sum_i y_i (m - z_i) = H(y) - log S is
      at most log n, whatever the size of the logits.
    * the division e_i / S: u per element, u in the sum.
    * the store of each y_i in the output dtype: u_out |y_i|, below the output dtype's
      smallest normal its floor instead (absolute), summed over the row.
    * the check's own fp64 sum: n u64.

    ``y`` is the implementation's own output (its weights, clipped to [0, 1]), so the
    allowance needs no reference. -inf entries contribute exactly 0 and drop out of n.
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
