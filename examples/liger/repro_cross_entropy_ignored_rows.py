"""Liger-Kernel cross-entropy zeroes the caller's logits rows whose target is ignore_index, even without gradients.

    pip install --no-deps liger-kernel==0.8.5
    python examples/liger/repro_cross_entropy_ignored_rows.py     # on a CUDA machine

Needs only torch, triton and liger-kernel; it also shows under the Triton interpreter on
CPU (``TRITON_INTERPRET=1``). Exits 1 when the bug shows.

Why (liger_kernel/ops/cross_entropy.py, 0.8.5, ``liger_cross_entropy_kernel``): for a row
whose target is ignore_index the kernel stores 0 over the whole row of X and returns,
before and regardless of ``HAS_GRADIENTS``; X is the caller's logits tensor when it is
contiguous. Storing the gradient in X is Liger's memory trick for training; this store
also happens in an evaluation forward (no gradients), where nothing asked for it.
"""
import sys

import torch
from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    logits = torch.randn(4, 100, device=device)
    target = torch.tensor([3, -100, 7, -100], device=device)
    before = logits.clone()
    with torch.no_grad():
        LigerCrossEntropyFunction.apply(logits, target, None, -100, 0.0, 0.0, "none", None, False, False, False)
    changed = (logits != before).any(dim=1)
    print(f"rows changed by a no-grad forward: {changed.nonzero().flatten().tolist()} "
          f"(ignored rows: {(target == -100).nonzero().flatten().tolist()}); "
          f"row 1 now {logits[1, :4].tolist()}, was {before[1, :4].tolist()}")
    broken = bool(changed.any())
    print("BUG: the forward wrote into the logits" if broken else "no bug seen")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
