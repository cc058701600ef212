"""fp64 references for the elementwise family (rope, swiglu).

- :func:`rope`, :func:`swiglu`: NumPy fp64 forward references.
- :func:`rope_torch`, :func:`swiglu_torch`: PyTorch fp64, differentiable, written out
  (no ``F.silu``/``torch.sigmoid``), independent of the kernels.

rope, ``x [B, H, S, D]``, ``cos``/``sin`` ``[S, D // 2]``, interleaved pairs::

    y[..., 2i]   = x[..., 2i] cos[s, i] - x[..., 2i+1] sin[s, i]
    y[..., 2i+1] = x[..., 2i] sin[s, i] + x[..., 2i+1] cos[s, i]

swiglu, elementwise::

    sigmoid(g) = 1 / (1 + exp(-g))      (evaluated as exp(-|g|) so nothing overflows)
    y = gate * sigmoid(gate) * up
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["rope", "swiglu", "rope_torch", "swiglu_torch"]


def rope(x, cos, sin):
    x = np.asarray(x, dtype=np.float64)
    cos = np.asarray(cos, dtype=np.float64)  # [S, D/2], broadcasts over B and H
    sin = np.asarray(sin, dtype=np.float64)
    if x.shape[-1] % 2 != 0:
        raise ValueError(f"x's head dim D = {x.shape[-1]} must be even")
    x_even = x[..., 0::2]
    x_odd = x[..., 1::2]
    y = np.empty_like(x)
    y[..., 0::2] = x_even * cos - x_odd * sin
    y[..., 1::2] = x_even * sin + x_odd * cos
    return y


def _sigmoid_np(g):
    e = np.exp(-np.abs(g))
    return np.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def swiglu(gate, up):
    gate = np.asarray(gate, dtype=np.float64)
    up = np.asarray(up, dtype=np.float64)
    if gate.shape != up.shape:
        raise ValueError(f"up has shape {up.shape} but gate has shape {gate.shape}")
    with np.errstate(invalid="ignore"):
        return gate * _sigmoid_np(gate) * up


def rope_torch(x, cos, sin):
    """Differentiable fp64 rope (in ``x``; also in ``cos``/``sin``, which the kernel does not need)."""
    x = x.to(torch.float64)
    cos = cos.to(torch.float64)
    sin = sin.to(torch.float64)
    x_even = x[..., 0::2]
    x_odd = x[..., 1::2]
    y_even = x_even * cos - x_odd * sin
    y_odd = x_even * sin + x_odd * cos
    return torch.stack((y_even, y_odd), dim=-1).flatten(-2)  # re-interleave


def swiglu_torch(gate, up):
    """Differentiable fp64 swiglu. Both branches of the stable sigmoid are finite, so
    ``torch.where`` passes no NaN gradient from the unselected one."""
    g = gate.to(torch.float64)
    u = up.to(torch.float64)
    e = torch.exp(-torch.abs(g))
    s = torch.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return g * s * u
