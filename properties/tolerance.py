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

import math
from dataclasses import dataclass

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
            store *= 2  # the interpreter truncates fp32 -> bf16 stores
        dot = U32
        if dtype == torch.float32 and backend == "cuda" and fp32_dot_precision != "ieee":
            # Triton's default on NVIDIA: tf32 for fp32 tl.dot (an undeclared kernel is assumed to use it).
            dot = 2 * U_TF32
        info = torch.finfo(dtype)
        floor = max(float(info.tiny) * float(info.eps), float(torch.finfo(torch.float32).tiny))
        return cls(dtype=dtype, backend=backend, store=store, compute=U32, dot=dot, floor=floor)


# ---------------------------------------------------------------------------- softmax

def softmax_exponent_error(x: np.ndarray, temperature: float, p: Precision) -> tuple[np.ndarray, np.ndarray]:
    """Bound E_i on the error of log y_i, and the exact log y_i, for y = softmax(x / T).

    z_i = x_i / T rounds: in fp32 inside a kernel, but ``torch.softmax(x / t)``, the
    way users write it, rounds z in the input dtype, so for T != 1 the rule allows
    u(input) |z_i| (and the same for the max m); for T == 1 the division is exact.
    z_i - m rounds (u |z_i - m|); exp adds EXP_ULPS u plus u |z_i - m| from the
    log2(e) scaling; the sum s of n positive terms adds sum_error(n); the division
    adds u. Each is an error in log y_i. Entries that are -inf are exactly 0 and drop
    out of n (a separate, exact check covers them).
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        z = x / temperature
        finite = np.isfinite(z)
        zf = np.where(finite, z, 0.0)
        m = np.max(np.where(finite, z, -np.inf), axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        log_y = np.where(finite, zf - m, -np.inf) - np.log(np.sum(np.where(finite, np.exp(zf - m), 0.0),
                                                                   axis=-1, keepdims=True))
    n = finite.sum(axis=-1, keepdims=True)
    divide = (unit_roundoff(p.dtype) if temperature != 1 else 0.0) * (np.abs(zf) + np.abs(m))
    exponent = np.abs(zf) + np.abs(m) + 2 * np.abs(zf - m)
    err = SAFETY * (divide + p.compute * (exponent + EXP_ULPS + 1) + sum_error(n, p.compute))
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
    rounded on the way (the division by T in the input dtype, the store).
    """
    a = softmax(x, y, temperature, p)
    n = np.isfinite(x).sum(axis=-1, keepdims=True)
    inner = np.sum(dy * y, axis=-1, keepdims=True)
    inner_err = np.sum(np.abs(dy) * a + np.abs(dy * y) * sum_error(n, p.compute), axis=-1, keepdims=True)
    bound = (a * (np.abs(dy - inner) + inner_err) + np.abs(y) * inner_err) / temperature
    return SAFETY * bound + 2 * p.store * np.abs(dx) + p.floor


def row_sum(allowed: np.ndarray) -> np.ndarray:
    """Allowed deviation of a row sum from its exact value: the sum of the per-element
    allowances (errors can all lean one way) plus the fp64 summation of the check."""
    n = allowed.shape[-1]
    return allowed.sum(axis=-1) + n * unit_roundoff(torch.float64)


def ulp(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Spacing of ``dtype`` at each value (the subnormal spacing below the smallest normal)."""
    info = torch.finfo(dtype)
    mant = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
    mag = np.maximum(np.abs(values), float(info.tiny))
    with np.errstate(divide="ignore", invalid="ignore"):
        exp = np.floor(np.log2(np.where(np.isfinite(mag), mag, float(info.max))))
    return np.exp2(exp - mant)


def headroom_text(ratio: float) -> str:
    return "inf" if not math.isfinite(ratio) else f"{ratio:.3g}"


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
    finite, m, _, _, _, _ = _cross_entropy_parts(logits)
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
             + SAFETY * u * (2 * np.abs(np.where(finite, arg, 0.0)) + EXP_ULPS))
        p_err = np.minimum(1.0, np.exp(arg + e)) * -np.expm1(-e)
        g = np.exp(arg) - onehot
    dl = np.abs(np.asarray(dloss, dtype=np.float64))[:, None]
    dx = np.where(np.isfinite(dlogits), np.abs(dlogits), 0.0)
    allowed = dl * (p_err + SAFETY * u * np.abs(g)) + SAFETY * u * dx + p.store * dx + p.floor
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
    """
    u_in = unit_roundoff(p.dtype)
    u_cast = u_in if (table_dtype != p.dtype and p.dtype != torch.float32) else 0.0
    xa, xb = x[..., 0::2], x[..., 1::2]
    prod = np.empty_like(x)
    prod[..., 0::2] = np.abs(xa * cos) + np.abs(xb * sin)
    prod[..., 1::2] = np.abs(xa * sin) + np.abs(xb * cos)
    return SAFETY * (u_cast + u_in) * prod + p.store * np.abs(y) + 3 * p.floor


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
    s, one_minus, e = _swiglu_sigmoid_parts(g)
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
    (|dt/dgate| <= 1).
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
