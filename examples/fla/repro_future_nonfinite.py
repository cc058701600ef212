"""fla's fused_chunk_linear_attn: an inf or NaN in v at a later position makes earlier causal outputs NaN.

    pip install --no-deps fla-core==0.6.0 einops
    python examples/fla/repro_future_nonfinite.py                 # on a CUDA machine

Needs only torch, triton and fla-core (not this suite). Causal linear attention
``o_i = sum_{j <= i} (q_i . k_j) v_j`` must not depend on v_j for j > i. With one
non-finite entry in v at position 1, fla returns NaN in row 0 of the same 64-token chunk,
in the columns of the non-finite entries; rows of earlier chunks are unaffected. The
script compares row 0 with and without the change and exits 1 when it moved.

Why (fla/ops/common/fused_chunk.py, fused_chunk_fwd_kernel, fla-core 0.6.0): inside a
chunk the scores are masked by multiplication, ``b_s *= m_s & m_t``, and then multiplied
with the chunk's values, ``tl.dot(b_s, b_v)``: the masked score 0 times v_j = inf is NaN,
and the dot sums it into o_i. Where it matters: a non-finite value at token t (an fp16
overflow in a projection, uninitialised memory in a padded tail) then shows as NaN in
the outputs of tokens before t as well, so the first NaN no longer points at its cause;
a causal kernel can keep the future out by multiplying only the finite part of V and
adding non-finite entries' terms where j <= i (this suite's kernels/linear_attention.py
does so).
"""
import sys

import torch
import torch.nn.functional as F
from fla.ops.linear_attn import fused_chunk_linear_attn


def row0(q, k, v) -> torch.Tensor:
    o, _ = fused_chunk_linear_attn(q, k, v, scale=1.0, normalize=False)  # [B, T, H, Dv]
    return o[:, 0].float().cpu()


def main() -> int:
    torch.manual_seed(0)
    B, T, H, D = 1, 2, 1, 16  # fla's layout [B, T, H, D]; T = 2: position 1 is row 0's future
    q, k = (F.elu(torch.randn(B, T, H, D, device="cuda")) + 1 for _ in range(2))
    v = torch.randn(B, T, H, D, device="cuda")
    clean = row0(q, k, v)
    bad = False
    for name, value in (("inf", float("inf")), ("nan", float("nan"))):
        changed = v.clone()
        changed[:, 1, :, 0] = value  # one entry at position 1
        got = row0(q, k, changed)
        moved = ~((got == clean) | (got.isnan() & clean.isnan()))
        print(f"v[:, 1, :, 0] = {name}: row 0 changed in {int(moved.sum())} of {moved.numel()} elements "
              f"(o[0, 0, 0, 0] {clean[0, 0, 0].item():.6g} -> {got[0, 0, 0].item():.6g})")
        bad |= bool(moved.any())
    finite = v.clone()
    finite[:, 1] = torch.randn_like(finite[:, 1]) * 100  # a finite change stays out of row 0
    print(f"finite change at position 1: row 0 bitwise unchanged: {torch.equal(row0(q, k, finite), clean)}")
    print("BUG: a later position's non-finite v reached row 0" if bad else "row 0 kept the future out")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
