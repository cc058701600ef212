"""Tolerance rules of the norms family: layer norm (and its gradients) and dropout + residual + layer norm.

Pieces and notation: :mod:`tritoncheck.tolerance`. Evaluated in float64 torch on the
suite's device; arguments NumPy arrays or tensors, results NumPy (the piece
:func:`layer_norm_xhat` returns tensors)."""
from __future__ import annotations

import math

import numpy as np
import torch

from tritoncheck.oracle import to_numpy
from tritoncheck.tolerance import EXP_ULPS, SAFETY, SUM_LAMBDA, Precision, float64_on, sum_error, unit_roundoff


def _layer_norm_stats(h: torch.Tensor, eps: float):
    """fp64 row statistics: n, mean, centred values, variance, rstd, x_hat."""
    n = h.shape[-1]
    mu = h.mean(dim=-1, keepdim=True)
    d = h - mu
    var = (d * d).mean(dim=-1, keepdim=True)
    r = 1.0 / torch.sqrt(var + eps)
    return n, mu, d, var, r, d * r


def layer_norm_xhat(h, eps: float, p: Precision, input_err=None):
    """Bounds on the normalised row x_hat = (h - mean) * rstd as an implementation
    computes it: ``(eta, eps_r, r, x_hat)``, eta the absolute error of each x_hat,
    eps_r the relative error of rstd (first order, before SAFETY).

    Derivation (u = u(fp32), the compute precision; n = row length; A = mean_j |h_j|):

    * mean: a sum of n terms of either sign, then a division: delta_mu <= (sum_error(n)
      + u) A. It enters every h_i - mean and becomes delta_mu rstd in x_hat, about
      sum_error(n) |mean| / std: normalisation's condition number |mean| / std times the
      mean's rounding, which any implementation that does not refine its mean pays
      (``F.layer_norm`` included).
    * h_i - mean rounds (u |h_i - mean|); ``h_i * rstd - mean * rstd`` (torch on CPU,
      with an FMA for fp16/bf16) rounds the two products instead: u (|h_i| + |mean|).
    * ``input_err`` (optional): an error already in h_i (plain-torch dropout forms h in
      the input dtype); it moves h_i and, through the mean, every element by its mean.
    * variance: the mean of n squared deviations, each off by 2u, plus sum_error(n); a
      wrong mean adds exactly delta_mu^2 (deviations from the true mean sum to zero); an
      input error e adds 2 mean(|d| e): dvar <= var (3u + sum_error(n)) + delta_mu^2 +
      2 mean(|d| (e + mean e)).
    * rstd = 1 / sqrt(var + eps): half the variance's relative error, damped by
      var / (var + eps) (eps is exact), plus the add, the sqrt and the division, or an
      approximate rsqrt on a GPU: (2 + EXP_ULPS) u.
    * a value near underflow may be flushed to zero (GPU FTZ; the interpreter misreads
      bf16 subnormals by less than the smallest normal): p.floor in h - mean, times rstd.
    * x_hat = (h - mean) * rstd: eta = rstd * (error of h - mean + p.floor) + |x_hat| (eps_r + u).
    """
    u = p.compute
    h = float64_on(h)
    n, mu, d, var, r, xhat = _layer_norm_stats(h, eps)
    e = torch.zeros_like(h) if input_err is None else float64_on(input_err)
    ebar = e.mean(dim=-1, keepdim=True)
    a_mean = h.abs().mean(dim=-1, keepdim=True)
    delta_mu = (float(sum_error(n, u)) + u) * a_mean
    centred = delta_mu + u * (d.abs() + h.abs() + mu.abs()) + e + ebar
    dvar = var * (3 * u + float(sum_error(n, u))) + delta_mu**2 + 2 * (d.abs() * (e + ebar)).mean(dim=-1, keepdim=True)
    eps_r = 0.5 * dvar * r * r + (2 + EXP_ULPS) * u
    eta = r * (centred + p.floor) + xhat.abs() * (eps_r + u)
    return eta, eps_r, r, xhat


