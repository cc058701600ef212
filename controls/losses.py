"""Plain-PyTorch control for the losses family, as a user would write it; the suite must pass it.

``torch_cross_entropy`` upcasts the logits to float32 before ``F.cross_entropy`` (what
users and most training code do: the contract's loss is float32, and fp16 logsumexp
over a long vocabulary is not something anyone writes on purpose). The only extra is
the contract's validation: ``F.cross_entropy`` raises ``IndexError`` on CPU, and a
device-side assert that kills the process on CUDA, for a target out of range; the
contract asks for a ``ValueError`` naming ``target``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["torch_cross_entropy"]


def torch_cross_entropy(logits, target, ignore_index=-100):
    if target.dtype != torch.int64:
        raise TypeError(f"target must have dtype torch.int64, got {target.dtype}")
    if logits.dim() != 2 or tuple(target.shape) != (logits.shape[0],):
        raise ValueError(f"target must have shape ({logits.shape[0]},) for logits [M, V], got {tuple(target.shape)}")
    bad = (target != ignore_index) & ((target < 0) | (target >= logits.shape[1]))
    if bool(bad.any()):
        raise ValueError(f"target has a value out of range [0, {logits.shape[1]}) that is not ignore_index")
    return F.cross_entropy(logits.float(), target, ignore_index=ignore_index, reduction="none")


torch_cross_entropy.dtypes = (torch.float32, torch.float16, torch.bfloat16)
torch_cross_entropy.supports_backward = True
