"""fp64 reference for softmax with temperature."""
from __future__ import annotations

import numpy as np
import torch


def softmax(x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(x / T) over the last axis, in float64.

    Subtracting the row max keeps exp() in range; a row whose max is -inf (all
    entries -inf) gives NaN, as torch.softmax does.
    """
    z = np.asarray(x, dtype=np.float64) / temperature
    with np.errstate(invalid="ignore"):
        m = np.max(z, axis=-1, keepdims=True)
        e = np.exp(z - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def softmax_torch(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The same in fp64 PyTorch, differentiable: exp(z - logsumexp(z))."""
    z = x.to(torch.float64) / temperature
    return torch.exp(z - torch.logsumexp(z, dim=-1, keepdim=True))
