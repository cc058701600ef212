"""Plain-PyTorch controls for RMSNorm, one per casting mode; the suite must pass them.

- ``*_llama``: the Hugging Face ``LlamaRMSNorm``: the statistics in fp32, ``x * rstd``
  rounded to the input dtype, then multiplied by the weight in it. Declares
  ``rms_norm_cast = "before_weight"``.
- ``*_fp32``: everything in fp32 and one rounding at the end. Declares
  ``rms_norm_cast = "after_weight"``.

``h = x + residual`` is formed in the input dtype, as a model's residual stream is.
"""
from __future__ import annotations

import torch

__all__ = ["torch_rms_norm_llama", "torch_rms_norm_fp32", "torch_add_rms_norm_llama", "torch_add_rms_norm_fp32"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _rstd(x32: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)


def torch_rms_norm_llama(x, weight, eps=1e-6):
    x32 = x.float()
    return weight * (x32 * _rstd(x32, eps)).to(x.dtype)


def torch_rms_norm_fp32(x, weight, eps=1e-6):
    x32 = x.float()
    return (x32 * _rstd(x32, eps) * weight.float()).to(x.dtype)


def torch_add_rms_norm_llama(x, residual, weight, eps=1e-6):
    h = x + residual
    return torch_rms_norm_llama(h, weight, eps), h


def torch_add_rms_norm_fp32(x, residual, weight, eps=1e-6):
    h = x + residual
    return torch_rms_norm_fp32(h, weight, eps), h


for _fn, _cast in ((torch_rms_norm_llama, "before_weight"), (torch_rms_norm_fp32, "after_weight"),
                   (torch_add_rms_norm_llama, "before_weight"), (torch_add_rms_norm_fp32, "after_weight")):
    _fn.dtypes = DTYPES
    _fn.supports_backward = True
    _fn.uses_triton = False
    _fn.rms_norm_cast = _cast
