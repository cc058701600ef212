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
