"""fp64 references for the norms family.

- :func:`layer_norm`: NumPy fp64, the forward reference.
- :func:`dropout_residual_layer_norm_given_keep`: NumPy fp64 forward of the fused
  dropout + residual + layer norm built from a *given* keep mask. The mask of a kernel
  comes from its own RNG (Philox in Triton), so the suite takes ``keep`` from the
  implementation under test and checks ``y`` given that mask; the mask itself is
  checked by properties (keep fraction, reproducibility).
- :func:`layer_norm_torch`: PyTorch fp64, differentiable, written out (not
  ``F.layer_norm``) so it is an independent check of both the kernel and of torch.

Math (over the last dim, ``N`` elements, biased variance)::

    mean = sum(x) / N
    var  = sum((x - mean)^2) / N
    y    = (x - mean) / sqrt(var + eps) * weight + bias
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["layer_norm", "dropout_residual_layer_norm_given_keep", "layer_norm_torch"]


def layer_norm(x, weight, bias, eps=1e-5):
    x = np.asarray(x, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    bias = np.asarray(bias, dtype=np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    x_hat = centred / np.sqrt(var + eps)
    return x_hat * weight + bias


def dropout_residual_layer_norm_given_keep(x, residual, weight, bias, p, keep, eps=1e-5):
    """``h = where(keep, x / (1 - p), 0) + residual``; returns ``layer_norm(h)`` (fp64)."""
    x = np.asarray(x, dtype=np.float64)
    residual = np.asarray(residual, dtype=np.float64)
    keep = np.asarray(keep, dtype=bool)
    h = np.where(keep, x / (1.0 - p), 0.0) + residual
    return layer_norm(h, weight, bias, eps)


def dropout_residual_layer_norm_given_keep_torch(x, residual, weight, bias, p, keep, eps=1e-5):
    """:func:`dropout_residual_layer_norm_given_keep` in float64 torch on the inputs' device."""
    x, residual = x.to(torch.float64), residual.to(torch.float64)
    keep = torch.as_tensor(keep, device=x.device).to(torch.bool)
    h = torch.where(keep, x / (1.0 - p), 0.0) + residual
    return layer_norm_torch(h, weight, bias, eps)


def layer_norm_torch(x, weight, bias, eps=1e-5):
    """Differentiable fp64 layer norm; inputs are promoted to float64."""
    x = x.to(torch.float64)
    weight = weight.to(torch.float64)
    bias = bias.to(torch.float64)
    mean = x.mean(dim=-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dim=-1, keepdim=True)
    return centred / torch.sqrt(var + eps) * weight + bias
