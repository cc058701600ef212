"""Tolerance rule of the block-scaled low-precision GEMM (``scaled_mm``).

Pieces and notation: :mod:`tritoncheck.tolerance`. With ``A = a * a_scale`` and
``B = b * b_scale`` the dequantised operands (every element exact in fp64),
``S[m, n] = sum_k |A[m, k]| |B[k, n]|`` is the magnitude the accumulation runs over.

What a correct implementation may do, and what each step costs (u = u(fp32)):

* The products ``a b`` of two fp8 values are exact in fp32 (e4m3: 4 x 4 significant bits,
  exponents 2^-18 to 2^18; e5m2: 3 x 3 bits, 2^-32 to 2^32), of two int8 values exact in
  int32: no charge.
* The sum over K in fp32 (int8: exact in int32, then converted; the rule does not rely on
  it): ``sum_error(K) S``, whatever the order, blocked or split.
* The scales: ``(sum of a b) * (sa sb)`` is two roundings, each at most ``u`` of a term of
  ``S``; dequantising first (``a * sa`` and ``b * sb`` in fp32, then their product) is
  three: ``3 u S``. The bias added in fp32: ``u (S + |bias|)``. Together ``(4 u) S + u |bias|``.
* A declared reduced-precision fp8 accumulation (``p.fp8_accumulation = (F, L)``, CUDA only,
  fp8 formats only; ``tritoncheck/declarations.py``): inside each run of ``L`` products (the
  whole K when ``L`` is None) the tensor core keeps F fraction bits and truncates. A
  truncation toward zero is biased, so no probabilistic bound applies: each product may
  lose up to ``2^-F`` of the largest magnitude the running sum and the products reach in
  its run, at most the run's share of ``S``; over a run of ``L`` products that is
  ``L 2^-F`` of it, whether the hardware aligns every product (Khattak and Mikaitis's
  models) or truncates once per instruction (less). Charged ``min(L, K) 2^-F S``: 1.6 % of
  ``S`` at F = 13, L = 128 (Triton's sm_90 default for ``acc += tl.dot(a, b)`` with
  BLOCK_K 128), 0.4 % at L = 32 (``max_num_imprecise_acc=32``), ``K 2^-13`` without
  promotion: a kernel that accumulates all of a long K in the tensor core is checked
  loosely, and its test fails as vacuous where the allowance reaches the outputs.
* Below fp32's normals: a dequantised operand or a scaled product under fp32's smallest
  normal may be flushed on a GPU: ``tiny(fp32)`` per operand of each product, times the
  other operand's magnitude, and per product (``DOT_READ_FLOOR``; a term that does not
  scale with the units, kept for the reference's noise too).
* The store: ``p.store |c|`` (2 u(bf16) for the interpreter's truncating bf16 store), and
  ``p.floor`` for results in the output's subnormals.

SAFETY on the computed bounds, as every rule.
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck import backend
from tritoncheck.references.quantisation import dequantise
from tritoncheck.references.scaled_mm import a_groups, b_groups
from tritoncheck.tolerance import DOT_READ_FLOOR, SAFETY, Precision, float64_on, sum_error


def magnitudes(a, b, a_scale, b_scale, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(|A|, |B|, S = |A| @ |B|) in float64 on the suite's device."""
    device = device or backend.device()
    a, b = float64_on(a, device), float64_on(b, device)
    sa, sb = float64_on(a_scale, device), float64_on(b_scale, device)
    abs_a = dequantise(a, sa, a_groups(sa.shape, a.shape)).abs()
    abs_b = dequantise(b, sb, b_groups(sb.shape, b.shape)).abs()
    return abs_a, abs_b, abs_a @ abs_b


def accumulation_error(k: int, fmt: torch.dtype, p: Precision) -> float:
    """The rule's relative charge on ``S`` for the sum over K and the scales (module docstring)."""
    u = p.compute
    charge = float(sum_error(k, u)) + 4 * u
    if p.fp8_accumulation is not None and fmt.is_floating_point:
        bits, every = p.fp8_accumulation
        charge += min(every or k, k) * 2.0**-bits
    return charge


def scaled_mm(a, b, a_scale, b_scale, bias, c, fmt: torch.dtype, p: Precision) -> np.ndarray:
    """Allowed absolute error of each element of ``c`` (the module docstring derives it)."""
    device = backend.device()
    abs_a, abs_b, s = magnitudes(a, b, a_scale, b_scale, device)
    k = abs_a.shape[1]
    bias_term = 0.0 if bias is None else p.compute * float64_on(bias, device).abs()[None, :]
    flushed = DOT_READ_FLOOR * (abs_a.sum(1)[:, None] + abs_b.sum(0)[None, :] + k)
    bound = SAFETY * (accumulation_error(k, fmt, p) * s + bias_term + flushed)
    return (bound + p.store * float64_on(c, device).abs() + p.floor).cpu().numpy()
