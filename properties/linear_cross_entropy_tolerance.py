"""Tolerance rules of fused linear cross-entropy: the loss and the gradients of x and weight.

Pieces and notation: :mod:`tritoncheck.tolerance`; the logsumexp pieces are the losses
family's (``properties/losses_tolerance.py``). Evaluated in float64 torch on the suite's
device; arguments NumPy arrays or tensors, results NumPy.

Every implementation forms the logits in fp32 whatever the input dtype (the kernel converts
its tiles to fp32, a plain-PyTorch one upcasts before the matmul): the input dtype's u
enters only where the gradients are stored in it (``p.store``). The loss is float32.
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck import backend
from tritoncheck.properties.losses_tolerance import _cross_entropy_parts, _lse_error
from tritoncheck.properties.losses_tolerance import cross_entropy as cross_entropy_rule
from tritoncheck.tolerance import DOT_READ_FLOOR, EXP_ULPS, SAFETY, Precision, float64_on, sum_error


def _targets(target, device) -> torch.Tensor:
    if isinstance(target, torch.Tensor):
        return target.detach().to(device=device, dtype=torch.int64)
    return torch.as_tensor(np.asarray(target).astype(np.int64), device=device)


def logit_error(x, weight, softcap: float, p: Precision):
    """The fp64 raw logits ``a = x @ weight.T``, the (softcapped) logits ``z`` and a bound
    ``e_z`` (SAFETY included) on the absolute error of each fp32 ``z`` an implementation
    forms: ``(a, z, e_z)``, each ``[N, V]``.

    * ``a``: a dot of length H of exact products (fp16/bf16 products are exact in fp32;
      fp32 ones round by ``p.dot``, u(fp32) for an "ieee" dot, tf32's for an undeclared one
      on a GPU), summed in fp32: ``(p.dot + sum_error(H)) sum_k |x_ik w_jk|``; an operand
      below fp32's smallest normal may be flushed: DOT_READ_FLOOR times the other operand.
    * softcap ``z = c tanh(a / c)``: ``a``'s error and the division's ``u |a|`` pass through
      tanh with its derivative at most ``g = 1 - tanh(max(0, |a| - e_a) / c)^2`` (the
      largest over the interval the computed ``a`` may lie in); tanh's own absolute error
      ``(2 EXP_ULPS + 7) u`` (``kernels.attention._tanh``; ``torch.tanh`` is within it)
      times ``c``; the product ``c t``: ``u |z|``, and once more for a fused multiply-add.
    """
    device = backend.device()
    x, weight = float64_on(x, device), float64_on(weight, device)
    u = p.compute
    a = x @ weight.T
    sums = x.abs() @ weight.abs().T
    reads = DOT_READ_FLOOR * (x.abs().sum(-1)[:, None] + weight.abs().sum(-1)[None, :])
    e_a = SAFETY * ((p.dot + sum_error(x.shape[-1], u)) * sums + reads)
    if softcap <= 0:
        return a, a, e_a
    z = softcap * torch.tanh(a / softcap)
    e_in = e_a + SAFETY * u * a.abs()
    g = 1.0 - torch.tanh((a.abs() - e_in).clamp(min=0.0) / softcap) ** 2
    e_z = g * e_in + SAFETY * u * (softcap * (2 * EXP_ULPS + 7) + 2 * z.abs())
    return a, z, e_z


def _lse_propagated(z: torch.Tensor, lse: torch.Tensor, e_z: torch.Tensor) -> torch.Tensor:
    """Exact bound on how far lse moves when each z_j moves by at most e_z_j:
    ``|lse(z + d) - lse(z)| <= log sum_j p_j exp(e_z_j)`` (p = softmax(z)), which is
    ``sum_j p_j e_z_j`` to first order and never more than ``max_j e_z_j``."""
    return torch.logsumexp(z - lse[:, None] + e_z, dim=-1)


def _row_allowance(z, e_z, target, ignore_index, rows, p: Precision):
    """Per-row loss allowance, the per-row lse error bound (SAFETY included) and the CE parts."""
    parts = _cross_entropy_parts(z)
    lse = parts[3]
    ignored = target == ignore_index
    safe = torch.where(ignored, 0, target)
    e_t = e_z.gather(1, safe[:, None])[:, 0]
    e_lse = _lse_error(parts, p) + _lse_propagated(z, lse, e_z)
    allowed = torch.from_numpy(cross_entropy_rule(z, target, ignore_index, rows, p)).to(z.device)
    allowed = allowed + torch.where(ignored, 0.0, _lse_propagated(z, lse, e_z) + e_t)
    return allowed, e_lse, parts


def linear_cross_entropy(x, weight, target, ignore_index: int, softcap: float, reduction: str, loss,
                         p: Precision) -> np.ndarray:
    """Allowed absolute error of the loss (float32).

    Per row: the losses family's cross-entropy rule on the exact logits (an fp32 online
    logsumexp over V, the subtraction of the target's logit, ``F.cross_entropy``'s
    log_softmax form), plus the logits' own error (:func:`logit_error`) carried through:
    lse by :func:`_lse_propagated`, the target's logit by its ``e_z``. Ignored rows: 0.

    ``"sum"``: the rows' allowances plus the fp32 sum of the rows, ``sum_error(N)
    sum |row|`` (every row >= 0); ``"mean"``: that over the count, plus the division's
    ``u |loss|``. Every row ignored under ``"mean"``: the loss is NaN, compared as NaN
    (allowance 0).
    """
    device = backend.device()
    _, z, e_z = logit_error(x, weight, softcap, p)
    target = _targets(target, device)
    rows_exact = _exact_rows(z, target, ignore_index)
    allowed, _, _ = _row_allowance(z, e_z, target, ignore_index, rows_exact, p)
    if reduction == "none":
        return allowed.cpu().numpy()
    u = p.compute
    total = allowed.sum() + SAFETY * sum_error(target.shape[0], u) * rows_exact.abs().sum()
    if reduction == "sum":
        return total.cpu().numpy()
    count = int((target != ignore_index).sum())
    if count == 0:
        return np.zeros(())
    mean = abs(float(np.asarray(loss)))
    return (total / count + SAFETY * u * mean).cpu().numpy()


def _exact_rows(z: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    ignored = target == ignore_index
    picked = z.gather(1, torch.where(ignored, 0, target)[:, None])[:, 0]
    return torch.where(ignored, 0.0, torch.logsumexp(z, dim=-1) - picked)


def _upstream_per_row(dloss, target, ignore_index: int, reduction: str, n: int, device):
    """(dl, its relative rounding): dloss per row; the scalar for "sum"; dloss / count for
    "mean" (rounded once in fp32: u)."""
    d = float64_on(dloss, device)
    if reduction == "none":
        return d, 0.0
    count = int((target != ignore_index).sum())
    if reduction == "sum":
        return d.reshape(()).expand(n), 0.0
    return (d.reshape(()) / max(count, 1)).expand(n), 1.0


def linear_cross_entropy_grad(x, weight, target, ignore_index: int, softcap: float, reduction: str, dloss,
                              dx, dweight, p: Precision) -> dict[str, np.ndarray]:
    """Allowed absolute errors of dx and dweight.

    With ``q = p - onehot`` (p = softmax(z)), ``s = 1 - tanh^2(a / c)`` (1 without softcap)
    and ``g = dl q s``: ``dx = g @ weight``, ``dweight = g^T @ x``.

    * p = exp(z - lse) from an fp32 lse: the exponent errs by lse's error (the losses
      rule's fp32 logsumexp, plus the logits' errors carried through, as in the loss),
      the logit's own ``e_z``, and ``u (2 |z - lse| + EXP_ULPS)`` for forming and
      exponentiating the difference; an exponent error E moves p by at most
      ``min(1, p e^E) (1 - e^-E)`` (as the cross-entropy gradient rule).
    * s from the computed ``t = z / c``, off by ``e_z / c``: ``(2 |t| + e_z / c) e_z / c``,
      plus ``2 u`` for ``1 - t t``.
    * g's products (dl q, times s) and "mean"'s ``dloss / count``: ``3 u |g|``.
    * each gradient is a dot over V (dx) or N (dweight) in fp32: the error of g times the
      other operand's magnitudes, ``(p.dot + sum_error(len)) |g| . |other|``, operands below
      fp32's smallest normal flushed (DOT_READ_FLOOR); stored in the input dtype
      (``p.store |grad|`` and ``p.floor``).

    SAFETY on the computed bounds; ignored rows of g are exactly 0 and carry no error.
    """
    device = backend.device()
    u = p.compute
    a, z, e_z = logit_error(x, weight, softcap, p)
    x64, w64 = float64_on(x, device), float64_on(weight, device)
    target = _targets(target, device)
    n, v = z.shape
    ignored = target == ignore_index
    rows_exact = _exact_rows(z, target, ignore_index)
    _, e_lse, parts = _row_allowance(z, e_z, target, ignore_index, rows_exact, p)
    lse = parts[3]
    arg = z - lse[:, None]
    e = e_lse[:, None] + e_z + SAFETY * u * (2 * arg.abs() + EXP_ULPS)
    p_err = torch.clamp(torch.exp(arg + e), max=1.0) * -torch.expm1(-e)
    cols = torch.arange(v, device=device)
    onehot = ((cols[None, :] == target[:, None]) & ~ignored[:, None]).to(torch.float64)
    q = torch.exp(arg) - onehot
    if softcap > 0:
        t = torch.tanh(a / softcap)
        s = 1.0 - t * t
        dt = e_z / softcap
        e_s = (2 * t.abs() + dt) * dt + SAFETY * 2 * u
    else:
        s, e_s = torch.ones_like(z), torch.zeros_like(z)
    dl, dl_rel = _upstream_per_row(dloss, target, ignore_index, reduction, n, device)
    adl = dl.abs()[:, None]
    g = (adl * q * s).abs()
    e_g = adl * (p_err * s + q.abs() * e_s) + SAFETY * (3 + dl_rel) * u * g
    live = ~ignored[:, None]
    e_g, g = torch.where(live, e_g, 0.0), torch.where(live, g, 0.0)
    aw, ax = w64.abs(), x64.abs()
    dx_bound = (e_g @ aw + SAFETY * ((p.dot + sum_error(v, u)) * (g @ aw)
                                     + DOT_READ_FLOOR * (aw.sum(0)[None, :] + g.sum(-1)[:, None])))
    dw_bound = (e_g.T @ ax + SAFETY * ((p.dot + sum_error(n, u)) * (g.T @ ax)
                                       + DOT_READ_FLOOR * (ax.sum(0)[None, :] + g.sum(0)[:, None])))
    dx, dweight = float64_on(dx, device), float64_on(dweight, device)
    return {"dx": (dx_bound + p.store * dx.abs() + p.floor).cpu().numpy(),
            "dweight": (dw_bound + p.store * dweight.abs() + p.floor).cpu().numpy()}

