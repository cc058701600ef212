"""Tolerance rules of the norms family: layer norm (and its gradients) and dropout + residual + layer norm.

The pieces (unit roundoff, sum bounds, floors, SAFETY and the other constants with
their sources) are in :mod:`tritoncheck.tolerance`. The rules are evaluated in float64
torch on the suite's device (the GPU when there is one); arguments may be NumPy arrays
or tensors, results are NumPy (:func:`layer_norm_xhat`, a piece, returns tensors)."""
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

    * mean: a sum of n terms of either sign, then a division: its error is
      delta_mu <= (sum_error(n) + u) * A. This is the term that makes normalisation
      ill-conditioned: an error in the mean is an error in every h_i - mean, and
      becomes delta_mu * rstd in x_hat, i.e. about sum_error(n) * |mean| / std:
      the condition number |mean| / std of normalisation times the rounding of the
      mean. Rows with a large common offset (mean 1e4, std 1) lose that many digits
      in any correct implementation that does not refine its mean (torch's
      ``F.layer_norm`` included).
    * h_i - mean rounds (u |h_i - mean|); implementations that evaluate
      ``h_i * rstd - mean * rstd`` (torch on CPU, with a fused multiply-add for
      fp16/bf16) round the two products instead: u (|h_i| + |mean|) in units of h.
    * ``input_err`` (optional) bounds an error already in h_i (the dropout op forms
      h in the input dtype when written in plain torch); it moves h_i and, through the
      mean, every element by mean(input_err).
    * variance: the mean of n squared deviations, each off by 2u relative plus the
      sum's sum_error(n); a wrong mean adds exactly delta_mu^2 (the deviations from
      the true mean sum to zero); an input error e adds 2 mean(|d| e). So
      dvar <= var (3u + sum_error(n)) + delta_mu^2 + 2 mean(|d| (e + mean e)).
    * rstd = 1 / sqrt(var + eps): half the variance's relative error, damped by
      var / (var + eps) (eps is exact), plus the rounding of the add, the sqrt and the
      division, or of an approximate rsqrt on a GPU: (2 + EXP_ULPS) u.
    * an input or a centred value near underflow may be flushed to zero (FTZ on GPUs;
      the Triton interpreter also mis-converts bf16 subnormals, by less than the
      smallest normal number): an absolute p.floor in h - mean, which rstd (up to
      1/sqrt(eps)) magnifies.
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

    x_hat (recomputed from the saved or recomputed mean and rstd) carries eta and rstd
    eps_r (:func:`layer_norm_xhat`), plus the rounding of the saved statistics when an
    implementation keeps them in the input dtype (torch on CPU does for fp16/bf16):
    u(out) |mean| rstd in x_hat and u(out) in rstd (or the dtype's subnormal spacing,
    where a statistic is that small). g rounds (u |g|); c2 is a mean of n terms
    ((sum_error(n) + u) mean|g|); c1 errs by mean(|g| eta) plus its own sum
    ((sum_error(n) + 3u) mean|g x_hat|). T = g - c2 - x_hat c1 then errs by
    u|g| + dc2 + eta |c1| + (|x_hat| + eta) dc1 plus two roundings of each of its terms
    (the product x_hat c1 as computed is (x_hat + e)(c1 + dc), off by e c1 + x_hat dc + e dc:
    the last, second-order, term is kept because eta is not small where it matters), and
    dx = rstd T by rstd dT + (eps_r + u) |dx|. Implementations that expand dx as
    ``a w dy + b x + c`` (torch on CPU) cancel b x against c on offset rows; their
    rounding u |b| (|x| + |mean|) is u rstd^2 |c1| (|x| + |mean|), inside
    rstd eta |c1|; for rows of std > ~1e12 their b underflows into fp32 subnormals (an
    absolute error of the fp32 subnormal spacing, times |x| + |mean|).
    dweight: each row's term errs by |dy| (eta + u |x_hat|), and the sum over the M
    rows adds R sum|dy x_hat|; dbias: R sum|dy|, R the relative error of a sum over rows.

    * The part of eta that comes from statistics saved in the input dtype is one
      rounding per row. Summed over rows, the mean of those roundings acts on every row
      alike (u(out) |sum dy x_hat| + u(out) |sum dy rstd mean|) and the rest is a sum of
      independent errors, at most SUM_LAMBDA sqrt(sum_r t_r^2) as in sum_error (or
      sum_r |t_r|, whichever is smaller).
    * R: a kernel that keeps the contract accumulates the rows in fp32 and stores once:
      R = sum_error(M). torch's CPU backward for fp16/bf16 instead keeps one running sum
      per thread in the input dtype (a bf16 dbias of 3 rows was seen 3.5 ulp off; 300
      rows of dy = 1 give 256, 20000 give 263: a running sum stalls once its spacing
      exceeds twice the term). A running sum of M terms rounded to the dtype errs by up
      to M u(dtype) sum|terms| (Higham eq. 4.4, first order; stalling makes the errors
      lean one way, so no sqrt(M)), and each of its partial sums may round in the
      dtype's subnormal range (M p.floor). The rule admits that accumulation (R the
      larger of M u(dtype) and sum_error(M, u(dtype))) only while SAFETY R <= 1/2, i.e.
      up to 64 rows in bf16 and 512 in fp16; past that an input-dtype accumulation
      keeps no correct digit a check could hold it to, and every implementation is held
      to fp32 accumulation.

    SAFETY on each bound; the store costs u(out) |result|; p.floor (dx: also a flushed
    w dy, times rstd).

    Why the old rule was wrong: it took R = sum_error(M, u(dtype)) at any M, a bound that
    reaches sum|dy| (SAFETY included) from about 560 rows on in bf16, where a zero
    dweight or dbias passed; the sqrt(M) part of it does not even hold for a running
    sum that stalls. And it summed the saved statistics' per-row roundings as worst
    cases, sum_r |t_r|, which grows as M where a random-sign dweight grows as sqrt(M):
    that too reached |dweight| at a few hundred bf16 rows.
    """
    u = p.compute
    x, weight, dy, dx, dweight, dbias = (float64_on(t) for t in (x, weight, dy, dx, dweight, dbias))
    eta, eps_r, r, xhat = layer_norm_xhat(x, eps, p)
    # The saved statistics may be held in the input dtype (torch's CPU kernel returns
    # and reuses mean and rstd in fp16/bf16): mean off by u(out) |mean|, rstd by u(out).
    # A statistic below the dtype's smallest normal number (fp16 rstd of a row with
    # std > 1.6e4) rounds to the subnormal spacing instead: an absolute error `sub`.
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
    # Why the old rule was wrong: it had |x_hat| dc1 without eta dc1, first order in the
    # x_hat error, and left the second-order term to SAFETY. On a constant row (x_hat = 0,
    # c1 = 0: layer norm's singular point, e.g. a bf16 offset row whose spread rounded away)
    # the first-order terms vanish, while an fp32 mean one ulp off (a division by n that is
    # not correctly rounded: Liger-Kernel and PyTorch's CUDA layer norm, seen on an H100)
    # makes every x_hat -0.019 at mean 1000 and dx = -rstd x_hat^2 g = -0.118 g: the rule
    # allowed 0.0043 against 0.44 (docs/third-party/liger.md, finding 8).
    dt = u * ag + dc2 + eta * c1.abs() + (xhat.abs() + eta) * dc1 + 2 * u * (ag + c2.abs() + (xhat * c1).abs())
    # The expanded form's coefficient b ~ rstd^3 sum(w dy x) / N underflows into fp32
    # subnormals for rows of std > ~1e12 (rstd^3 < 1e-38): an absolute error of the
    # fp32 subnormal spacing in b, which multiplies x (and mean, in c).
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
    # near underflow: every partial sum rounds in the dtype's subnormals (input-dtype
    # sums), or fp32 partials flush below fp32's smallest normal (FTZ) and the store rounds once
    rows_floor = rows * p.floor if admitted else p.floor + rows * float(torch.finfo(torch.float32).tiny)
    # The saved statistics' roundings, one per row, summed over rows: their mean acts on
    # every row alike (p.store |sum dy x_hat| + p.store |sum dy rstd mean|); what is left
    # is a sum of independent errors, at most SUM_LAMBDA sqrt(sum t^2) (as sum_error).
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
    """Error bound of h = where(keep, x / (1 - p_drop), 0) + residual as formed before
    the normalisation: the contract does not say where h rounds, and the plain torch
    form rounds x / (1 - p) and the sum in the input dtype (u(dtype) (|x / (1-p)| + |h|));
    a fused kernel rounds 1 / (1 - p) to fp32 and the product and sum in fp32
    (2 u(fp32) |x / (1-p)| + u(fp32) |h|). Both are covered by the larger of each term.
    """
    u_in = unit_roundoff(p.dtype)
    x, residual = float64_on(x), float64_on(residual)
    keep = torch.as_tensor(keep, device=x.device).to(torch.bool)
    scaled = torch.where(keep, x.abs() / (1.0 - p_drop), 0.0)
    h = torch.where(keep, x / (1.0 - p_drop), 0.0) + residual
    return (u_in + 2 * p.compute) * scaled + max(u_in, p.compute) * h.abs()
