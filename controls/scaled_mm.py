"""Plain-PyTorch controls for the block-scaled low-precision GEMM, as a user would write them;
the suite must pass them.

``dequantised_matmul`` dequantises both operands into float32 (``a.float() * a_scale``, one
rounding per element) and multiplies them with ``torch.matmul`` in float32 (PyTorch's default
matmul precision is full fp32, no TF32). ``blockwise_matmul`` is the block-scaled algorithm:
for each block of 128 along K, the float32 product of the raw values (exact: fp8 products are
exact in fp32, and so are sums of 128 int8 products, below 2^24) scaled by that block's
``a_scale`` and ``b_scale``, summed over the blocks in float32. Both take the contract's
whole domain, every format and scale layout.
"""
from __future__ import annotations

import torch

from tritoncheck.references.quantisation import SCALE_BLOCK, expand
from tritoncheck.references.scaled_mm import a_groups, b_groups

__all__ = ["dequantised_matmul", "blockwise_matmul"]

_FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)


def _scales(a, b, a_scale, b_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Every element's scale, float32 (the scales as given, broadcast to the operands)."""
    return (expand(a_scale, a.shape, a_groups(a_scale.shape, a.shape)),
            expand(b_scale, b.shape, b_groups(b_scale.shape, b.shape)))


def _finish(c: torch.Tensor, bias, out_dtype) -> torch.Tensor:
    return (c if bias is None else c + bias.float()).to(out_dtype)


def dequantised_matmul(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
    sa, sb = _scales(a, b, a_scale, b_scale)
    return _finish((a.float() * sa) @ (b.float() * sb), bias, out_dtype)


def blockwise_matmul(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
    sa, sb = _scales(a, b, a_scale, b_scale)
    c = torch.zeros((a.shape[0], b.shape[1]), dtype=torch.float32, device=a.device)
    for k0 in range(0, a.shape[1], SCALE_BLOCK):
        part = a[:, k0:k0 + SCALE_BLOCK].float() @ b[k0:k0 + SCALE_BLOCK].float()
        c += part * (sa[:, k0:k0 + 1] * sb[k0:k0 + 1, :])  # one scale per row (column) inside a block
    return _finish(c, bias, out_dtype)


for _fn in (dequantised_matmul, blockwise_matmul):
    _fn.dtypes = _FORMATS
    _fn.supports_backward = False
    _fn.uses_triton = False
