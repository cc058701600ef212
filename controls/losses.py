"""Plain-PyTorch controls for the losses family, as a user would write them; the suite must pass them.

``torch_cross_entropy`` upcasts the logits to float32 before ``F.cross_entropy`` (what
users and most training code do: the contract's loss is float32, and fp16 logsumexp
over a long vocabulary is not something anyone writes on purpose).
``torch_cross_entropy_input_dtype`` runs ``F.cross_entropy`` on the logits as they come
(PyTorch's own float16/bfloat16 path: log_softmax stored in the logits' dtype, the
backward in that dtype) and returns the loss in float32 as the contract asks.
``stored_gradient_cross_entropy`` is the fused-kernel strategy (Liger-Kernel's): the
forward computes ``softmax - onehot`` in float32 and stores it in the logits' dtype; the
backward only scales that stored gradient by the upstream gradient, in the logits'
dtype: two roundings in that dtype, both correct.

The only extra in each is the contract's validation: ``F.cross_entropy`` raises
``IndexError`` on CPU, and a device-side assert that kills the process on CUDA, for a
target out of range; the contract asks for a ``ValueError`` naming ``target``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tritoncheck.declarations import ExpectedFailure

__all__ = ["torch_cross_entropy", "torch_cross_entropy_input_dtype", "stored_gradient_cross_entropy"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _validate(logits, target, ignore_index) -> None:
    if target.dtype != torch.int64:
        raise TypeError(f"target must have dtype torch.int64, got {target.dtype}")
    if logits.dim() != 2 or tuple(target.shape) != (logits.shape[0],):
        raise ValueError(f"target must have shape ({logits.shape[0]},) for logits [M, V], got {tuple(target.shape)}")
    bad = (target != ignore_index) & ((target < 0) | (target >= logits.shape[1]))
    if bool(bad.any()):
        raise ValueError(f"target has a value out of range [0, {logits.shape[1]}) that is not ignore_index")


def torch_cross_entropy(logits, target, ignore_index=-100):
    _validate(logits, target, ignore_index)
    return F.cross_entropy(logits.float(), target, ignore_index=ignore_index, reduction="none")


def torch_cross_entropy_input_dtype(logits, target, ignore_index=-100):
    _validate(logits, target, ignore_index)
    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="none").float()


class _StoredGradientCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index):
        x = logits.float()
        lse = torch.logsumexp(x, dim=-1)
        live = target != ignore_index
        safe = torch.where(live, target, torch.zeros_like(target))
        loss = torch.where(live, lse - x.gather(1, safe[:, None])[:, 0], torch.zeros_like(lse))
        grad = torch.softmax(x, dim=-1)
        grad[torch.arange(x.shape[0], device=x.device)[live], safe[live]] -= 1.0
        grad[~live] = 0.0
        ctx.save_for_backward(grad.to(logits.dtype))  # the first rounding in the logits' dtype
        return loss

    @staticmethod
    def backward(ctx, dloss):
        (grad,) = ctx.saved_tensors
        # the product in float32 (dloss is float32), stored: the second rounding
        return (grad.float() * dloss[:, None]).to(grad.dtype), None, None


def stored_gradient_cross_entropy(logits, target, ignore_index=-100):
    _validate(logits, target, ignore_index)
    return _StoredGradientCrossEntropy.apply(logits, target, ignore_index)


for _fn in (torch_cross_entropy, torch_cross_entropy_input_dtype, stored_gradient_cross_entropy):
    _fn.dtypes = _DTYPES
    _fn.supports_backward = True
    _fn.uses_triton = False

# Registry data (tritoncheck/registry.py): checks this control is expected to fail, with why.
_LOSS_IN_INPUT_DTYPE = (
    "F.cross_entropy on float16/bfloat16 logits returns the loss rounded to the logits' dtype "
    "(u(dtype) |loss|: 0.0022 on a loss of 7.58 in float16, 43x the float32 allowance); the contract "
    "asks for a float32 loss. Its gradient passes"
)
torch_cross_entropy_input_dtype.expected_failures = (
    ExpectedFailure("matches_reference", _LOSS_IN_INPUT_DTYPE),
    ExpectedFailure("shift_invariant", _LOSS_IN_INPUT_DTYPE),
    ExpectedFailure("calls_independent", _LOSS_IN_INPUT_DTYPE),  # each of its two calls is compared
    # Seen in the rule audit on an H200 (17 of 40 targeted examples), not in 10 draws: not strict.
    ExpectedFailure("gradients_match_reference", (
        "on CUDA in float16: NaN in the gradient where the logits are near float16's largest value "
        "(PyTorch's own float16 log_softmax backward computes in the logits' dtype, as this control "
        "declares it does)"), dtypes=("float16",), backends=("cuda",), strict=False),
)
