"""fp64 references for RMSNorm and residual add + RMSNorm.

- :func:`rms_norm`, :func:`add_rms_norm`: NumPy fp64, the forward references.
- :func:`rms_norm_torch`, :func:`add_rms_norm_torch`: PyTorch fp64, differentiable,
  written out (not ``F.rms_norm``) so that they check torch too.

Math (over the last dim, ``N`` elements)::

    y = x / sqrt(sum(x^2) / N + eps) * weight
    add_rms_norm: h = x + residual, y = rms_norm(h)

The references form ``h`` exactly; the contract rounds it to the input dtype, and that
one rounding is in the tolerance rules (``properties/rms_norm_tolerance.py``), which
know the dtype, as is the rounding of the normalised row where an implementation
declares ``rms_norm_cast = "before_weight"``.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["rms_norm", "add_rms_norm", "rms_norm_torch", "add_rms_norm_torch"]


def rms_norm(x, weight, eps=1e-6):
    x = np.asarray(x, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    ms = (x * x).mean(axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * weight


def add_rms_norm(x, residual, weight, eps=1e-6):
    h = np.asarray(x, dtype=np.float64) + np.asarray(residual, dtype=np.float64)
    return rms_norm(h, weight, eps), h


def rms_norm_torch(x, weight, eps=1e-6):
    """Differentiable fp64 RMSNorm; inputs are promoted to float64."""
    x = x.to(torch.float64)
    ms = (x * x).mean(dim=-1, keepdim=True)
    return x / torch.sqrt(ms + eps) * weight.to(torch.float64)


def add_rms_norm_torch(x, residual, weight, eps=1e-6):
    h = x.to(torch.float64) + residual.to(torch.float64)
    return rms_norm_torch(h, weight, eps), h
