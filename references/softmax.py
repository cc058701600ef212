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
    """The same in fp64 PyTorch, differentiable: exp(d - logsumexp(d)), d = z - max z.

    The max is subtracted first, exactly as in :func:`softmax`: exp(z - logsumexp(z))
    rounds z - lse with an error of u(fp64) |z|, which for logits near fp32's max is
    1e22, so two tied logits of 1.7e38 came out as y = [1, 1] instead of [0.5, 0.5]."""
    z = x.to(torch.float64) / temperature
    m = z.detach().amax(dim=-1, keepdim=True)
    d = z - torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return torch.exp(d - torch.logsumexp(d, dim=-1, keepdim=True))
