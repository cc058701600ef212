"""Plain-PyTorch controls for the norms family, computed in the input dtype.

These are what a user would write; the suite must pass them.

``torch_dropout_residual_layer_norm`` draws its keep mask from torch's RNG seeded
with ``seed`` (a ``torch.Generator`` on the input's device), so its mask is *not* the
Triton kernel's Philox mask; it is still reproducible per seed, and the suite checks
``y`` against the reference built from the returned ``keep``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["torch_layer_norm", "torch_dropout_residual_layer_norm"]


def torch_layer_norm(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


torch_layer_norm.dtypes = (torch.float32, torch.float16, torch.bfloat16)
torch_layer_norm.supports_backward = True


def torch_dropout_residual_layer_norm(x, residual, weight, bias, p, seed, eps=1e-5):
    if not 0 <= p < 1:
        raise ValueError(f"p must satisfy 0 <= p < 1, got {p}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    gen = torch.Generator(device=x.device)
    gen.manual_seed(seed)
    keep = torch.rand(x.shape, generator=gen, device=x.device) >= p
    h = torch.where(keep, x / (1 - p), torch.zeros((), dtype=x.dtype, device=x.device)) + residual
    y = F.layer_norm(h, (x.shape[-1],), weight, bias, eps)
    return y, keep


torch_dropout_residual_layer_norm.dtypes = (torch.float32, torch.float16, torch.bfloat16)
torch_dropout_residual_layer_norm.supports_backward = False
