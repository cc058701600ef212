"""Tolerance rules: how far from the fp64 reference an output may be, per element.

Every rule is a first-order rounding-error bound, not a tuned number. The pieces:

* ``u``: unit roundoff of a format, half its machine epsilon: fp64 2^-53, fp32
  2^-24, fp16 2^-11, bf16 2^-8, tf32 2^-11 (10 explicit mantissa bits).
* Storing an fp32 result in the output dtype costs ``u(out) * |y|``. Under the
  Triton interpreter an fp32 -> bf16 store truncates instead of rounding to nearest
  (design notes), which costs up to one ulp = ``2 u``.
* Arithmetic runs in fp32 (the contract's "accumulate in fp32"): each operation adds
  a relative ``u(fp32)``. ``tl.exp`` on NVIDIA GPUs is ``ex2.approx`` after a
  multiplication by log2(e): relative error of a few ulps plus ``u * |argument|``.
* A sum of n same-sign terms: any order gives at most ``n u`` (Higham, Accuracy and
  Stability, 2nd ed., eq. 4.4); with independent rounding errors the error exceeds
  ``lambda sqrt(n) u`` only with probability ``2 exp(-lambda^2 / 2)`` (Higham and
  Mary, SIAM J. Sci. Comput. 2019). A tree or blocked sum (Triton's ``tl.sum``,
  blocked loops) is bounded by ``(log2 n + n / block) u``. We use
  ``(log2 n + 5 sqrt n) u``: the tree bound plus the probabilistic bound at
  lambda = 5 (a false alarm per sum of about 1e-5).
* Dot products on fp32 inputs run as tf32 on NVIDIA GPUs unless the kernel asks for
  ``input_precision="ieee"``: each operand is rounded to tf32 first, a relative error
  of ``2 u(tf32)`` per product. The interpreter computes them in full fp32.
* Near underflow: rounding into the output dtype's subnormal range errs by up to its
  subnormal spacing (fp16: 2^-24), and an fp32 intermediate below fp32's smallest
  normal may be flushed to zero (FTZ in GPU math functions): an absolute floor of
  the larger of the two.
* ``SAFETY = 2`` covers the second-order terms the first-order bounds drop, and the
  freedom of an implementation to order its operations differently.

A tolerance is never widened to turn a test green without a sentence here saying
why the old rule was wrong.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

SAFETY = 2.0
EXP_ULPS = 4.0  # relative error of exp / exp2 / log in units of u(fp32), GPU approx paths included
SUM_LAMBDA = 5.0

_U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
U_TF32 = 2.0**-11
U32 = _U[torch.float32]


def unit_roundoff(dtype: torch.dtype) -> float:
    try:
        return _U[dtype]
    except KeyError:
        raise ValueError(f"no unit roundoff known for {dtype}") from None


def underflow_floor(dtype: torch.dtype) -> float:
    """Absolute error allowed for a result near underflow: the spacing of the dtype's
    subnormals, or fp32's smallest normal number (an fp32 intermediate that GPU math
    may flush to zero), whichever is larger (module docstring)."""
    info = torch.finfo(dtype)
    return max(float(info.tiny) * float(info.eps), float(torch.finfo(torch.float32).tiny))


def sum_error(n: int | np.ndarray, u: float = U32):
    """Relative error bound of a sum of ``n`` same-sign terms (see the module docstring)."""
    n = np.maximum(n, 1)
    return u * (np.log2(n) + SUM_LAMBDA * np.sqrt(n))


@dataclass(frozen=True)
class Precision:
    """The rounding units that apply to one implementation, dtype and backend."""

    dtype: torch.dtype
    backend: str
    store: float  # relative error of storing an fp32 value in the output dtype
    compute: float  # fp32 arithmetic
    dot: float  # relative error per product of a tl.dot (tf32 or fp32)
    floor: float  # absolute error allowed for results near underflow

    @classmethod
    def of(cls, dtype: torch.dtype, backend: str, fp32_dot_precision: str | None = None) -> "Precision":
        store = unit_roundoff(dtype)
        if backend == "interpret" and dtype == torch.bfloat16:
            # The interpreter truncates fp32 -> bf16 conversions (1.51171875 -> 1.5078125,
            # not 1.515625) and mangles bf16 subnormals converted to or from fp32
            # (1e-39 -> 5.9e-39, 5e-40 -> 0; seen on Triton 3.9). The first doubles u;
            # the second stays below fp32's smallest normal 1.2e-38, the floor below.
            store *= 2
        dot = U32
        if dtype == torch.float32 and backend == "cuda" and fp32_dot_precision != "ieee":
            # Triton's default on NVIDIA: tf32 for fp32 tl.dot (an undeclared kernel is assumed to use it).
            dot = 2 * U_TF32
        return cls(dtype=dtype, backend=backend, store=store, compute=U32, dot=dot, floor=underflow_floor(dtype))


# ---------------------------------------------------------------------------- softmax

def softmax_exponent_error(x: np.ndarray, temperature: float, p: Precision) -> tuple[np.ndarray, np.ndarray]:
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
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        z = x / temperature
        finite = np.isfinite(z)
        zf = np.where(finite, z, 0.0)
        m = np.max(np.where(finite, z, -np.inf), axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        d = zf - m
        log_y = np.where(finite, d, -np.inf) - np.log(np.sum(np.where(finite, np.exp(d), 0.0),
                                                             axis=-1, keepdims=True))
        n = finite.sum(axis=-1, keepdims=True)
        u_div = unit_roundoff(p.dtype) if temperature != 1 else 0.0
        not_max = finite & (zf != m)
        own = SAFETY * (np.where(not_max, u_div * (np.abs(zf) + np.abs(m)), 0.0)
                        + p.compute * (2 * np.abs(d) + EXP_ULPS))
        own = np.where(finite, own, 0.0)
        # y_j (e^{o_j} - 1), without 0 * inf for entries whose weight underflows
        grow = np.where(own < 50, np.exp(log_y) * np.expm1(np.minimum(own, 50.0)), np.exp(log_y + own))
        normaliser = np.log1p(np.sum(np.where(finite, grow, 0.0), axis=-1, keepdims=True))
    err = own + normaliser + SAFETY * (p.compute + sum_error(n, p.compute))
    return err, log_y


def softmax_allowance(x: np.ndarray, temperature: float, p: Precision) -> np.ndarray:
    """Error of y_i from its exponent error E_i, before the final store.

    An error of at most E in log y_i moves y_i = e^{log y_i} by at most
    e^{log y_i + E} (1 - e^{-E}), capped at 1: for small E that is y_i E, and for
    large E (inputs whose rounding can reorder the logits, e.g. ties created by
    rounding x / T in bf16) it correctly grows to the whole [0, 1] range.
    """
    err, log_y = softmax_exponent_error(x, temperature, p)
    with np.errstate(over="ignore"):
        return np.minimum(1.0, np.exp(log_y + err)) * -np.expm1(-err)


def softmax(x: np.ndarray, y: np.ndarray, temperature: float, p: Precision) -> np.ndarray:
    """Allowed absolute error of each softmax output: the exponent error, the store."""
    return softmax_allowance(x, temperature, p) + p.store * np.abs(y) + p.floor


def softmax_grad(x: np.ndarray, y: np.ndarray, dy: np.ndarray, dx: np.ndarray,
                 temperature: float, p: Precision) -> np.ndarray:
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
    a = softmax(x, y, temperature, p)
    n = np.isfinite(x).sum(axis=-1, keepdims=True)
    inner = np.sum(dy * y, axis=-1, keepdims=True)
    inner_err = np.sum(np.abs(dy) * a + np.abs(dy * y) * sum_error(n, p.compute), axis=-1, keepdims=True)
    bound = (a * (np.abs(dy - inner) + inner_err) + np.abs(y) * inner_err) / temperature
    return SAFETY * bound + 2 * p.store * np.abs(dx) + p.floor * max(1.0, 1.0 / temperature)


def row_sum(allowed: np.ndarray) -> np.ndarray:
    """Allowed deviation of a row sum from its exact value: the sum of the per-element
    allowances (errors can all lean one way) plus the fp64 summation of the check."""
    n = allowed.shape[-1]
    return allowed.sum(axis=-1) + n * unit_roundoff(torch.float64)


def softmax_row_sum(x: np.ndarray, y: np.ndarray, temperature: float, p: Precision) -> np.ndarray:
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
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        z = x / temperature
        finite = np.isfinite(z)
        m = np.max(np.where(finite, z, -np.inf), axis=-1, keepdims=True)
        gap = np.where(finite & np.isfinite(m), m - z, 0.0)
    w = np.clip(np.where(np.isfinite(y), y, 0.0), 0.0, 1.0)
    n = finite.sum(axis=-1)
    numerator = p.compute * (2 * EXP_ULPS + 1 + 2 * np.sum(w * gap, axis=-1))
    tiny = float(torch.finfo(p.dtype).tiny)
    store = p.store * np.sum(w, axis=-1) + p.floor * np.sum(finite & (w < tiny), axis=-1)
    return SAFETY * (sum_error(n, p.compute) + numerator) + store + x.shape[-1] * unit_roundoff(torch.float64)


def ulp(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Spacing of ``dtype`` at each value (the subnormal spacing below the smallest normal)."""
    info = torch.finfo(dtype)
    mant = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
    mag = np.maximum(np.abs(values), float(info.tiny))
    with np.errstate(divide="ignore", invalid="ignore"):
        exp = np.floor(np.log2(np.where(np.isfinite(mag), mag, float(info.max))))
    return np.exp2(exp - mant)


