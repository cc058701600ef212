"""Tolerance core: the rounding units, sum bounds and floors every family's rules use.

The rules (``properties/<family>_tolerance.py``) bound each output's distance from the
fp64 reference by first-order rounding-error bounds built from these pieces. Notation:

* ``u``: unit roundoff, half the machine epsilon: fp64 2^-53, fp32 2^-24, fp16 2^-11,
  bf16 2^-8, tf32 2^-11. ``p.store``: storing an fp32 result in the output dtype,
  ``u(out) |y|`` (2 u for the interpreter's truncating fp32 -> bf16 store).
* ``p.compute``: fp32 arithmetic (the contract's "accumulate in fp32"), u(fp32) per
  operation; ``tl.exp`` on NVIDIA GPUs (``ex2.approx`` after a product with log2(e))
  costs ``EXP_ULPS u`` plus ``u |argument|``.
* ``p.dot``: per product of a ``tl.dot``: on fp32 inputs tf32 on NVIDIA GPUs unless the
  kernel declares ``input_precision="ieee"`` (operands rounded to tf32: 2 u(tf32)), fp32
  under the interpreter. Sums: :func:`sum_error`; near underflow: :func:`underflow_floor`.

A tolerance is widened only with the derivation of the missing term beside the rule; why
the previous rule was wrong belongs in the commit message.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from tritoncheck import backend

# * SAFETY = 2: first-order bounds drop products of two rounding errors (n^2 u^2 for a sum
#   of n terms, below 1e-3 of the first-order term while n u < 1e-3) and fix one order of
#   operations where a correct kernel may reassociate (blocked sums, fused multiply-adds);
#   2 covers both (flash-attention's tests allow a kernel the same factor over PyTorch). A
#   rule whose second-order term is not small carries it explicitly.
# * EXP_ULPS = 4: expf and exp2f are 2 ulp, logf 1 ulp (CUDA C++ Programming Guide), times
#   SAFETY once; the fast path's argument-dependent error is charged apart, u |argument|.
# * SUM_LAMBDA = 5: Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019, Thm 2.4): a sum of
#   n terms with independent rounding errors exceeds lambda sqrt(n) u with probability at
#   most 2 exp(-lambda^2 / 2); under SAFETY lambda acts as 10: 2 exp(-50) = 3.9e-22 a sum.
SAFETY = 2.0
EXP_ULPS = 4.0  # relative error of exp / exp2 / log in units of u(fp32), GPU approx paths included
SUM_LAMBDA = 5.0

_U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
U_TF32 = 2.0**-11
U32 = _U[torch.float32]


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2 of a float dtype (the float8 formats included: e4m3 2^-4, e5m2 2^-3)."""
    if dtype in _U:
        return _U[dtype]
    if not dtype.is_floating_point:
        raise ValueError(f"no unit roundoff known for {dtype}")
    return float(torch.finfo(dtype).eps) / 2


def underflow_floor(dtype: torch.dtype) -> float:
    """Absolute error allowed near underflow: rounding into the dtype's subnormals errs by
    up to their spacing, and an fp32 intermediate below fp32's smallest normal may be
    flushed to zero (GPU FTZ): the larger of the two."""
    info = torch.finfo(dtype)
    return max(float(info.tiny) * float(info.eps), float(torch.finfo(torch.float32).tiny))


def sum_error(n, u: float = U32):
    """Relative error bound of a sum of ``n`` same-sign terms: ``(log2 n + SUM_LAMBDA sqrt n) u``,
    the tree bound plus the probabilistic one (SUM_LAMBDA, above). Any order gives at most
    ``n u`` (Higham, Accuracy and Stability, 2nd ed., eq. 4.4), a tree or blocked sum
    (``tl.sum``, blocked loops) ``(log2 n + n / block) u``. ``n`` an int, a NumPy array or a
    tensor (the result of the same kind)."""
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
    # the implementation's op-specific declarations (OpSpec.declarations), for the rules that
    # depend on one (an RMSNorm's rms_norm_cast): (name, value) pairs
    declared: tuple[tuple[str, Any], ...] = ()
    # an fp8 tl.dot's reduced-precision accumulation on the GPU, (fraction bits, products between
    # promotions to fp32 or None for never): declared_fp8_accumulation; None: fp32 accumulation
    fp8_accumulation: tuple[int, int | None] | None = None

    def declared_value(self, name: str, default: Any = None) -> Any:
        """The value of the implementation's declaration ``name`` (``default`` when not declared)."""
        return dict(self.declared).get(name, default)

    @classmethod
    def of(cls, dtype: torch.dtype, backend: str, fp32_dot_precision: str | None = None) -> "Precision":
        store = unit_roundoff(dtype)
        if backend == "interpret" and dtype == torch.bfloat16:
            # The interpreter truncates fp32 -> bf16 (one ulp: 2 u) and garbles bf16
            # subnormals by less than fp32's smallest normal, which the floor covers.
            store *= 2
        dot = U32
        if dtype == torch.float32 and backend == "cuda" and fp32_dot_precision != "ieee":
            # Triton's default on NVIDIA, assumed for an undeclared kernel: tf32 for fp32 tl.dot.
            dot = 2 * U_TF32
        return cls(dtype=dtype, backend=backend, store=store, compute=U32, dot=dot, floor=underflow_floor(dtype))


