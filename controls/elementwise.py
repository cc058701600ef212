"""Plain-PyTorch controls for the elementwise family, computed in the input dtype as a
user would write them; the suite must pass them.

``torch_rope`` applies the contract's formulas to the even/odd strided views of ``x``
with ``cos``/``sin`` cast to ``x``'s dtype; ``torch_swiglu`` is ``F.silu(gate) * up``.
Both add the contract's argument checks (odd D, mismatched shapes) so that bad input
raises ``ValueError``/``TypeError`` instead of a broadcasting error or silent broadcast.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["torch_rope", "torch_swiglu"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def torch_rope(x, cos, sin):
    if x.dim() != 4 or x.shape[-1] % 2 != 0:
        raise ValueError(f"x must be [B, H, S, D] with D even, got shape {tuple(x.shape)}")
    s, d = x.shape[2], x.shape[3]
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (s, d // 2):
            raise ValueError(f"{name} must have shape ({s}, {d // 2}), got {tuple(t.shape)}")
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    y_even = x_even * cos - x_odd * sin
    y_odd = x_even * sin + x_odd * cos
    return torch.stack((y_even, y_odd), dim=-1).flatten(-2)


torch_rope.dtypes = _DTYPES
torch_rope.supports_backward = True


def torch_swiglu(gate, up):
    if gate.dtype != up.dtype:
        raise TypeError(f"up has dtype {up.dtype} but gate has dtype {gate.dtype}; they must match")
    if gate.shape != up.shape:
        raise ValueError(f"up has shape {tuple(up.shape)} but gate has shape {tuple(gate.shape)}; they must match")
    return F.silu(gate) * up


torch_swiglu.dtypes = _DTYPES
torch_swiglu.supports_backward = True

