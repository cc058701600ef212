"""The linear_attention adapter's formula against the contract, on CPU (no Triton run).

fla's kernels do not run under the Triton interpreter (adapters.py), so this checks the
formula, not the kernels: fla's own PyTorch reference of the unnormalised numerator
(``naive_recurrent_linear_attn(normalize=False, scale=1.0)``), a key cumsum (what
``chunk_global_cumsum`` computes) and the adapter's normalisation step
(:func:`adapters.normalise`), in float64, must equal the project's NumPy reference
(references/linear_attention.py) to float64 roundoff, for both of the contract's eps. It also
shows why fla's ``normalize=True`` cannot be used as it is: its output is the contract's
with eps = 1e-10 / scale, off from the contract's eps = 1e-3 by far more than roundoff.

    PYTHONPATH=.:examples/fla python examples/fla/adapter_formula.py    (exit 0: the formula is the contract's)
"""
from __future__ import annotations

import sys

import adapters
import numpy as np
import torch
from fla.ops.linear_attn.naive import naive_recurrent_linear_attn

from tritoncheck.references import linear_attention as ref


def adapter_formula(q, k, v, eps):
    """The adapter's computation on [B, H, N, D] tensors, with fla's PyTorch reference in
    place of its numerator kernel and torch.cumsum in place of its cumsum kernel."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    numerator, _ = naive_recurrent_linear_attn(q, k, v, scale=1.0, normalize=False)
    return adapters.normalise(numerator, q, k.cumsum(1), eps).transpose(1, 2)


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    worst, fla_normalised_gap = 0.0, 0.0
    for b, h, n, d, dv in ((1, 1, 1, 1, 1), (2, 3, 37, 16, 8), (1, 2, 130, 20, 33), (2, 1, 65, 64, 5)):
        q = torch.rand(b, h, n, d, generator=gen, dtype=torch.float64)
        k = torch.rand(b, h, n, d, generator=gen, dtype=torch.float64) * 1e-3  # q . z near eps
        v = torch.randn(b, h, n, dv, generator=gen, dtype=torch.float64)
        for eps in (1e-6, 1e-3):
            expected = ref.linear_attention(q.numpy(), k.numpy(), v.numpy(), causal=True, eps=eps)
            got = adapter_formula(q, k, v, eps).numpy()
            # normwise: the recurrent reference runs in float32 (naive_recurrent_linear_attn
            # upcasts to it), and signed v gives outputs near 0 with float32-sized absolute errors
            err = float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))
            worst = max(worst, err)
            print(f"B={b} H={h} N={n} D={d} Dv={dv} eps={eps:g}: normwise error {err:.2e}")
        fla_o, _ = naive_recurrent_linear_attn(*(t.transpose(1, 2) for t in (q, k, v)), scale=d ** -0.5,
                                               normalize=True)
        contract = ref.linear_attention(q.numpy(), k.numpy(), v.numpy(), causal=True, eps=1e-3)
        gap = float(np.max(np.abs(fla_o.transpose(1, 2).numpy() - contract)) / np.max(np.abs(contract)))
        fla_normalised_gap = max(fla_normalised_gap, gap)
    print(f"adapter formula vs the contract: worst normwise error {worst:.2e} (float32 numerator)")
    print(f"fla's normalize=True (eps 1e-10 / scale) vs the contract at eps=1e-3: {fla_normalised_gap:.2e}")
    return 0 if worst < 1e-5 and fla_normalised_gap > 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
