"""fp64 references for fused linear cross-entropy.

- :func:`linear_cross_entropy`: NumPy fp64, the forward reference.
- :func:`linear_cross_entropy_torch`: PyTorch fp64, differentiable in ``x`` and ``weight``,
  written out on top of the losses family's own fp64 cross-entropy (not ``F.cross_entropy``).

Math (``x [N, H]``, ``weight [V, H]``, ``target [N]``)::

    z    = x @ weight.T, then softcap * tanh(z / softcap) where softcap > 0
    row  = cross_entropy(z, target, ignore_index)      (references/losses.py: 0 on ignored rows)
    loss = row ("none"), sum(row) ("sum"), sum(row) / #(target != ignore_index) ("mean";
           NaN when every row is ignored, as F.cross_entropy)

The references materialise the logits: they are the oracle, on the suite's small cases.
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.references import losses

__all__ = ["linear_cross_entropy", "linear_cross_entropy_torch", "logits", "reduce"]


def logits(x, weight, softcap=0.0):
    """The fp64 logits x @ weight.T, softcapped where softcap > 0 (NumPy)."""
    z = np.asarray(x, dtype=np.float64) @ np.asarray(weight, dtype=np.float64).T
    return softcap * np.tanh(z / softcap) if softcap > 0 else z


def reduce(rows, target, ignore_index, reduction):
    """The contract's reduction of per-row losses (NumPy or torch)."""
    if reduction == "none":
        return rows
    total = rows.sum()
    if reduction == "sum":
        return total
    count = (target != ignore_index).sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count


def linear_cross_entropy(x, weight, target, ignore_index=-100, softcap=0.0, reduction="mean"):
    target = np.asarray(target, dtype=np.int64)
    rows = losses.cross_entropy(logits(x, weight, softcap), target, ignore_index)
    return np.asarray(reduce(rows, target, ignore_index, reduction), dtype=np.float64)


def linear_cross_entropy_torch(x, weight, target, ignore_index=-100, softcap=0.0, reduction="mean"):
    """Differentiable fp64 fused linear cross-entropy; ``x`` and ``weight`` promoted to float64."""
    z = x.to(torch.float64) @ weight.to(torch.float64).T
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    rows = losses.cross_entropy_torch(z, target, ignore_index)
    return reduce(rows, target, ignore_index, reduction)
