"""PyTorch findings on CUDA, reproduced in a few lines (docs/third-party/torch.md).

1. F.scaled_dot_product_attention's cuDNN backend lets a masked key through once its
   score is large: q = e_0, k_1 = big * e_0, a boolean mask hiding key 1 from row 0.
   Row 0 must return v_0 = 1; a backend that masks with a finite bias returns v_1 = -7.
2. Every backend gives NaN for a row whose masked-out key holds NaN in k.
   The mirror case: row 0's one visible key scores -1e17 (k_0 = -1e17 e_0); the hidden
   key's finite bias is larger, so it wins and row 0 returns v_1.
3. With deterministic algorithms on, a boolean-index assignment into a permuted view
   (x[..., mask, :] = y[..., mask, :]) writes to other positions than torch.where does.
5. Last, since it breaks the process's CUDA context: float32 q whose storage starts 33
   elements (132 bytes, not a multiple of 16) into its buffer, with a boolean mask: the
   default and EFFICIENT_ATTENTION backends stop with "CUDA error: misaligned address"
   instead of falling back to a kernel that takes the layout (MATH does).

Exit status 1 if any of them shows.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

if not torch.cuda.is_available():
    sys.exit("needs a CUDA GPU")
BACKENDS = (SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION)
found = False
mask = torch.tensor([[True, False], [True, True]], device="cuda")  # row 0 must not see key 1
for dtype in (torch.bfloat16, torch.float16):
    for big in (1e3, 1e6) if dtype == torch.bfloat16 else (1e3, 6e4):
        q = torch.zeros(1, 1, 2, 16, device="cuda", dtype=dtype)
        q[..., 0] = 1
        k = torch.zeros_like(q)
        k[0, 0, 1, 0] = big
        v = torch.tensor([[1.0] * 16, [-7.0] * 16], device="cuda", dtype=dtype).view(1, 1, 2, 16)
        for backend in BACKENDS:
            try:
                with sdpa_kernel([backend]):
                    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)[0, 0, 0, 0].item()
            except RuntimeError:
                continue  # backend not available for these inputs
            print(f"1. {dtype} masked score {big:g}, {backend.name}: row 0 = {got:g} (want 1)")
            found |= got != 1.0
q = torch.zeros(1, 1, 2, 16, device="cuda", dtype=torch.bfloat16)
q[..., 0] = 1
k = torch.zeros_like(q)
k[0, 0, 0, 0] = -1e17  # row 0's one visible key
v = torch.tensor([[1.0] * 16, [-7.0] * 16], device="cuda", dtype=torch.bfloat16).view(1, 1, 2, 16)
for backend in BACKENDS:
    try:
        with sdpa_kernel([backend]):
            got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)[0, 0, 0, 0].item()
    except RuntimeError:
        continue
    print(f"1. bfloat16 visible score -1e17, {backend.name}: row 0 = {got:g} (want 1)")
    found |= got != 1.0
for dtype in (torch.float32, torch.bfloat16):
    q, k, v = (torch.randn(1, 1, 2, 16, device="cuda", dtype=dtype) for _ in range(3))
    k[0, 0, 1] = float("nan")
    for backend in BACKENDS:
        try:
            with sdpa_kernel([backend]):
                row = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0, 0, 0]
        except RuntimeError:
            continue
        print(f"2. {dtype} NaN in masked key 1, {backend.name}: row 0 has NaN: {bool(row.isnan().any())}")
        found |= bool(row.isnan().any())
for deterministic in (False, True):
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    base = torch.randn(2, 2, 1, 64, device="cuda").permute(0, 2, 1, 3)  # [B, H, N, D] view of [B, N, H, D]
    fresh = torch.randn(2, 1, 2, 64, device="cuda")
    cols = torch.tensor([True, False], device="cuda")
    new = base.clone()
    new[..., cols, :] = fresh[..., cols, :]
    same = torch.equal(new, torch.where(cols[:, None], fresh, base))
    print(f"3. deterministic algorithms {deterministic}: boolean-index assignment equals torch.where: {same}")
    found |= not same
torch.use_deterministic_algorithms(False)
buffer = torch.randn(33 + 2048 * 24, device="cuda")
q = buffer[33:].view(1, 1, 2048, 24)  # storage offset 33 floats: 132 bytes
k, v = (torch.randn(1, 1, 513, 24, device="cuda") for _ in range(2))
causal = torch.arange(513, device="cuda")[None, :] <= torch.arange(2048, device="cuda")[:, None] + 513 - 2048
try:
    F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
    torch.cuda.synchronize()
    print("5. float32 q at storage offset 33, default backend: ran")
except RuntimeError as exc:  # torch.AcceleratorError is a RuntimeError
    print(f"5. float32 q at storage offset 33, default backend: {str(exc).splitlines()[0]}")
    found = True
sys.exit(1 if found else 0)