U64 = _U[torch.float64]


def reference_precision(p: Precision) -> Precision:
    """The rounding units of the fp64 reference, for the rule that gave ``p``'s allowance.

    A rule bounds an implementation's error by its unit roundoffs times the computation's
    condition and accumulation (the magnitudes of the terms, sum lengths, exponent
    errors). The fp64 reference performs the same computation on the same rounded inputs
    with every operation in fp64, so the same rule with every unit (store, compute, dot,
    the input dtype's: ``dtype`` is float64) set to u(fp64) = 2^-53 and fp64's subnormal
    spacing as the floor bounds the reference's own error: below it an expected value is
    0 within the reference's noise (a constant upstream gradient, whose exact softmax
    gradient is 0, leaves 1e-17 there). Terms of a rule that do not scale with the units
    (GPU flush allowances, ``DOT_READ_FLOOR``) stay, a bound for every fp64 order too.
    """
    info = torch.finfo(torch.float64)
    return replace(p, dtype=torch.float64, store=U64, compute=U64, dot=U64, floor=float(info.tiny) * float(info.eps),
                   fp8_accumulation=None)


def ulp(values, dtype: torch.dtype):
    """Spacing of ``dtype`` at each value (the subnormal spacing below the smallest normal);
    ``values`` a NumPy array or a torch tensor (the result is of the same kind)."""
    info = torch.finfo(dtype)
    mant = round(-np.log2(float(info.eps)))  # explicit mantissa bits: 52, 23, 10, 7; e4m3 3, e5m2 2
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

    "tf32x3" splits each fp32 operand into tf32 high and low parts (a = a_hi + a_lo + r,
    |r| <= 2^-22 |a|) and sums three tf32 products (hi hi, hi lo, lo hi) in fp32: the
    dropped lo lo product and the two residuals are each about 2^-22 relative, so
    ~ 3 * 2^-22 < 2^-21 per product. It applies to every input dtype, since the kernel's
    fp32 intermediates (scores Q K^T, the state S) are not exact in tf32. (``Precision.of``
    treats any other CUDA declaration but "ieee" as tf32.) Interpreter: ``p`` unchanged.
    """
    if p.backend == "cuda" and fp32_dot_precision == "tf32x3":
        return replace(p, dot=TF32X3_DOT)
    return p


def declared_fp8_accumulation(p: Precision, declared: dict | None) -> Precision:
    """``p`` with the fp8 accumulation a kernel declares (``fp8_accumulation``, validated in
    ``tritoncheck/declarations.py``) on CUDA, where the tensor core's fp8 MMA keeps fewer bits
    than fp32 (DeepSeek-V3 reports about 14 on the H800; Triton's tl.dot on sm_90 accumulates
    a whole K loop that way unless told ``max_num_imprecise_acc``). The interpreter computes
    fp8 dots in fp32: ``p`` unchanged. ``properties/scaled_mm_tolerance.py`` charges it."""
    if p.backend != "cuda" or not declared:
        return p
    return replace(p, fp8_accumulation=(declared["fraction_bits"], declared["promote_every"]))


# A dot operand below fp32's smallest normal may be read as another value within about
# that much (GPU FTZ; the interpreter's bf16 subnormal conversion on loads and stores; a
# "tf32x3" dot drops the subnormal low part a - tf32(a) of an operand within 2^11 of it):
# each product of a dot may err by DOT_READ_FLOOR times the other operand.
DOT_READ_FLOOR = float(torch.finfo(torch.float32).tiny)
