"""fp64 references for the block-scaled low-precision GEMM.

- :func:`scaled_mm`: NumPy fp64.
- :func:`scaled_mm_torch`: PyTorch fp64 (the suite runs it where the inputs are: on a GPU
  the reference's GEMM runs there); the two are cross-checked in tests/test_registry.py.

Math (``a [M, K]``, ``b [K, N]`` in one format, float32 scales; the scale layouts are
``references/quantisation.py``'s)::

    A = a * a_scale      a_scale [1 or M, 1 or ceil(K / 128)]       (per tensor, row, 1 x 128 block)
    B = b * b_scale      b_scale [1 or ceil(K / 128), 1 or N or ceil(N / 128)]   (per tensor, column, 128 x 128 or 128 x 1 block)
    c = A @ B (+ bias)   exactly, in fp64; ``out_dtype`` is the implementation's rounding, not the reference's

Every product of two fp8 or int8 values and every float32 scale is exact in fp64, and a
sum of K of them loses at most K u(fp64) of their magnitudes: the reference is the exact
product of the dequantised operands to far below any rule's allowance.
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.references.quantisation import SCALE_BLOCK, dequantise, groups

__all__ = ["scaled_mm", "scaled_mm_torch", "a_groups", "b_groups"]


def a_groups(a_scale_shape, shape) -> tuple[int | None, int | None]:
    """a_scale's groups: a row each (or all rows), a block of 128 along K each (or all of K)."""
    return groups(a_scale_shape, shape, ((1,), (SCALE_BLOCK,)), "a_scale")


def b_groups(b_scale_shape, shape) -> tuple[int | None, int | None]:
    """b_scale's groups: a block of 128 along K each (or all of K); a column or a block of
    128 columns each (or all columns)."""
    return groups(b_scale_shape, shape, ((SCALE_BLOCK,), (1, SCALE_BLOCK)), "b_scale")


def scaled_mm(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
    """The exact product of the dequantised operands, plus ``bias`` (NumPy fp64)."""
    a, b = np.asarray(a), np.asarray(b)
    a_scale, b_scale = np.asarray(a_scale, dtype=np.float64), np.asarray(b_scale, dtype=np.float64)
    c = dequantise(a, a_scale, a_groups(a_scale.shape, a.shape)) @ dequantise(b, b_scale,
                                                                              b_groups(b_scale.shape, b.shape))
    return c if bias is None else c + np.asarray(bias, dtype=np.float64)[None, :]


def scaled_mm_torch(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
    """:func:`scaled_mm` in PyTorch fp64, on the inputs' device."""
    c = dequantise(a, a_scale, a_groups(a_scale.shape, a.shape)) @ dequantise(b, b_scale,
                                                                              b_groups(b_scale.shape, b.shape))
    return c if bias is None else c + bias.to(torch.float64)[None, :]
