"""Tolerance rules of the losses family: cross-entropy loss and its gradient.

The pieces (unit roundoff, sum bounds, floors, SAFETY and the other constants with
their sources) are in :mod:`tritoncheck.tolerance`. The rules are evaluated in float64
torch on the suite's device (the GPU when there is one: a [M, V] row of a 256k
vocabulary is a few passes there); arguments may be NumPy arrays or tensors, results
are NumPy."""
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
    """Per row of logits [M, V] (fp64 tensor): finite mask, max m over the finite entries
    (0 if none), log S with S = sum_j exp(z_j - m) (>= 1 when a finite entry exists), lse,
    the number n of finite entries and spread = sum_j w_j |z_j - m| with the softmax
    weights w_j (a weighted mean of the exp arguments, at most log n + 1)."""
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

    lse = m + log S, S = sum_j exp(z_j - m), computed in fp32 whatever the input
    dtype (kernels load and upcast; the control upcasts with ``.float()`` first), so
    nothing here depends on the logits' dtype. Term by term, as errors in lse (an
    error r relative in S is an error r in log S):

    * z_j - m rounds (u |z_j - m|) and exp adds EXP_ULPS u plus u |z_j - m| from the
      log2(e) scaling: a relative error u (2 |z_j - m| + EXP_ULPS) of term j, which
      enters S with the term's weight w_j, so 2 u sum_j w_j |z_j - m| + EXP_ULPS u.
    * The sum of n positive terms: sum_error(n). An online (or blocked, or split)
      logsumexp also rescales partial sums by exp(m_old - m_new) when the running max
      grows; each such step costs (EXP_ULPS + 1) u instead of the u of an addition,
      and a term goes through at most as many steps as the partial sums it is part
      of, the count sum_error(n) already bounds: (EXP_ULPS + 2) sum_error(n).
    * log S: EXP_ULPS u (log S + 1) (the 1: the absolute error of GPU lg2.approx
      near S = 1); m + log S rounds: u |lse|; an implementation may instead form
      z_j - m for every j and add m back (log_softmax), u |m| more.
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

    The lse error (:func:`cross_entropy_lse_error`), then the subtraction in fp32:
    u |loss|, plus u (|x_t| + |m|) for the log_softmax form (x_t - m) - log S that
    ``F.cross_entropy`` uses. The loss is stored in float32 whatever the logits'
    dtype, so the input dtype's unit roundoff never enters. Ignored rows must be
    exactly 0: allowance 0. A target on a -inf logit gives +inf (compared exactly).
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

    p_ij = exp(z_j - lse) from an fp32 lse (saved by the forward, or the
    log_softmax output): the exponent errs by the lse error plus u (2 |z_j - lse|
    + EXP_ULPS) (rounding of z_j - lse and exp's own error). As for softmax, an
    exponent error E moves p by at most min(1, p e^E) (1 - e^-E): p E when E is small,
    and at most the whole [0, 1] when it is not (logits near the fp32 range, where u
    |lse| exceeds 1, leave the fp32 probabilities without a correct digit). Then
    p - onehot rounds (u |g|), the product with dloss rounds (u |dx|), and the result
    is stored in the logits' dtype (store |dx|, one rounding into its subnormals:
    floor). Ignored rows must be exactly 0.

    Fused kernels (Liger-Kernel's) compute g = p - onehot in the forward and keep it
    in the logits' dtype; the backward only scales it by dloss: g rounds once in
    that dtype (store |g| relative, |dx| = dl |g|; into its subnormals, one floor
    scaled by dl), and the scaled result once more (store |dx|). The old rule allowed
    the logits' dtype one rounding only, so such a correct kernel failed at 0.76 ulp
    of float16 (1.05x). PyTorch's own path (``F.cross_entropy`` on float16 or bfloat16
    logits) keeps log p = (z - m) - log s in the logits' dtype for its backward instead,
    with log s itself rounded to that dtype on CPU (an fp16 log p off by 0.76 of its
    ulp was seen): two roundings of |z - lse|, an absolute error 2 store |z - lse| in
    the exponent, which for small p is 2 store |log p| relative (p = 0.0019 in
    float16: 6.1 u of dx), a strategy the old rule missed.
    """
    device = backend.device()
    logits, target = float64_on(logits, device), _targets(target, device)
    parts = _cross_entropy_parts(logits)
    finite, lse = parts[0], parts[3]
    ignored = target == ignore_index
    # elementwise, not an index assignment (CUDA's deterministic index_put_ misplaced rows
    # once in this suite: docs/third-party/torch.md)
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