# ---------------------------------------------------------------------- cross_entropy
# (losses and elementwise families: cross_entropy, rope, swiglu)

def _cross_entropy_parts(logits: np.ndarray):
    """Per row of logits [M, V] (fp64): finite mask, max m over the finite entries (0 if
    none), log S with S = sum_j exp(z_j - m) (>= 1 when a finite entry exists), lse,
    the number n of finite entries and spread = sum_j w_j |z_j - m| with the softmax
    weights w_j (a weighted mean of the exp arguments, at most log n + 1)."""
    finite = np.isfinite(logits)
    z = np.where(finite, logits, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(np.where(finite, logits, -np.inf), axis=-1)
        m = np.where(np.isfinite(m), m, 0.0)
        d = np.where(finite, z - m[:, None], -np.inf)
        e = np.exp(d)
        s = e.sum(axis=-1)
        live = s > 0
        log_s = np.log(np.where(live, s, 1.0))
        w = e / np.where(live, s, 1.0)[:, None]
        spread = np.sum(np.where(finite, w * np.abs(np.where(finite, d, 0.0)), 0.0), axis=-1)
    return finite, m, log_s, m + log_s, finite.sum(axis=-1), spread


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
    _, m, log_s, lse, n, spread = _cross_entropy_parts(logits)
    u = p.compute
    return SAFETY * (u * (2 * spread + EXP_ULPS + (EXP_ULPS + 1) * (log_s + 1) + np.abs(m) + np.abs(lse))
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
    target = np.asarray(target).astype(np.int64)
    _, m, _, _, _, _ = _cross_entropy_parts(logits)
    rows = np.arange(logits.shape[0])
    ignored = target == ignore_index
    x_t = logits[rows, np.where(ignored, 0, target)]
    x_t = np.where(np.isfinite(x_t), x_t, 0.0)
    lf = np.where(np.isfinite(loss), loss, 0.0)
    u = p.compute
    allowed = (cross_entropy_lse_error(logits, p) + SAFETY * u * (np.abs(x_t) + np.abs(m) + np.abs(lf))
               + float(torch.finfo(torch.float32).tiny))
    return np.where(ignored, 0.0, allowed)


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
    target = np.asarray(target).astype(np.int64)
    finite, _, _, lse, _, _ = _cross_entropy_parts(logits)
    rows = np.arange(logits.shape[0])
    ignored = target == ignore_index
    onehot = np.zeros_like(logits)
    onehot[rows[~ignored], target[~ignored]] = 1.0
    u = p.compute
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        arg = np.where(finite, logits - lse[:, None], -np.inf)
        e = (cross_entropy_lse_error(logits, p)[:, None]
             + SAFETY * u * (2 * np.abs(np.where(finite, arg, 0.0)) + EXP_ULPS)
             + 2 * p.store * np.abs(np.where(finite, arg, 0.0)))  # log p kept in the logits' dtype
        p_err = np.minimum(1.0, np.exp(arg + e)) * -np.expm1(-e)
        g = np.exp(arg) - onehot
    dl = np.abs(np.asarray(dloss, dtype=np.float64))[:, None]
    dx = np.where(np.isfinite(dlogits), np.abs(dlogits), 0.0)
    stored_g = p.store * np.abs(g) + p.floor  # the gradient kept in the logits' dtype
    allowed = dl * (p_err + SAFETY * u * np.abs(g) + stored_g) + SAFETY * u * dx + p.store * dx + p.floor
    return np.where(ignored[:, None], 0.0, allowed)


# ----------------------------------------------------------------------- rope, swiglu

def _elementwise_subnormal_spacing(dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return float(info.tiny) * float(info.eps)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, y: np.ndarray, table_dtype: torch.dtype,
         p: Precision) -> np.ndarray:
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
    xa, xb = x[..., 0::2], x[..., 1::2]
    prod = np.empty_like(x)
    prod[..., 0::2] = np.abs(xa * cos) + np.abs(xb * sin)
    prod[..., 1::2] = np.abs(xa * sin) + np.abs(xb * cos)
    return SAFETY * (u_cast + u_in) * prod + p.store * np.abs(y) + 3 * p.floor


def rope_pair_norm(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, y: np.ndarray, table_dtype: torch.dtype,
                   p: Precision) -> tuple[np.ndarray, np.ndarray]:
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
    xa, xb, ya, yb = x[..., 0::2], x[..., 1::2], y[..., 0::2], y[..., 1::2]
    r = np.hypot(cos, sin)
    norm = r * np.hypot(xa, xb)
    e0 = SAFETY * u_in * (np.abs(xa * cos) + np.abs(xb * sin)) + p.store * np.abs(ya) + 3 * p.floor
    e1 = SAFETY * u_in * (np.abs(xa * sin) + np.abs(xb * cos)) + p.store * np.abs(yb) + 3 * p.floor
    return norm, u_cast * norm + np.hypot(e0, e1) + 2 * unit_roundoff(torch.float64) * norm


def _swiglu_sigmoid_parts(g: np.ndarray):
    """sigmoid(g), 1 - sigmoid(g) and exp(-|g|), all exact in fp64 (no cancellation)."""
    e = np.exp(-np.abs(g))
    s = np.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    one_minus = np.where(g >= 0, e / (1.0 + e), 1.0 / (1.0 + e))
    return s, one_minus, e


def _swiglu_sigmoid_error(g: np.ndarray, u: float) -> np.ndarray:
    """Relative error bound of an fp32 sigmoid s(g) from e = exp(-|g|).

    e errs by u (EXP_ULPS + |g|) relative (exp and the log2(e) scaling of its
    argument); through s = 1 / (1 + e) or e / (1 + e) that becomes a relative error
    (1 - s) times as large. 1 + e and the division round (2 u), except that for
    g >= 0 and e below u, 1 + e rounds to 1 with an error of e, not u: 2 min(u, e).
    """
    _, one_minus, e = _swiglu_sigmoid_parts(g)
    rounding = np.where(g >= 0, 2 * np.minimum(u, e), 2 * u)
    return u * (EXP_ULPS + np.abs(g)) * one_minus + rounding


def _swiglu_flush(g: np.ndarray) -> np.ndarray:
    """Where sigmoid(g) is below fp32's smallest normal (g < -87.3): an fp32
    intermediate that may be flushed to zero (FTZ in GPU exp), and which
    ``torch.sigmoid``/``F.silu`` turn into 0 already at g < -88.7 (exp(-g) overflows
    to inf); the products that carry it then lose their whole value."""
    s, _, _ = _swiglu_sigmoid_parts(g)
    return s < float(torch.finfo(torch.float32).tiny)


def _swiglu_subnormal_read(v: np.ndarray) -> np.ndarray:
    """How far an operand may be misread: 2 tiny(fp32) where it is nonzero and below
    fp32's smallest normal, else 0. FTZ arithmetic (GPU .ftz instructions) reads such
    an operand as 0; the Triton interpreter's bf16 -> fp32 conversion garbles it into
    another value below tiny(fp32) (``_convert_float`` normalises the subnormal
    significand, then clamps the exponent at 0 without shifting it back). Either way
    the operand is off by less than 2 tiny(fp32), which a product with a large factor
    (swiglu's gate up to 1.3e19) turns into a visible error."""
    tiny = float(torch.finfo(torch.float32).tiny)
    return np.where((v != 0) & (np.abs(v) < tiny), 2 * tiny, 0.0)


def swiglu(gate: np.ndarray, up: np.ndarray, y: np.ndarray, p: Precision) -> np.ndarray:
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
    ay = np.abs(y)
    allowed = (SAFETY * (_swiglu_sigmoid_error(gate, u) + 2 * u) * ay + unit_roundoff(p.dtype) * ay
               + _elementwise_subnormal_spacing(p.dtype) * np.abs(up) + p.store * ay + p.floor)
    s, _, _ = _swiglu_sigmoid_parts(gate)
    allowed = (allowed + _swiglu_subnormal_read(up) * np.abs(gate * s)
               + _swiglu_subnormal_read(gate) * 1.1 * np.abs(up))
    return np.where(_swiglu_flush(gate), np.maximum(allowed, ay + p.floor), allowed)


def swiglu_grad(gate: np.ndarray, up: np.ndarray, dy: np.ndarray, dgate: np.ndarray, dup: np.ndarray,
                p: Precision) -> tuple[np.ndarray, np.ndarray]:
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
    s, one_minus, _ = _swiglu_sigmoid_parts(gate)
    ds = _swiglu_sigmoid_error(gate, u) * s
    t = s + gate * s * one_minus
    dt = np.abs(1 + gate * (one_minus - s)) * ds + u * (np.abs(t) + 3 * np.abs(gate * s * one_minus))
    adg = np.where(np.isfinite(dgate), np.abs(dgate), 0.0)
    adu = np.where(np.isfinite(dup), np.abs(dup), 0.0)
    flush = _swiglu_flush(gate)
    a_gate = (SAFETY * (np.abs(dy * up) * dt + 2 * u * adg) + u_in * adg + sub * np.abs(t)
              + p.store * adg + p.floor)
    a_up = (SAFETY * (_swiglu_sigmoid_error(gate, u) + 2 * u) * adu + u_in * adu + sub * np.abs(dy)
            + p.store * adu + p.floor)
    rg, ru, rd = _swiglu_subnormal_read(gate), _swiglu_subnormal_read(up), _swiglu_subnormal_read(dy)
    a_gate = a_gate + ru * np.abs(dy * t) + rg * np.abs(dy * up) + rd * np.abs(up * t)
    a_up = a_up + rg * 1.1 * np.abs(dy) + rd * np.abs(gate * s)
    return (np.where(flush, np.maximum(a_gate, adg + p.floor), a_gate),
            np.where(flush, np.maximum(a_up, adu + p.floor), a_up))


# ------------------------------------------------------------------- linear attention
# (appended by the linear_attention family: elu_feature_map and linear_attention)


TF32X3_DOT = 2.0**-21  # relative error per product of a 3-pass tf32 ("tf32x3") tl.dot


def declared_dot(p: Precision, fp32_dot_precision: str | None) -> Precision:
    """``p`` with the dot-product unit of a kernel that declares ``"tf32x3"``.

    ``Precision.of`` knows "ieee" and "tf32" only and treats anything else on CUDA as
    tf32 (2 u(tf32) = 2^-10 per product, for fp32 inputs only). "tf32x3" splits each
    fp32 operand into a tf32 high part and a tf32 low part (a = a_hi + a_lo + r,
    |r| <= 2^-22 |a|) and sums three tf32 products (hi hi, hi lo, lo hi) in fp32: the
    dropped lo lo product and the two residuals are each about 2^-22 relative, so a
    product carries ~ 3 * 2^-22 < 2^-21 relative error. It applies to every input dtype
    when the kernel casts its operands to fp32 before ``tl.dot`` (its fp32 intermediates,
    e.g. the scores Q K^T or the state S, are not exact in tf32 whatever the input
    dtype). The interpreter computes every fp32 dot in full fp32 (``p`` unchanged).
    """
    if p.backend == "cuda" and fp32_dot_precision == "tf32x3":
        return replace(p, dot=TF32X3_DOT)
    return p


def _la_half_subnormal(dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype``'s subnormals: the absolute error of rounding a
    value into its subnormal range (to nearest)."""
    info = torch.finfo(dtype)
    return float(info.tiny) * float(info.eps) / 2


def elu_feature_map(x: np.ndarray, y: np.ndarray, p: Precision) -> np.ndarray:
    """Allowed absolute error of y = elu(x) + 1 = max(x, 0) + exp(min(x, 0)).

    x > 0: y = x + 1, one fp32 addition (u |y|). x <= 0: y = exp(x) in fp32,
    EXP_ULPS u |y|, plus u |x| |y| from the log2(e) scaling of ex2.approx on the GPU.
    The contract writes y as elu(x) + 1, and ``F.elu(x) + 1`` in the input dtype, the
    way users write it (the control), rounds elu(x) = y - 1 to the dtype before adding
    1 (exact by Sterbenz for y - 1 in [-1, -1/2]): u(dtype) |y - 1| for x < 0. That term
    is an absolute error up to u(dtype) where y itself is tiny, so this rule does not
    see the relative accuracy of tiny outputs; the exact property
    ``feature_map_positive_finite`` checks that they do not collapse to 0. Then the
    store u(dtype) |y| (two units under the interpreter's truncating bf16 store) and
    the underflow floor.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(x)
        xf = np.where(finite, x, 0.0)
        yf = np.where(np.isfinite(y), y, 0.0)
        neg = xf <= 0
        exp_err = np.where(neg, p.compute * (EXP_ULPS + np.abs(xf)) * yf, p.compute * yf)
        elu_round = np.where(xf < 0, unit_roundoff(p.dtype) * np.abs(yf - 1.0), 0.0)
        return SAFETY * (exp_err + elu_round) + p.store * np.abs(yf) + p.floor


def elu_feature_map_grad(x: np.ndarray, dy: np.ndarray, dx: np.ndarray, p: Precision) -> np.ndarray:
    """Allowed absolute error of dx = dy * (1 if x > 0 else exp(x)).

    exp(x) in fp32 as in the forward (EXP_ULPS u + u |x|, relative), the product dy
    times it (u), the store of dx (u(dtype)); the floor for results near underflow.
    A kernel may instead save its output y = exp(x) (x <= 0) in the input dtype and
    scale it by dy in backward (torch's in-place elu backward reads its result the
    same way): y rounds once in that dtype (u(dtype) |dx| more, one floor into its
    subnormals scaled by |dy|), the old rule's one rounding would fail it.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        xf = np.where(np.isfinite(x), x, 0.0)
        dxf = np.abs(np.where(np.isfinite(dx), dx, 0.0))
        rel = np.where(xf <= 0, p.compute * (EXP_ULPS + np.abs(xf) + 1), p.compute)
        stored_y = np.where(xf <= 0, p.store * dxf + p.floor * np.abs(dy), 0.0)
        return SAFETY * rel * dxf + p.store * dxf + stored_y + p.floor


def _la_causal_abs_numerator(q: np.ndarray, k: np.ndarray, va: np.ndarray, block: int = 128) -> np.ndarray:
    """M_i = sum_{j <= i} (q_i . k_j) |v_j| = q_i . P_i with P_i = sum_{j <= i} k_j |v_j|^T,
    the prefix sums formed a block of positions at a time (memory B H block D Dv)."""
    B, H, N, _ = q.shape
    out = np.empty((B, H, N, va.shape[-1]))
    carry = np.zeros((B, H, q.shape[-1], va.shape[-1]))
    for n0 in range(0, N, block):
        sl = slice(n0, min(N, n0 + block))
        prefix = np.cumsum(np.einsum("bhnd,bhne->bhnde", k[:, :, sl], va[:, :, sl]), axis=2) + carry[:, :, None]
        out[:, :, sl] = np.einsum("bhnd,bhnde->bhne", q[:, :, sl], prefix)
        carry = prefix[:, :, -1]
    return out


# A dot operand below fp32's smallest normal may be read as another value within about
# that much: GPUs flush subnormals to zero, and the Triton interpreter converts bf16
# subnormals to fp32 wrongly (1.38e-39 is read as 1.03e-38, 1.3e-40 as 0; seen on Triton
# 3.9, on loads and on stores), and a 3-pass tf32 dot ("tf32x3") loses the low part
# a - tf32(a) of an operand within 2^11 of it (that part is subnormal). Each product
# of a dot may so err by DOT_READ_FLOOR times the other operand.
DOT_READ_FLOOR = float(torch.finfo(torch.float32).tiny)


def linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, causal: bool,
                     eps: float, p: Precision) -> np.ndarray:
    """Allowed absolute error of o_i = (q_i S_i) / (q_i . z_i + eps) (S_i, z_i over j <= i
    when causal, over all j otherwise), q, k >= 0 and v of any sign, per element.

    The state S = sum_j k_j v_j^T sums n_i terms (n_i = i + 1 causal, N otherwise) of
    mixed sign, so its rounding error is bounded by sum_error(n_i) times the sum of the
    terms' magnitudes, P = sum_j k_j |v_j|^T, not by |S|; reading it with q_i (a D-long
    sum, sum_error(D)) gives the numerator an error relative to
    M_i = q_i . P_i = sum_j (q_i . k_j) |v_j|, computed here in fp64 from the inputs.
    Each product is a tl.dot product (``p.dot``: u(fp32) under the interpreter, 2^-21
    for a kernel that declares "tf32x3" on CUDA, see :func:`declared_dot`, plus
    DOT_READ_FLOOR times the other operand near fp32's underflow); a chunked
    causal kernel forms (q_i . k_j) v_j through the scores (one dot each for Q K^T and
    A V), so two dot units per term. The denominator d_i = q_i . z_i + eps has only
    positive terms: (sum_error(n_i) + sum_error(D) + dot + u) relative. fp16/bf16
    inputs are exact in fp32, so their products are too; accumulation is fp32.

    The plain implementation (``torch.einsum`` / ``torch.cumsum`` in the input dtype,
    the control) accumulates in fp32 too (PyTorch's reductions and matmuls do) but
    stores each named intermediate in the input dtype once: the products k_j v_j^T
    (causal), S_i, q_i S_i; z_i, q_i . z_i, d_i. Each costs u(dtype) relative to the
    same absolute sums (3 u(dtype) for the numerator and for the denominator) plus
    half a subnormal spacing of the dtype, which matters in fp16 where q . z ~ eps =
    1e-6 is subnormal (spacing 6e-8): fl (|q_i|_1 (n_i + 1) + 1) for the numerator,
    fl (|q_i|_1 + 2) for the denominator. A kernel that accumulates the state in the
    input dtype (n_i roundings instead of one) is outside this rule for long n_i.

    The quotient: |o err| <= num_err / d + |o| den_err / d + u |o|; then SAFETY, the
    store of o (u(dtype) |o|) and the underflow floor.
    """
    q, k, v, o = (np.asarray(a, dtype=np.float64) for a in (q, k, v, o))
    N, D = q.shape[-2], q.shape[-1]
    va = np.abs(v)
    if causal:
        m_abs = _la_causal_abs_numerator(q, k, va)
        z = np.cumsum(k, axis=2)
        n = np.arange(1, N + 1, dtype=np.float64)[None, None, :, None]
    else:
        m_abs = np.einsum("bhnd,bhde->bhne", q, np.einsum("bhnd,bhne->bhde", k, va))
        z = np.broadcast_to(k.sum(axis=2, keepdims=True), k.shape)
        n = np.float64(max(N, 1))
    den = (np.einsum("bhnd,bhnd->bhn", q, z) + eps)[..., None]
    q1 = q.sum(axis=-1, keepdims=True)
    uc, ui, fl = p.compute, unit_roundoff(p.dtype), _la_half_subnormal(p.dtype)
    e_sum = sum_error(n, uc) + sum_error(D, uc)
    # operands misread by up to DOT_READ_FLOOR (see there): k v^T (or q k^T) products err
    # by F (|v| + |k|) summed over j, reading with q adds F (q1 + the read sums); the
    # factor 2 covers the causal kernel's two dots per term
    v1 = np.cumsum(va, axis=2) if causal else np.broadcast_to(va.sum(axis=2, keepdims=True), va.shape)
    k1 = z.sum(axis=-1, keepdims=True)
    reads = 2 * DOT_READ_FLOOR * (q1 + 1) * (v1 + k1 + 1)
    num_err = (e_sum + 2 * p.dot + 3 * ui) * m_abs + fl * (q1 * (n + 1) + 1) + reads
    den_err = (e_sum + p.dot + uc + 3 * ui) * den + fl * (q1 + 2) + DOT_READ_FLOOR * (q1 + k1)
    oa = np.abs(np.where(np.isfinite(o), o, 0.0))
    err = num_err / den + oa * den_err / den + uc * oa
    return SAFETY * err + p.store * oa + p.floor


# -------------------------------------------------------------------------- attention

def attention_scores(q: np.ndarray, k: np.ndarray, causal: bool, scale: float):
    """fp64 scores s = scale q k^T, -inf at causally masked (i, j); and the mask of kept pairs."""
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    visible = np.ones(s.shape[-2:], dtype=bool)
    if causal:
        visible = np.tril(visible)
    visible = np.broadcast_to(visible, s.shape)
    return np.where(visible, s, -np.inf), visible




def attention_score_error(q: np.ndarray, k: np.ndarray, s: np.ndarray, visible: np.ndarray,
                          scale: float, p: Precision) -> np.ndarray:
    """Bound (SAFETY included) on the absolute error of each score s_ij, in natural units,
    as an exponent error of p_ij: eps_ij.

    The dot q_i . k_j of D exact products accumulates in fp32 ((p.dot + sum_error(D)) times
    scale sum_d |q_id k_jd|); the scaling (and the scale's own rounding, and log2(e) folded
    into it) adds 2 u(fp32) |s_ij|. A plain PyTorch implementation forms q @ k^T and the
    product with sm_scale in the input dtype, 2 u(dtype) |s_ij| more: the rule allows it
    (as the softmax rule allows x / T rounded in the input dtype), so users' attention in
    fp16 and bf16 passes; for the kernel (fp32 scores) this is slack of about
    u(dtype) |s| in lse and, through score differences, in o. The exponent s_ij - m
    (m <= the row max: online running maxima only get closer to s_ij) rounds
    (u |s_ij - m|) and exp/exp2 adds EXP_ULPS u. Operands below the smallest normal:
    DOT_READ_FLOOR scale (sum_d |q_id| + |k_jd|).
    """
    d = q.shape[-1]
    a = scale * (np.abs(q) @ np.swapaxes(np.abs(k), -1, -2))
    reads = scale * DOT_READ_FLOOR * (np.sum(np.abs(q), axis=-1)[..., :, None]
                                            + np.sum(np.abs(k), axis=-1)[..., None, :])
    u_in = unit_roundoff(p.dtype)
    with np.errstate(invalid="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        eps = SAFETY * ((p.dot + sum_error(d, p.compute)) * a + reads + 2 * (u_in + p.compute) * np.abs(s)
                        + p.compute * (np.abs(s - m) + EXP_ULPS))
    return np.where(visible, eps, 0.0)


def _attention_parts(p: Precision):
    """(u_p, p_floor): the relative rounding of P (and dS) before their products, and the
    absolute rounding of a P or dS entry in the subnormal range.

    FlashAttention kernels and plain PyTorch round P = softmax and dS to the input dtype
    for fp16 / bf16 (this kernel: fp16 for float16; tf32 on the GPU, i.e. <= 2 u(tf32)
    with truncation, fp32 in the interpreter, for bfloat16: both within u(bf16));
    float32 products carry p.dot. Below the smallest normal the spacing is
    tiny * eps of the dtype (fp16: 2^-24), or tiny(fp32) where a GPU flushes.
    """
    info = torch.finfo(p.dtype)
    u_p = unit_roundoff(p.dtype) if p.dtype in (torch.float16, torch.bfloat16) else p.dot
    p_floor = max(float(info.tiny) * float(info.eps), float(torch.finfo(torch.float32).tiny))
    return u_p, p_floor


def attention_floor(p: Precision) -> float:
    """p.floor, plus, under the Triton interpreter for bfloat16, one more smallest normal:
    the interpreter's fp32 -> bf16 store maps fp32 subnormals to wrong bf16 values
    (e.g. -1.42e-39 -> -1.10e-38, 3.0e-39 -> 1.8e-40, seen on Triton 3.9), an error up to
    about tiny(bf16) on top of the value; p.floor (= tiny) alone is exceeded by a hair."""
    if p.backend == "interpret" and p.dtype == torch.bfloat16:
        return 2 * p.floor
    return p.floor


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
              causal: bool, scale: float, p: Precision) -> tuple[np.ndarray, np.ndarray]:
    """Allowed absolute errors of (o, lse) of attention, from the fp64 inputs and reference.

    Scores: each s_ij errs by at most eps_ij (attention_score_error), i.e. the weight of
    key j is multiplied by e^{eta_j}, |eta_j| <= eps_ij. Measured against the row's top key
    j* (softmax only sees differences), zeta_j = eta_j - eta_j* is bounded by
    E_j = eps_ij + eps_ij* (E_j* = 0), and exactly
        o' - o = sum_j p_j (e^{zeta_j} - 1)(v_j - o) / Z,   Z = sum_j p_j e^{zeta_j}
    so |o' - o| <= (sum_j p_j expm1(E_j) (|v_j| + |o|)) / max(p_j*, sum_j p_j e^{-E_j}).
    This is not first-order: it stays a bound when scores near the dtype's range make
    E large, and it vanishes for a row dominated by one key. For lse,
    |lse' - lse| <= log sum_j p_j e^{eps_ij} = logsumexp(s + eps) - lse.

    Roundings that do not cancel between the numerator acc = sum_j p_j v_j and the
    denominator l = sum_j p_j: P rounded before the P V product (u_p sum_j p_j |v_j|,
    plus p_floor sum |v_j| over keys whose p_j is subnormal in the dtype); the two sums
    of n terms (sum_error(n)); the online rescaling by alpha once per key block (one
    fp32 product each for acc and l, nb = ceil(n / 16) blocks at the interpreter's
    smallest block); the division. The lse adds: l's sum (sum_error(n)), each alpha's
    exp2 (EXP_ULPS + 2 u per block, plus u times the total rise of the running max
    <= m - min s), m + log2(l) and the LN2 / LOG2E conversions (u (2 |m| + |lse| + log l)).
    Stored o: p.store |o|, plus p.floor. A convex combination of the v_j can never be
    further than max_j |v_j| + |o| from o: the o allowance is capped at twice that.
    """
    s, visible = attention_scores(q, k, causal, scale)
    eps = attention_score_error(q, k, s, visible, scale, p)
    u_p, p_floor = _attention_parts(p)
    tiny = float(torch.finfo(p.dtype).tiny)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        pr = np.where(visible, np.exp(s - lse[..., None]), 0.0)
        n = visible.sum(axis=-1, keepdims=True)
        nb = np.ceil(n / 16)
        jstar = np.argmax(s, axis=-1)[..., None]
        eps_star = np.take_along_axis(eps, jstar, axis=-1)
        top = np.arange(s.shape[-1]) == jstar
        big_e = np.where(visible & ~top, eps + eps_star, 0.0)
        # p_j (e^{E_j} - 1), formed in the log domain: p_j may underflow where e^{E_j}
        # does not; exponents are clipped at 300 (the allowance is then capped anyway)
        w = np.where(visible, np.exp(np.minimum(s - lse[..., None] + big_e, 300.0)), 0.0) - pr
        # z bounds the perturbed normaliser from below; it includes p_max >= 1/n. With scores
        # near 1e76 (bf16 q, k near max), s - lse loses every digit in fp64 and p_max can
        # come out 0 (then z = 0 and the allowance inf); 1/n keeps the bound finite and true.
        z = np.maximum(np.maximum(np.take_along_axis(pr, jstar, axis=-1), 1.0 / n),
                       np.sum(pr * np.exp(-big_e), axis=-1, keepdims=True))
        av, ao = np.abs(v), np.abs(o)
        pv = pr @ av
        score_part = (w @ av + np.sum(w, axis=-1, keepdims=True) * ao) / z
        sub = np.where(visible & (pr < 4 * tiny), 1.0, 0.0)
        rounding = u_p * pv + p_floor * (sub @ av) + (sum_error(n, p.compute) + 2 * nb * p.compute) * (pv + ao) \
            + p.compute * ao + DOT_READ_FLOOR
        vmax = np.maximum.accumulate(av, axis=-2) if causal else np.max(av, axis=-2, keepdims=True)
        o_allowed = np.minimum(score_part + SAFETY * rounding, 2 * (vmax + ao)) + p.store * ao + attention_floor(p)

        t = np.where(visible, s + eps, -np.inf)
        mt = np.max(t, axis=-1, keepdims=True)
        lse_score = (mt + np.log(np.sum(np.exp(t - mt), axis=-1, keepdims=True)))[..., 0] - lse
        m = np.max(s, axis=-1)
        s_min = np.min(np.where(visible, s, np.inf), axis=-1)
        n, nb = n[..., 0], nb[..., 0]
        lse_allowed = np.maximum(lse_score, 0.0) + SAFETY * (
            sum_error(n, p.compute) + nb * p.compute * (EXP_ULPS + 2) + p.compute * (m - s_min)
            + p.compute * (2 * np.abs(m) + np.abs(lse) + np.abs(lse - m) + EXP_ULPS)) \
            + float(torch.finfo(torch.float32).tiny)
    return o_allowed, lse_allowed


PARTIAL_SUM_BLOCK = 32  # rows per partial gradient sum in PyTorch's CPU flash attention


def attention_grad(q, k, v, do, o, lse, dq, dk, dv, causal: bool, scale: float, p: Precision) -> dict:
    """Allowed absolute errors of dq, dk, dv of attention (upstream do on o).

    FlashAttention backward: P recomputed from the saved lse, dv = P^T dO, dP = dO V^T,
    delta_i = sum_d dO_id O_id (from the stored, rounded O), dS = P (dP - delta),
    dq = scale dS K, dk = scale dS^T Q.
    - P: exponent error eps_ij (scores) + the lse allowance + the rounding of s - lse and
      exp: a relative error dP_ij = expm1(that) (a plain softmax of rounded scores is
      within the same: its normaliser errs by at most the lse allowance); then rounded
      to the dtype before its products (u_p, p_floor).
    - dP_ij: (p.dot + sum_error(D)) sum_d |dO_id v_jd|, and u(dtype) |dP_ij| where users
      store dO V^T in the input dtype.
    - delta_i: sum_d |dO_id| (the o allowance) + sum_error(D) sum_d |dO_id O_id|, and for a
      softmax backward computing it as sum_j P_ij dP_ij: sum_j P_ij (dP_ij + u) |dP_ij|.
    - dS_ij: P_ij (dP_ij |dP - delta| + err(dP) + err(delta) + u |dP - delta|) and, for a P_ij
      near underflow, p_floor |dP_ij - delta_i|; rounded to
      the dtype (u_p, and u(dtype) for the scale product of plain PyTorch) and p_floor
      (on dS or on scale dS, whichever is larger).
    - dq, dk, dv: the entry errors through the products, plus (p.dot + sum_error(n)) for
      the sums of n terms, the scale product (u), the store (p.store) and p.floor;
      operands below the smallest normal (DOT_READ_FLOOR times the other
      operand's sum: |dS| for a misread k or q, P for a misread dO, |dO| + |v| in dP).
    - a plain implementation may sum dk, dv over blocks of 32 queries (dq over blocks of
      32 keys) rounding each partial sum to the dtype: PyTorch's CPU flash attention
      backward in fp16 gave dk 2 subnormal spacings off an exact -4.0e-8 over 65 queries.
      Each extra rounding adds u(dtype) |g| + half the dtype's subnormal spacing.
    SAFETY multiplies the first-order roundings; the P and score parts carry it already.
    """
    s, visible = attention_scores(q, k, causal, scale)
    eps = attention_score_error(q, k, s, visible, scale, p)
    o_allowed, lse_allowed = attention(q, k, v, o, lse, causal, scale, p)
    u_p, p_floor = _attention_parts(p)
    u_in = unit_roundoff(p.dtype)
    tiny = float(torch.finfo(p.dtype).tiny)
    d = q.shape[-1]
    kt = lambda x: np.swapaxes(x, -1, -2)  # noqa: E731
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        pr = np.where(visible, np.exp(s - lse[..., None]), 0.0)
        expo = np.where(visible, eps + lse_allowed[..., None] + SAFETY * p.compute * (np.abs(s - lse[..., None])
                                                                                       + EXP_ULPS), 0.0)
        # P_ij (e^{expo} - 1), in the log domain (P_ij may underflow where the product does not)
        p_rel = np.where(visible, np.exp(np.minimum(s - lse[..., None] + expo, 300.0)), 0.0) - pr
        n_row = visible.sum(axis=-1, keepdims=True)  # keys each query sees
        n_col = kt(visible.sum(axis=-2, keepdims=True))  # queries that see each key
        ad, av, ao = np.abs(do), np.abs(v), np.abs(o)
        dp = do @ kt(v)
        delta = np.sum(do * o, axis=-1, keepdims=True)
        r = np.abs(dp - delta)
        # dS rounds into the dtype's subnormals before (kernel) or after (plain PyTorch: the
        # product with sm_scale in the dtype) the scale: p_floor at whichever is larger
        ds_floor = p_floor * max(1.0, 1.0 / scale)
        ds = pr * (dp - delta)
        e_dp = (p.dot + sum_error(d, p.compute)) * (ad @ kt(av)) + u_in * np.abs(dp) \
            + DOT_READ_FLOOR * (np.sum(ad, axis=-1)[..., :, None] + np.sum(av, axis=-1)[..., None, :])
        e_delta = sum_error(d, p.compute) * np.sum(ad * ao, axis=-1, keepdims=True) \
            + np.sum((p_rel + u_in * pr) * np.abs(dp), axis=-1, keepdims=True)
        # a P near underflow is only known to p_floor (a GPU's exp2 flushes it to 0), and
        # dS = P (dP - delta) carries that times |dP - delta| (H100: dk 0 for -6e-37 with
        # v near fp32's max, where |dP - delta| ~ 1e36)
        p_underflow = p_floor * r * (visible & (pr < 4 * tiny))
        e_ds = p_rel * r + pr * np.sum(ad * o_allowed, axis=-1, keepdims=True) + SAFETY * (
            pr * (e_dp + e_delta + p.compute * r) + (u_p + u_in) * np.abs(ds) + ds_floor * visible + p_underflow)
        e_ds = np.minimum(e_ds, 1e300)
        ads = np.abs(ds)
        reads_row = DOT_READ_FLOOR * np.sum(ads, axis=-1, keepdims=True)  # k misread, per dq_i
        reads_col = DOT_READ_FLOOR * kt(np.sum(ads, axis=-2, keepdims=True))  # q misread, per dk_j
        dq_allowed = scale * (e_ds @ np.abs(k) + SAFETY * reads_row + SAFETY * (p.dot + sum_error(n_row, p.compute)) * (ads @ np.abs(k))) \
            + (SAFETY * p.compute + p.store) * np.abs(dq) + attention_floor(p)
        dk_allowed = scale * (kt(e_ds) @ np.abs(q) + SAFETY * reads_col
                              + SAFETY * (p.dot + sum_error(n_col, p.compute)) * (kt(ads) @ np.abs(q))) \
            + (SAFETY * p.compute + p.store) * np.abs(dk) + attention_floor(p)
        e_p = p_rel + SAFETY * (u_p * pr + p_floor * (visible & (pr < 4 * tiny)))
        dv_allowed = kt(e_p) @ ad + SAFETY * (p.dot + sum_error(n_col, p.compute)) * (kt(pr) @ ad) \
            + SAFETY * DOT_READ_FLOOR * kt(np.sum(pr, axis=-2, keepdims=True)) \
            + p.store * np.abs(dv) + attention_floor(p)

    def partial_sums(g, n):
        return max(0, -(-n // PARTIAL_SUM_BLOCK) - 1) * (u_in * np.abs(g) + p.floor / 2)

    n_q, n_k = q.shape[-2], k.shape[-2]
    return {"dq": dq_allowed + partial_sums(dq, n_k), "dk": dk_allowed + partial_sums(dk, n_q),
            "dv": dv_allowed + partial_sums(dv, n_q)}


# ------------------------------------------------------------- layer_norm, dropout + layer_norm

def _layer_norm_stats(h: np.ndarray, eps: float):
    """fp64 row statistics: n, mean, centred values, variance, rstd, x_hat."""
    n = h.shape[-1]
    mu = h.mean(axis=-1, keepdims=True)
    d = h - mu
    var = (d * d).mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(var + eps)
    return n, mu, d, var, r, d * r


def layer_norm_xhat(h: np.ndarray, eps: float, p: Precision, input_err: np.ndarray | None = None):
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
    n, mu, d, var, r, xhat = _layer_norm_stats(h, eps)
    e = np.zeros_like(h) if input_err is None else input_err
    ebar = e.mean(axis=-1, keepdims=True)
    a_mean = np.abs(h).mean(axis=-1, keepdims=True)
    delta_mu = (sum_error(n, u) + u) * a_mean
    centred = delta_mu + u * (np.abs(d) + np.abs(h) + np.abs(mu)) + e + ebar
    dvar = var * (3 * u + sum_error(n, u)) + delta_mu**2 + 2 * np.mean(np.abs(d) * (e + ebar), axis=-1, keepdims=True)
    eps_r = 0.5 * dvar * r * r + (2 + EXP_ULPS) * u
    eta = r * (centred + p.floor) + np.abs(xhat) * (eps_r + u)
    return eta, eps_r, r, xhat


def layer_norm(h: np.ndarray, weight: np.ndarray, bias: np.ndarray, y: np.ndarray, eps: float,
               p: Precision, input_err: np.ndarray | None = None) -> np.ndarray:
    """Allowed absolute error of y = x_hat * weight + bias (layer norm over the last dim).

    The x_hat bound of :func:`layer_norm_xhat` times |weight|; the product and the add
    round (u (|x_hat w| + |y|)); SAFETY on all of it; the store costs u(out) |y|, and
    a result near underflow p.floor.
    """
    eta, _, _, xhat = layer_norm_xhat(h, eps, p, input_err)
    aw = np.abs(weight)
    bound = aw * eta + p.compute * (np.abs(xhat) * aw + np.abs(y))
    return SAFETY * bound + p.store * np.abs(y) + p.floor


def layer_norm_grad(x: np.ndarray, weight: np.ndarray, dy: np.ndarray, dx: np.ndarray, dweight: np.ndarray,
                    dbias: np.ndarray, eps: float, p: Precision) -> dict[str, np.ndarray]:
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
    u|g| + dc2 + eta |c1| + |x_hat| dc1 plus two roundings of each of its terms, and
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
    eta, eps_r, r, xhat = layer_norm_xhat(x, eps, p)
    # The saved statistics may be held in the input dtype (torch's CPU kernel returns
    # and reuses mean and rstd in fp16/bf16): mean off by u(out) |mean|, rstd by u(out).
    # A statistic below the dtype's smallest normal number (fp16 rstd of a row with
    # std > 1.6e4) rounds to the subnormal spacing instead: an absolute error `sub`.
    mu = x.mean(axis=-1, keepdims=True)
    sub = float(torch.finfo(p.dtype).tiny) * float(torch.finfo(p.dtype).eps)
    eta = eta + sub * (r + np.abs(xhat) / r)
    saved = p.store * (r * np.abs(mu) + np.abs(xhat))  # from statistics saved in the input dtype
    eta_fp32, eta = eta, eta + saved
    eps_r = eps_r + p.store + sub / r
    n = x.shape[-1]
    g = weight * dy
    ag = np.abs(g)
    c1 = np.mean(g * xhat, axis=-1, keepdims=True)
    c2 = np.mean(g, axis=-1, keepdims=True)
    dc2 = (sum_error(n, u) + 2 * u) * np.mean(ag, axis=-1, keepdims=True)
    dc1 = np.mean(ag * eta, axis=-1, keepdims=True) + (sum_error(n, u) + 3 * u) * np.mean(
        np.abs(g * xhat), axis=-1, keepdims=True)
    t = g - c2 - xhat * c1
    dt = u * ag + dc2 + eta * np.abs(c1) + np.abs(xhat) * dc1 + 2 * u * (ag + np.abs(c2) + np.abs(xhat * c1))
    # The expanded form's coefficient b ~ rstd^3 sum(w dy x) / N underflows into fp32
    # subnormals for rows of std > ~1e12 (rstd^3 < 1e-38): an absolute error of the
    # fp32 subnormal spacing in b, which multiplies x (and mean, in c).
    sub32 = float(torch.finfo(torch.float32).tiny) * float(torch.finfo(torch.float32).eps)
    dx_bound = r * dt + (eps_r + u) * r * np.abs(t) + sub32 * (np.abs(x) + np.abs(mu))
    rows = int(np.prod(x.shape[:-1]))
    flat = lambda a: np.broadcast_to(a, x.shape).reshape(rows, n)  # noqa: E731
    ady = np.abs(flat(dy))
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
    saved_rows = (np.minimum(np.sum(t_saved, axis=0), SUM_LAMBDA * np.sqrt(np.sum(t_saved**2, axis=0)))
                  + p.store * (np.abs(np.sum(flat(dy * xhat), axis=0)) + np.abs(np.sum(flat(dy * r * mu), axis=0))))
    dw_bound = (np.sum(ady * (flat(eta_fp32) + u * np.abs(flat(xhat))), axis=0) + saved_rows
                + r_rows * np.sum(np.abs(flat(dy * xhat)), axis=0))
    db_bound = r_rows * np.sum(ady, axis=0)
    return {
        "dx": SAFETY * dx_bound + p.store * np.abs(dx) + p.floor * (1 + r * np.abs(weight)),
        "dweight": SAFETY * dw_bound + p.store * np.abs(dweight) + rows_floor,
        "dbias": SAFETY * db_bound + p.store * np.abs(dbias) + rows_floor,
    }


def dropout_input_error(x: np.ndarray, residual: np.ndarray, keep: np.ndarray, p_drop: float,
                        p: Precision) -> np.ndarray:
    """Error bound of h = where(keep, x / (1 - p_drop), 0) + residual as formed before
    the normalisation: the contract does not say where h rounds, and the plain torch
    form rounds x / (1 - p) and the sum in the input dtype (u(dtype) (|x / (1-p)| + |h|));
    a fused kernel rounds 1 / (1 - p) to fp32 and the product and sum in fp32
    (2 u(fp32) |x / (1-p)| + u(fp32) |h|). Both are covered by the larger of each term.
    """
    u_in = unit_roundoff(p.dtype)
    scaled = np.where(keep, np.abs(x) / (1.0 - p_drop), 0.0)
    h = np.where(keep, x / (1.0 - p_drop), 0.0) + residual
    return (u_in + 2 * p.compute) * scaled + max(u_in, p.compute) * np.abs(h)
