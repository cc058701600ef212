"""Liger-Kernel rope rotates the wrong rows when seq_len == 1 and q is contiguous as [B, H, S, D].

    pip install --no-deps liger-kernel==0.8.5
    python examples/liger/repro_rope_single_token.py             # on a CUDA machine

Needs only torch, triton and liger-kernel (not this suite); it also shows under the
Triton interpreter on CPU (``TRITON_INTERPRET=1``). Rotates q of shape [B, H, S, D] with
S = 1 (one token per sequence: a decoding step) and S = 2, compares with float64 PyTorch,
and exits 1 when the bug shows.

Why (liger_kernel/ops/rope.py, 0.8.5): ``rope_forward`` takes ``q.transpose(1, 2)``
([B, S, H, D]), calls ``.contiguous()`` and launches one program per (batch, token) row
with ``q.stride(1)`` as the row stride. For S = 1 a [B, H, 1, D] tensor that is
contiguous stays contiguous after the transpose (a size-1 dim does not count), so no
copy is made and ``stride(1)`` is the stride of the size-1 dim: D, not H * D. Program b
then starts at element b * D instead of b * H * D, so for B > 1 and H > 1 some
(batch, head) rows are rotated twice and others not at all (seen: 6 of 8 wrong at
B = 2, H = 4), and because no copy was made the kernel writes into the caller's q
(also for B = 1, where the values happen to be right). A q that reaches rope as ``view(B, S, H, D).transpose(1, 2)``, the
usual Hugging Face layout, has the right stride and does not show it.
"""
import sys

import torch
from liger_kernel.ops.rope import LigerRopeFunction


def rope64(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF Llama rope in float64: halves (q[:D/2], q[D/2:]), tables of width D / 2."""
    d = q.shape[-1]
    c, s = torch.cat((cos, cos), -1).double(), torch.cat((sin, sin), -1).double()
    q = q.double()
    return q * c + torch.cat((-q[..., d // 2:], q[..., : d // 2]), -1) * s


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU run with TRITON_INTERPRET=1
    torch.manual_seed(0)
    broken = False
    for b, h, s, d in ((2, 4, 1, 64), (2, 4, 2, 64)):
        q = torch.randn(b, h, s, d, device=device)  # contiguous [B, H, S, D]
        k = torch.randn(b, 1, s, d, device=device)
        angle = torch.rand(s, d // 2, device=device) * 6
        cos, sin = angle.cos(), angle.sin()
        want = rope64(q, cos, sin)
        q_in = q.clone()
        got, _ = LigerRopeFunction.apply(q_in, k, cos, sin, None, 1, d)
        err = (got.double() - want).abs().amax(dim=(-1, -2)).cpu()  # per (batch, head)
        wrong = [(i, j) for i in range(b) for j in range(h) if err[i, j] > 1e-4]
        wrote = not torch.equal(q_in, q)
        print(f"q {[b, h, s, d]}: max |y - fp64| = {err.max().item():.3g}, (batch, head) wrong: {wrong or 'none'}, "
              f"caller's q overwritten: {wrote}")
        broken |= bool(wrong) or wrote
    print("BUG: rope at seq_len 1 rotates with the wrong row stride and writes into q" if broken else "no bug seen")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
