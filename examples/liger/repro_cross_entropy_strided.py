"""Liger-Kernel cross-entropy returns dlogits = logits * grad_output for logits whose last dim is not unit-stride.

    pip install --no-deps liger-kernel==0.8.5
    python examples/liger/repro_cross_entropy_strided.py          # on a CUDA machine

Needs only torch, triton and liger-kernel (not this suite); it also shows under the
Triton interpreter on CPU (``TRITON_INTERPRET=1``). Prints the largest gradient
error of Liger's cross-entropy against float64 PyTorch for contiguous logits and for
the same values seen through a transposed view, and exits 1 when the bug shows.

Why (liger_kernel/ops/cross_entropy.py, 0.8.5): ``cross_entropy_forward`` replaces a
logits tensor whose last dim is not unit-stride with ``_input.contiguous()``; inside an
autograd Function's forward grad mode is off, so the copy has ``requires_grad=False``
and the kernel is launched with ``HAS_GRADIENTS=False``: it never writes the gradient
into the copy, and the backward scales the untouched copy (the logits) by grad_output.
"""
import sys

import torch
from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction


def liger_grad(logits: torch.Tensor, target: torch.Tensor, dloss: torch.Tensor) -> torch.Tensor:
    x = logits.detach().requires_grad_(True)
    loss = LigerCrossEntropyFunction.apply(x, target, None, -100, 0.0, 0.0, "none", None, False, False, False)[0]
    (grad,) = torch.autograd.grad(loss, x, dloss)
    return grad


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU run with TRITON_INTERPRET=1
    torch.manual_seed(0)
    rows, vocab = 4, 1000
    storage = torch.randn(vocab, rows, device=device)
    strided = storage.t()  # [rows, vocab], stride (1, rows): the last dim is not unit-stride
    contiguous = strided.contiguous()
    target = torch.randint(0, vocab, (rows,), device=device)
    dloss = torch.rand(rows, device=device) + 0.5

    x64 = contiguous.double().requires_grad_(True)
    loss64 = torch.nn.functional.cross_entropy(x64, target, reduction="none")
    (want,) = torch.autograd.grad(loss64, x64, dloss.double())

    broken = False
    for name, logits in (("contiguous", contiguous.clone()), ("transposed view", strided)):
        original = logits.double()  # a copy: Liger writes the gradient into contiguous logits in place
        got = liger_grad(logits, target, dloss)
        err = (got.double() - want).abs().max().item()
        as_logits = (got.double() - original * dloss.double()[:, None]).abs().max().item()
        print(f"{name:>16}: stride {tuple(logits.stride())}, max |dlogits - fp64| = {err:.3g}, "
              f"max |dlogits - logits * dloss| = {as_logits:.3g}")
        broken |= err > 1e-4
    print("BUG: dlogits is logits * grad_output for the transposed view" if broken else "no bug seen")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
