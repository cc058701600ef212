"""Tolerance rules of the RMSNorm family: rms_norm and add_rms_norm, forward and gradients.

Pieces and notation: :mod:`tritoncheck.tolerance`. Evaluated in float64 torch on the
suite's device; arguments NumPy arrays or tensors, results NumPy (the piece
:func:`rms_norm_xhat` returns tensors).

The declared cast (``p.declared_value("rms_norm_cast")``) decides one term of each rule, an exact rounding
added outside SAFETY as the store is:

* ``"after_weight"``: ``x * rstd * weight`` in fp32, rounded once to the input dtype: the
  store's ``u(out) |y|`` only.
* ``"before_weight"`` (Llama / Hugging Face): ``t = x_hat`` rounded to the input dtype,
  then ``t * weight`` rounded there (the store): ``(u(out) |x_hat| + p.floor) |weight|``
  beyond the store in y. Autograd multiplies the same ``t`` by ``dy`` for dweight (in the
  dtype) and forms ``g = weight * dy`` in the dtype: ``u(out) |g|`` for ``u(fp32) |g|``.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tritoncheck.oracle import to_numpy
from tritoncheck.tolerance import EXP_ULPS, SAFETY, U32, Precision, float64_on, sum_error

TINY32 = float(torch.finfo(torch.float32).tiny)
SUB32 = TINY32 * float(torch.finfo(torch.float32).eps)  # fp32's subnormal spacing


def _cast_unit(p: Precision) -> tuple[float, float]:
    """(relative, absolute) rounding of the normalised row and of the products with it
    (g = w dy, dy t): the input dtype's u and p.floor for ``"before_weight"``, else fp32's
    u and 0 (fp32's underflow is in every rule's p.floor)."""
    return (p.store, p.floor) if p.declared_value("rms_norm_cast", "after_weight") == "before_weight" \
        else (p.compute, 0.0)


def input_error(h, p: Precision) -> torch.Tensor:
    """Error of ``h = x + residual``, the exact sum rounded once to the input dtype (the
    contract's ``h``, which the normalisation reads): p.store |h| + p.floor."""
    h = float64_on(h)
    return p.store * h.abs() + p.floor


def rms_norm_xhat(h, eps: float, p: Precision, input_err=None):
    """Bounds on the normalised row x_hat = h * rstd as an implementation computes it:
    ``(eta, eps_r, r, x_hat)``, eta the absolute error of each x_hat, eps_r the relative
    error of rstd (first order, before SAFETY).

    Derivation (u = u(fp32), the compute precision; n = row length; ms = mean(h^2)):

    * ms: n squares (u each), summed (sum_error(n), same sign: no cancellation, so RMSNorm
      is well conditioned on every row), divided by n (u): sum_error(n) + 2u relative. A
      square below fp32's smallest normal may be flushed: TINY32 in the mean. An input
      error e_i (``input_err``: h formed in the input dtype) moves ms by 2 mean(|h| e).
    * rstd = 1 / sqrt(ms + eps): half ms's error relative to ms + eps (eps is exact), plus
      the add, the sqrt and the division, or an approximate rsqrt: (2 + EXP_ULPS) u.
    * an input below fp32's smallest normal may be flushed (GPU FTZ; the interpreter
      misreads bf16 subnormals by less than that): p.floor in h, times rstd.
    * x_hat = h * rstd: eta = rstd (e + p.floor) + |x_hat| (eps_r + u).
    """
    u = p.compute
    h = float64_on(h)
    n = h.shape[-1]
    e = torch.zeros_like(h) if input_err is None else float64_on(input_err)
    ms = (h * h).mean(dim=-1, keepdim=True)
    r = 1.0 / torch.sqrt(ms + eps)
    xhat = h * r
    dms = ms * (float(sum_error(n, u)) + 2 * u) + TINY32 + 2 * (h.abs() * e).mean(dim=-1, keepdim=True)
    eps_r = 0.5 * dms * r * r + (2 + EXP_ULPS) * u
    eta = r * (e + p.floor) + xhat.abs() * (eps_r + u)
    return eta, eps_r, r, xhat


def rms_norm(h, weight, y, eps: float, p: Precision, input_err=None) -> np.ndarray:
    """Allowed absolute error of y = x_hat * weight.

    |weight| times the x_hat bound (:func:`rms_norm_xhat`) plus the product's rounding
    u |x_hat w|, under SAFETY; then the exact roundings: the store u(out) |y|, p.floor,
    and for ``"before_weight"`` (u(out) |x_hat| + p.floor) |w| (module docstring).
    """
    eta, _, _, xhat = rms_norm_xhat(h, eps, p, input_err)
    aw, ay = float64_on(weight).abs(), float64_on(y).abs()
    bound = aw * eta + p.compute * xhat.abs() * aw
    cast = (p.store * xhat.abs() + p.floor) * aw if p.declared_value("rms_norm_cast", "after_weight") == "before_weight" else 0.0
    return to_numpy(SAFETY * bound + p.store * ay + cast + p.floor)


def rms_norm_grad(h, weight, dy, dx, dweight, eps: float, p: Precision, input_err=None,
                  dh=None) -> dict[str, np.ndarray]:
    """Allowed absolute errors of the RMSNorm gradients, keys dx and dweight.

    With g = weight * dy and c1 = mean(g x_hat) over each row::

        dx      = rstd (g - x_hat c1)        (+ dh: add_rms_norm's gradient through h)
        dweight = sum over rows of dy x_hat

    x_hat carries eta and rstd eps_r (:func:`rms_norm_xhat`; add_rms_norm's with h's input
    error: the gradient is taken at the rounded h the forward normalised). g rounds
    (u_c |g| + f_c, the cast's units, :func:`_cast_unit`; f_c matters: w dy = 1e-4 is
    subnormal in fp16, and rstd = 1e3 magnifies it); c1, a mean of n products, errs by
    mean(|g| eta) + (sum_error(n) + 3u) mean(|g x_hat|) + mean(|x_hat| (u_c |g| + f_c)).
    T = g - x_hat c1 errs by u_c |g| + f_c + eta |c1| + (|x_hat| + eta) dc1 (second-order
    eta dc1 kept, as in layer norm's rule) plus two roundings of each term, and
    dx = rstd T by rstd dT + (eps_r + u) |rstd T|, plus the expanded form's rstd^3
    underflow (see the code). Adding dh rounds in fp32: u (|rstd T| + |dh|); an unfused
    implementation first rounds the gradient through the normalisation to the input
    dtype: u(out) |rstd T| + p.floor more, outside SAFETY.

    dweight: each row's dy x_hat errs by |dy| (eta + u_c |x_hat| + f_c) (x_hat rounded for
    ``"before_weight"``) plus the product's u_c |dy x_hat| + f_c; the fp32 sum over M rows
    adds sum_error(M) sum |dy x_hat|; near underflow M p.floor.

    SAFETY on each bound; the store costs u(out) |result|; p.floor (dx: also a flushed
    w dy, times rstd).
    """
    u = p.compute
    u_c, f_c = _cast_unit(p)
    h, weight, dy, dx, dweight = (float64_on(t) for t in (h, weight, dy, dx, dweight))
    eta, eps_r, r, xhat = rms_norm_xhat(h, eps, p, input_err)
    n = h.shape[-1]
    g = weight * dy
    ag = g.abs()
    gx = (g * xhat).abs().mean(dim=-1, keepdim=True)
    c1 = (g * xhat).mean(dim=-1, keepdim=True)
    dc1 = ((ag * eta + xhat.abs() * f_c).mean(dim=-1, keepdim=True)
           + (float(sum_error(n, u)) + 3 * u + u_c) * gx)
    t = g - xhat * c1
    dt = u_c * ag + f_c + eta * c1.abs() + (xhat.abs() + eta) * dc1 + 2 * u * (ag + (xhat * c1).abs())
    # Autograd through torch.rsqrt expands dx = rstd g - x rstd^3 mean(g x); rstd^3 and
    # -0.5 rstd^3 sum(g x) underflow for mean(x^2) past ~1e30 (in the domain): each off by
    # up to SUB32, times |x| mean|g x| = |x_hat| |c1| / rstd^2 and 2 |x| / N.
    dx_bound = (r * dt + (eps_r + u) * r * t.abs()
                + SUB32 * xhat.abs() * (c1.abs() / (r * r) + 2 / (n * r)))
    through_h = 0.0
    if dh is not None:
        dx_bound = dx_bound + u * ((r * t).abs() + float64_on(dh).abs())
        through_h = p.store * (r * t).abs() + p.floor
    rows = math.prod(h.shape[:-1])
    flat = lambda a: a.expand(h.shape).reshape(rows, n)  # noqa: E731
    ady, axhat = flat(dy).abs(), flat(xhat).abs()
    terms = (ady * axhat).sum(0)
    dw_bound = ((ady * (flat(eta) + u_c * axhat + f_c)).sum(0) + (u_c + float(sum_error(rows, U32))) * terms
                + rows * f_c)
    return {
        "dx": to_numpy(SAFETY * dx_bound + p.store * dx.abs() + through_h + p.floor * (1 + r * weight.abs())),
        "dweight": to_numpy(SAFETY * dw_bound + p.store * dweight.abs() + rows * p.floor),
    }