def layer_norm(h, weight, bias, y, eps: float, p: Precision, input_err=None) -> np.ndarray:
    """Allowed absolute error of y = x_hat * weight + bias (layer norm over the last dim).

    The x_hat bound of :func:`layer_norm_xhat` times |weight|; the product and the add
    round (u (|x_hat w| + |y|)); SAFETY on all of it; the store costs u(out) |y|, and
    a result near underflow p.floor.
    """
    eta, _, _, xhat = layer_norm_xhat(h, eps, p, input_err)
    aw, ay = float64_on(weight).abs(), float64_on(y).abs()
    bound = aw * eta + p.compute * (xhat.abs() * aw + ay)
    return to_numpy(SAFETY * bound + p.store * ay + p.floor)


def layer_norm_grad(x, weight, dy, dx, dweight, dbias, eps: float, p: Precision) -> dict[str, np.ndarray]:
    """Allowed absolute errors of the layer-norm gradients, keys dx, dweight, dbias.

    With g = weight * dy, c1 = mean(g x_hat), c2 = mean(g) over each row::

        dx      = rstd (g - c2 - x_hat c1)
        dweight = sum over rows of dy x_hat
        dbias   = sum over rows of dy

    x_hat (from the saved or recomputed mean and rstd) carries eta and rstd eps_r
    (:func:`layer_norm_xhat`), plus, for statistics kept in the input dtype (torch on CPU
    for fp16/bf16), u(out) |mean| rstd in x_hat and u(out) in rstd (or the dtype's
    subnormal spacing for a statistic that small). g rounds (u |g|); c2 is a mean of n
    terms ((sum_error(n) + u) mean|g|); c1 errs by mean(|g| eta) + (sum_error(n) + 3u)
    mean|g x_hat|. T = g - c2 - x_hat c1 errs by u|g| + dc2 + eta |c1| + (|x_hat| + eta) dc1
    plus two roundings of each term (x_hat c1 as computed is (x_hat + e)(c1 + dc), off by
    e c1 + x_hat dc + e dc; the second-order e dc is kept because eta is not small where
    it matters), and dx = rstd T by rstd dT + (eps_r + u) |dx|. The expanded form
    ``a w dy + b x + c`` (torch on CPU) rounds u |b| (|x| + |mean|) = u rstd^2 |c1|
    (|x| + |mean|), inside rstd eta |c1|; for rows of std > ~1e12 its b underflows (fp32's
    subnormal spacing times |x| + |mean|). dweight: each row's term errs by
    |dy| (eta + u |x_hat|), the sum over M rows adds R sum|dy x_hat|; dbias: R sum|dy|.

    * The saved statistics' part of eta is one rounding per row. Over rows, their mean acts
      on every row alike (u(out) |sum dy x_hat| + u(out) |sum dy rstd mean|); the rest is
      a sum of independent errors, at most SUM_LAMBDA sqrt(sum_r t_r^2) or sum_r |t_r|, the smaller.
    * R, the relative error of the sum over rows: sum_error(M) for a kernel that keeps the
      contract (fp32 accumulation, one store). torch's CPU backward for fp16/bf16 keeps a
      running sum per thread in the input dtype, which stalls once its spacing exceeds
      twice the term: M u(dtype) sum|terms| (Higham eq. 4.4; stalling makes the errors
      lean one way, so no sqrt(M)), plus M p.floor for partial sums in the subnormals.
      The rule admits it (R = max(M u(dtype), sum_error(M, u(dtype)))) only while
      SAFETY R <= 1/2, up to 64 rows in bf16 and 512 in fp16; past that such a sum keeps
      no correct digit to check, and fp32 accumulation is required.

    SAFETY on each bound; the store costs u(out) |result|; p.floor (dx: also a flushed
    w dy, times rstd).
    """
    u = p.compute
    x, weight, dy, dx, dweight, dbias = (float64_on(t) for t in (x, weight, dy, dx, dweight, dbias))
    eta, eps_r, r, xhat = layer_norm_xhat(x, eps, p)
    # Statistics held in the input dtype: mean off by u(out) |mean|, rstd by u(out), or,
    # below the smallest normal (fp16 rstd of a row with std > 1.6e4), by the spacing `sub`.
    mu = x.mean(dim=-1, keepdim=True)
    sub = float(torch.finfo(p.dtype).tiny) * float(torch.finfo(p.dtype).eps)
    eta = eta + sub * (r + xhat.abs() / r)
    saved = p.store * (r * mu.abs() + xhat.abs())  # from statistics saved in the input dtype
    eta_fp32, eta = eta, eta + saved
    eps_r = eps_r + p.store + sub / r
    n = x.shape[-1]
    g = weight * dy
    ag = g.abs()
    c1 = (g * xhat).mean(dim=-1, keepdim=True)
    c2 = g.mean(dim=-1, keepdim=True)
    e_n = float(sum_error(n, u))
    dc2 = (e_n + 2 * u) * ag.mean(dim=-1, keepdim=True)
    dc1 = (ag * eta).mean(dim=-1, keepdim=True) + (e_n + 3 * u) * (g * xhat).abs().mean(dim=-1, keepdim=True)
    t = g - c2 - xhat * c1
    # eta dc1 is second order but kept: on a constant row (x_hat = 0, c1 = 0) the first-order
    # terms vanish, while an fp32 mean one ulp off (a division by n not correctly rounded:
    # Liger-Kernel, PyTorch's CUDA layer norm) makes x_hat = O(eta) and dx = -rstd x_hat^2 g.
    dt = u * ag + dc2 + eta * c1.abs() + (xhat.abs() + eta) * dc1 + 2 * u * (ag + c2.abs() + (xhat * c1).abs())
    # The expanded form's b ~ rstd^3 sum(w dy x) / N is an fp32 subnormal for std > ~1e12:
    # off by the subnormal spacing, times x (and mean, in c).
    sub32 = float(torch.finfo(torch.float32).tiny) * float(torch.finfo(torch.float32).eps)
    dx_bound = r * dt + (eps_r + u) * r * t.abs() + sub32 * (x.abs() + mu.abs())
    rows = math.prod(x.shape[:-1])
    flat = lambda a: a.expand(x.shape).reshape(rows, n)  # noqa: E731
    ady = flat(dy).abs()
    # The sums over rows: in fp32, or in the input dtype while that stays checkable (docstring).
    u_in = unit_roundoff(p.dtype)
    in_dtype = max(rows * u_in, float(sum_error(rows, u_in)))
    admitted = u_in > u and SAFETY * in_dtype <= 0.5
    r_rows = in_dtype if admitted else sum_error(rows, u)
    # near underflow: every partial sum rounds in the dtype's subnormals (input-dtype sums),
    # or fp32 partials flush (FTZ) and the store rounds once
    rows_floor = rows * p.floor if admitted else p.floor + rows * float(torch.finfo(torch.float32).tiny)
    # the saved statistics' per-row roundings over rows (docstring)
    t_saved = ady * flat(saved)
    saved_rows = (torch.minimum(t_saved.sum(0), SUM_LAMBDA * torch.sqrt((t_saved**2).sum(0)))
                  + p.store * (flat(dy * xhat).sum(0).abs() + flat(dy * r * mu).sum(0).abs()))
    dw_bound = ((ady * (flat(eta_fp32) + u * flat(xhat).abs())).sum(0) + saved_rows
                + r_rows * flat(dy * xhat).abs().sum(0))
    db_bound = r_rows * ady.sum(0)
    return {
        "dx": to_numpy(SAFETY * dx_bound + p.store * dx.abs() + p.floor * (1 + r * weight.abs())),
        "dweight": to_numpy(SAFETY * dw_bound + p.store * dweight.abs() + rows_floor),
        "dbias": to_numpy(SAFETY * db_bound + p.store * dbias.abs() + rows_floor),
    }


def dropout_input_error(x, residual, keep, p_drop: float, p: Precision) -> torch.Tensor:
    """Error bound of h = where(keep, x / (1 - p_drop), 0) + residual before the
    normalisation (the contract does not say where h rounds): plain torch rounds
    x / (1 - p) and the sum in the input dtype (u(dtype) (|x / (1-p)| + |h|)); a fused
    kernel rounds 1 / (1 - p), the product and the sum in fp32 (2 u(fp32) |x / (1-p)| +
    u(fp32) |h|). The larger of each term covers both.
    """
    u_in = unit_roundoff(p.dtype)
    x, residual = float64_on(x), float64_on(residual)
    keep = torch.as_tensor(keep, device=x.device).to(torch.bool)
    scaled = torch.where(keep, x.abs() / (1.0 - p_drop), 0.0)
    h = torch.where(keep, x / (1.0 - p_drop), 0.0) + residual
    return (u_in + 2 * p.compute) * scaled + max(u_in, p.compute) * h.abs()
