"""Plain-PyTorch controls for fused linear cross-entropy, as a user would write them; the
suite must pass them.

``torch_linear_cross_entropy`` materialises the logits: ``x @ weight.T`` upcast to float32,
the softcap in float32, then ``F.cross_entropy`` with the reduction (autograd does the rest).
``chunked_torch_linear_cross_entropy`` never holds more than ``[N, chunk_size]`` logits at a
time in the forward: an online logsumexp over vocabulary chunks in float32
(``torch.logaddexp``), the target's logit gathered from the chunk that holds it, and
autograd through all of it; it declares ``chunk_sizes`` so the chunk-size check has a
correct implementation to pass besides the kernel.

The only extra in each is the contract's validation of the targets: ``F.cross_entropy``
raises ``IndexError`` on CPU, and a device-side assert that kills the process on CUDA, for a
target out of range; the contract asks for a ``ValueError`` naming ``target``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["torch_linear_cross_entropy", "chunked_torch_linear_cross_entropy"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CHUNKS = (16, 64)


def _validate(x, weight, target, ignore_index, reduction) -> None:
    if target.dtype != torch.int64:
        raise TypeError(f"target must have dtype torch.int64, got {target.dtype}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if x.dim() != 2 or weight.dim() != 2 or tuple(target.shape) != (x.shape[0],):
        raise ValueError(f"target must have shape ({x.shape[0]},) for x [N, H], got {tuple(target.shape)}")
    bad = (target != ignore_index) & ((target < 0) | (target >= weight.shape[0]))
    if bool(bad.any()):
        raise ValueError(f"target has a value out of range [0, {weight.shape[0]}) that is not ignore_index")


def _cap(z: torch.Tensor, softcap: float) -> torch.Tensor:
    return softcap * torch.tanh(z / softcap) if softcap > 0 else z


def torch_linear_cross_entropy(x, weight, target, ignore_index=-100, softcap=0.0, reduction="mean"):
    _validate(x, weight, target, ignore_index, reduction)
    z = _cap(x.float() @ weight.float().T, softcap)
    return F.cross_entropy(z, target, ignore_index=ignore_index, reduction=reduction)


def chunked_torch_linear_cross_entropy(x, weight, target, ignore_index=-100, softcap=0.0, reduction="mean",
                                       chunk_size=64):
    _validate(x, weight, target, ignore_index, reduction)
    if chunk_size not in _CHUNKS:
        raise ValueError(f"chunk_size must be one of {_CHUNKS}, got {chunk_size!r}")
    x32 = x.float()
    live = target != ignore_index
    safe = torch.where(live, target, torch.zeros_like(target))
    lse = torch.full((x.shape[0],), float("-inf"), device=x.device)
    picked = torch.zeros((x.shape[0],), device=x.device)
    for start in range(0, weight.shape[0], chunk_size):
        z = _cap(x32 @ weight[start:start + chunk_size].float().T, softcap)
        lse = torch.logaddexp(lse, torch.logsumexp(z, dim=-1))
        inside = (safe >= start) & (safe < start + z.shape[1])
        local = (safe - start).clamp(0, z.shape[1] - 1)
        picked = picked + torch.where(inside, z.gather(1, local[:, None])[:, 0], 0.0)
    rows = torch.where(live, lse - picked, 0.0)
    if reduction == "none":
        return rows
    return rows.sum() if reduction == "sum" else rows.sum() / live.sum()


for _fn in (torch_linear_cross_entropy, chunked_torch_linear_cross_entropy):
    _fn.dtypes = _DTYPES
    _fn.supports_backward = True
    _fn.uses_triton = False
    _fn.fp32_dot_precision = "ieee"  # torch's fp32 matmul: full fp32 unless allow_tf32 is set
chunked_torch_linear_cross_entropy.chunk_sizes = _CHUNKS
