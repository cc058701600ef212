"""fp64 references for the losses family.

- :func:`cross_entropy`: NumPy fp64, the forward reference.
- :func:`cross_entropy_torch`: PyTorch fp64, differentiable in ``logits``, written out
  (not ``F.cross_entropy``) so it is an independent check of both the kernel and torch.

Math, per row ``i`` of ``logits [M, V]``::

    m[i]    = max_j logits[i, j]                       (0 if the row has no finite max)
    lse[i]  = m[i] + log(sum_j exp(logits[i, j] - m[i]))
    loss[i] = lse[i] - logits[i, target[i]]            (exactly 0 if target[i] == ignore_index)

A row with a NaN gives NaN, a row with ``+inf`` has ``lse = +inf``, a row of only
``-inf`` has ``lse = -inf`` (loss ``-inf - -inf = NaN``).
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["cross_entropy", "cross_entropy_torch"]


def _check_target(target, v, ignore_index):
    bad = (target != ignore_index) & ((target < 0) | (target >= v))
    if bad.any():
        i = int(np.flatnonzero(np.asarray(bad))[0])
        raise ValueError(f"target[{i}] = {int(target[i])} is out of range [0, {v}) and is not ignore_index")


def cross_entropy(logits, target, ignore_index=-100):
    logits = np.asarray(logits, dtype=np.float64)
    target = np.asarray(target, dtype=np.int64)
    m_rows, v = logits.shape
    _check_target(target, v, ignore_index)
    loss = np.zeros(m_rows, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for i in range(m_rows):
            if target[i] == ignore_index:
                continue  # exactly 0
            row = logits[i]
            if np.isnan(row).any():
                loss[i] = np.nan
                continue
            m = row.max()
            if m == np.inf:
                lse = np.inf
            else:
                shift = m if np.isfinite(m) else 0.0
                lse = shift + np.log(np.sum(np.exp(row - shift)))
            loss[i] = lse - row[target[i]]
    return loss


def cross_entropy_torch(logits, target, ignore_index=-100):
    """Differentiable fp64 cross-entropy per row; ``logits`` is promoted to float64."""
    ignored = target == ignore_index
    # An ignored row's loss is the constant 0, so its gradient is exactly 0; computing its
    # lse first would send 0 * NaN back through a row of -inf logits.
    x = torch.where(ignored[:, None], 0.0, logits.to(torch.float64))
    safe_target = torch.where(ignored, torch.zeros_like(target), target)
    m = x.detach().max(dim=1, keepdim=True).values
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # lse does not depend on m
    lse = m.squeeze(1) + torch.log(torch.exp(x - m).sum(dim=1))
    picked = x.gather(1, safe_target.unsqueeze(1)).squeeze(1)
    return torch.where(ignored, torch.zeros_like(lse), lse - picked)
