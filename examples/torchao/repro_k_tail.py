"""torchao 0.18.0's blockwise fp8 training GEMMs (triton_fp8_gemm_1x128_128x128 and
triton_fp8_gemm_1x128_128x1) read past K when K is not a multiple of the 128 block: the
masks of the K loop compare ``offs_k < K`` without the block's offset, so the last block's
loads run into the next row of a (the next column of b). No assertion refuses such a K.

Needs torch, triton and torchao only. On a GPU as it is; on a CPU with TRITON_INTERPRET=1.
Prints the relative error for K = 256 (fine) and K = 300 (wrong); exit 1 when the bug shows.
"""
import os
import sys

import torch
from torchao.prototype.blockwise_fp8_training import kernels

device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") == "0" else "cpu"
torch.manual_seed(0)


def quantise(x, rows, cols):
    """fp8 e4m3 values and one float32 scale per [rows, cols] block (amax / 448)."""
    m, n = x.shape
    s = torch.zeros(-(-m // rows), -(-n // cols))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            s[i, j] = x[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols].abs().max() / 448
    full = s.repeat_interleave(rows, 0)[:m].repeat_interleave(cols, 1)[:, :n]
    return (x / full).to(torch.float8_e4m3fn), s, full


worst = 0.0
for k in (256, 300):
    m, n = 64, 64
    x, w = torch.randn(m, k), torch.randn(k, n)
    a, a_s, a_full = quantise(x, 1, 128)
    b, b_s, b_full = quantise(w, 128, 128)
    want = (a.double() * a_full.double()) @ (b.double() * b_full.double())
    c = kernels.triton_fp8_gemm_1x128_128x128(
        a.to(device), b.t().contiguous().t().to(device), a_s.t().contiguous().t().to(device),
        b_s.t().contiguous().t().to(device), 128, torch.float32)
    rel = float((c.double().cpu() - want).abs().max() / want.abs().max())
    print(f"K = {k}: max |c - exact| / max |exact| = {rel:.3g}")
    if k % 128:
        worst = rel
sys.exit(1 if worst > 1e-2 else 0)
