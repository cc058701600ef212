"""Tolerance rules of the losses family: cross-entropy loss and its gradient.

Pieces and notation: :mod:`tritoncheck.tolerance`. Evaluated in float64 torch on the
suite's device; arguments NumPy arrays or tensors, results NumPy."""
from __future__ import annotations

import math

import numpy as np
import torch

from tritoncheck import backend
from tritoncheck.tolerance import EXP_ULPS, SAFETY, Precision, float64_on, sum_error


def _targets(target, device) -> torch.Tensor:
    if isinstance(target, torch.Tensor):
        return target.detach().to(device=device, dtype=torch.int64)
    return torch.as_tensor(np.asarray(target).astype(np.int64), device=device)


def _cross_entropy_parts(logits: torch.Tensor):
    """Per row of logits [M, V] (fp64): finite mask, max m over the finite entries (0 if
    none), log S with S = sum_j exp(z_j - m), lse, the count n of finite entries, and
    spread = sum_j w_j |z_j - m| (softmax weights w_j; at most log n + 1)."""
    finite = torch.isfinite(logits)
    m = torch.where(finite, logits, -math.inf).amax(dim=-1)
    m = torch.where(torch.isfinite(m), m, 0.0)
    d = torch.where(finite, logits - m[:, None], -math.inf)
    e = torch.exp(d)
    s = e.sum(dim=-1)
    live = s > 0
    log_s = torch.log(torch.where(live, s, 1.0))
    w = e / torch.where(live, s, 1.0)[:, None]
    spread = torch.where(finite, w * torch.where(finite, d, 0.0).abs(), 0.0).sum(dim=-1)
    return finite, m, log_s, m + log_s, finite.sum(dim=-1), spread


def cross_entropy_lse_error(logits: np.ndarray, p: Precision) -> np.ndarray:
    """Bound on the absolute error of an fp32 logsumexp of each row of ``logits``.

    lse = m + log S, S = sum_j exp(z_j - m), in fp32 whatever the input dtype (kernels and
    the control upcast first). As errors in lse (r relative in S is r in log S):

    * z_j - m rounds (u |z_j - m|), exp adds EXP_ULPS u plus u |z_j - m| (log2(e)
      scaling); weighted by w_j in S: 2 u sum_j w_j |z_j - m| + EXP_ULPS u.
    * The sum of n positive terms: sum_error(n). An online (blocked, split) logsumexp
      rescales partial sums by exp(m_old - m_new), (EXP_ULPS + 1) u a step instead of an
      addition's u, at most as many steps per term as sum_error(n) counts:
      (EXP_ULPS + 2) sum_error(n).
    * log S: EXP_ULPS u (log S + 1) (the 1: GPU lg2.approx's absolute error near S = 1);
      m + log S rounds: u |lse|; forming z_j - m and adding m back (log_softmax): u |m|.
    """
    return _lse_error(_cross_entropy_parts(float64_on(logits)), p).cpu().numpy()


def _lse_error(parts, p: Precision) -> torch.Tensor:
    _, m, log_s, lse, n, spread = parts
    u = p.compute
    return SAFETY * (u * (2 * spread + EXP_ULPS + (EXP_ULPS + 1) * (log_s + 1) + m.abs() + lse.abs())
                     + (EXP_ULPS + 2) * sum_error(n, u))


def cross_entropy(logits: np.ndarray, target: np.ndarray, ignore_index: int, loss: np.ndarray,
                  p: Precision) -> np.ndarray:
    """Allowed absolute error of each loss[i] = lse[i] - logits[i, target[i]] (float32).

    The lse error (:func:`cross_entropy_lse_error`), the subtraction in fp32 (u |loss|),
    and u (|x_t| + |m|) for ``F.cross_entropy``'s log_softmax form (x_t - m) - log S. The
    loss is stored in float32, so the input dtype's u never enters. Ignored rows: exactly
    0 (allowance 0). A target on a -inf logit gives +inf (compared exactly).
    """
    device = backend.device()
    logits, target, loss = float64_on(logits, device), _targets(target, device), float64_on(loss, device)
    parts = _cross_entropy_parts(logits)
    m = parts[1]
    ignored = target == ignore_index
    x_t = logits.gather(1, torch.where(ignored, 0, target)[:, None])[:, 0]
    x_t = torch.where(torch.isfinite(x_t), x_t, 0.0)
    lf = torch.where(torch.isfinite(loss), loss, 0.0)
    u = p.compute
    allowed = (_lse_error(parts, p) + SAFETY * u * (x_t.abs() + m.abs() + lf.abs())
               + float(torch.finfo(torch.float32).tiny))
    return torch.where(ignored, 0.0, allowed).cpu().numpy()


def cross_entropy_grad(logits: np.ndarray, target: np.ndarray, ignore_index: int, dloss: np.ndarray,
                       dlogits: np.ndarray, p: Precision) -> np.ndarray:
    """Allowed absolute error of dlogits[i, j] = dloss[i] (p_ij - [j == target[i]]).

    p_ij = exp(z_j - lse) from an fp32 lse (saved, or the log_softmax output): the
    exponent errs by the lse error plus u (2 |z_j - lse| + EXP_ULPS). As for softmax, an
    exponent error E moves p by at most min(1, p e^E) (1 - e^-E): p E for small E, up to
    all of [0, 1] otherwise (logits where u |lse| > 1 leave no correct digit). Then
    p - onehot rounds (u |g|), the product with dloss (u |dx|), the store in the logits'
    dtype (store |dx| + floor). Ignored rows: exactly 0.

    Two more roundings in the logits' dtype, of correct strategies: fused kernels
    (Liger-Kernel's) keep g = p - onehot from the forward in that dtype and scale it by
    dloss (store |g| and a floor, times dl); PyTorch's path (``F.cross_entropy`` on fp16
    or bf16) keeps log p = (z - m) - log s there, log s itself rounded to it on CPU: two
    roundings of |z - lse|, 2 store |z - lse| in the exponent (2 store |log p| relative
    for small p).
    """
    device = backend.device()
    logits, target = float64_on(logits, device), _targets(target, device)
    parts = _cross_entropy_parts(logits)
    finite, lse = parts[0], parts[3]
    ignored = target == ignore_index
    # elementwise, not an index assignment (CUDA's deterministic index_put_ can misplace
    # rows: docs/third-party/torch.md)
    cols = torch.arange(logits.shape[-1], device=device)
    onehot = ((cols[None, :] == target[:, None]) & ~ignored[:, None]).to(torch.float64)
    u = p.compute
    arg = torch.where(finite, logits - lse[:, None], -math.inf)
    a_arg = torch.where(finite, arg, 0.0).abs()
    e = (_lse_error(parts, p)[:, None] + SAFETY * u * (2 * a_arg + EXP_ULPS)
         + 2 * p.store * a_arg)  # log p kept in the logits' dtype
    p_err = torch.clamp(torch.exp(arg + e), max=1.0) * -torch.expm1(-e)
    g = torch.exp(arg) - onehot
    dl = float64_on(dloss, device).abs()[:, None]
    dlogits = float64_on(dlogits, device)
    dx = torch.where(torch.isfinite(dlogits), dlogits.abs(), 0.0)
    stored_g = p.store * g.abs() + p.floor  # the gradient kept in the logits' dtype
    allowed = dl * (p_err + SAFETY * u * g.abs() + stored_g) + SAFETY * u * dx + p.store * dx + p.floor
    return torch.where(ignored[:, None], 0.0, allowed).cpu().numpy()
