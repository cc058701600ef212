"""Tolerance core: the rounding units, sum bounds and floors every family's rules use.

The rules themselves live beside their families: ``properties/softmax_tolerance.py``,
``attention_tolerance.py``, ``norms_tolerance.py``, ``losses_tolerance.py``,
``elementwise_tolerance.py``, ``linear_attention_tolerance.py``. Each says how far
from the fp64 reference an output may be, per element, from the pieces below.

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

A tolerance is never widened to turn a test green without a sentence beside the rule
saying why the old rule was wrong.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from tritoncheck import backend

# Where the three constants come from:
# * SAFETY = 2: first-order bounds drop products of two rounding errors (n^2 u^2 for a sum
#   of n terms, below 1e-3 of the first-order term while n u < 1e-3) and fix one order of
#   operations; a correct kernel may reassociate (blocked sums, fused multiply-adds). A
#   factor 2 on the first-order bound covers both, the same factor flash-attention's tests
#   allow a kernel over PyTorch's own error. Where a second-order term is not small (a
#   rule's relative error bound itself near 1), the rule carries it explicitly.
# * EXP_ULPS = 4: the CUDA C++ Programming Guide's accuracy tables give expf and exp2f
#   2 ulp and logf 1 ulp over the full range; the fast paths tl.exp lowers to (a multiply
#   by log2(e), then ex2.approx) add an argument-dependent error that the rules charge
#   separately as u |argument|. 4 ulp is that 2 ulp with SAFETY's factor 2 applied once.
# * SUM_LAMBDA = 5: Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019, Theorem 2.4): with
#   independent rounding errors a sum of n terms errs by more than lambda sqrt(n) u only
#   with probability at most 2 exp(-lambda^2 / 2), 7.5e-6 at lambda = 5. Rules multiply it
#   by SAFETY, so the probabilistic part acts at lambda = 10: 2 exp(-50) = 3.9e-22 per sum.
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


def sum_error(n, u: float = U32):
    """Relative error bound of a sum of ``n`` same-sign terms (see the module docstring);
    ``n`` an int, a NumPy array or a torch tensor (the result is of the same kind)."""
    if isinstance(n, torch.Tensor):
        n = n.to(torch.float64).clamp(min=1)
        return u * (torch.log2(n) + SUM_LAMBDA * torch.sqrt(n))
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
    rms_norm_cast: str = "after_weight"  # where an RMSNorm rounds to the input dtype (declared_cast)

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



def ulp(values, dtype: torch.dtype):
    """Spacing of ``dtype`` at each value (the subnormal spacing below the smallest normal);
    ``values`` a NumPy array or a torch tensor (the result is of the same kind)."""
    info = torch.finfo(dtype)
    mant = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
    if isinstance(values, torch.Tensor):
        mag = values.to(torch.float64).abs().clamp(min=float(info.tiny))
        mag = torch.where(torch.isfinite(mag), mag, float(info.max))
        # frexp: mag = m 2^x with m in [0.5, 1), so floor(log2(mag)) = x - 1 exactly
        return torch.exp2((torch.frexp(mag).exponent - 1 - mant).to(torch.float64))
    mag = np.maximum(np.abs(values), float(info.tiny))
    with np.errstate(divide="ignore", invalid="ignore"):
        exp = np.floor(np.log2(np.where(np.isfinite(mag), mag, float(info.max))))
    return np.exp2(exp - mant)


def float64_on(x, device=None) -> torch.Tensor:
    """``x`` (a NumPy array, tensor or number) as a float64 tensor on ``device`` (default: the
    suite's, the GPU when there is one), where the rules and comparisons are evaluated. A
    read-only NumPy view (np.broadcast_to) is copied: torch does not take read-only memory."""
    if device is None:
        device = backend.device()
    if isinstance(x, torch.Tensor):
        return x.detach().to(device=device, dtype=torch.float64)
    a = np.asarray(x, dtype=np.float64)
    if not a.flags.writeable:
        a = a.copy()
    return torch.as_tensor(a, device=device)


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


def declared_cast(p: Precision, rms_norm_cast: str | None) -> Precision:
    """``p`` with the RMSNorm cast an implementation declares (``rms_norm_cast``, validated
    in ``tritoncheck/declarations.py``; undeclared: ``"after_weight"``, one rounding). The
    RMSNorm rules (``properties/rms_norm_tolerance.py``) add the rounding of the
    normalised row to the input dtype where it is ``"before_weight"``."""
    return replace(p, rms_norm_cast=rms_norm_cast) if rms_norm_cast is not None else p


# A dot operand below fp32's smallest normal may be read as another value within about
# that much: GPUs flush subnormals to zero, and the Triton interpreter converts bf16
# subnormals to fp32 wrongly (1.38e-39 is read as 1.03e-38, 1.3e-40 as 0; seen on Triton
# 3.9, on loads and on stores), and a 3-pass tf32 dot ("tf32x3") loses the low part
# a - tf32(a) of an operand within 2^11 of it (that part is subnormal). Each product
# of a dot may so err by DOT_READ_FLOOR times the other operand.
DOT_READ_FLOOR = float(torch.finfo(torch.float32).tiny)
