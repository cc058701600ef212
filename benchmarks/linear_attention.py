"""Time causal linear attention on CUDA: the chunked Triton kernel vs plain PyTorch.

    python benchmarks/linear_attention.py [--n 4096] [--d 64] [--dtypes float16,float32]

Compares, per (B, H) and dtype, at N = 4096, D = Dv = 64 by default:
  * triton-chunked: ``tritoncheck.kernels.linear_attention.linear_attention(causal=True)`` for each chunk size;
  * torch-cumsum:   ``tritoncheck.controls.linear_attention.torch_linear_attention(causal=True)``
                    (einsum + cumsum in the input dtype, O(N D Dv) memory);
  * torch-loop:     the naive per-token recurrence in PyTorch (input dtype, N steps).
Times are medians of ``triton.testing.do_bench`` (ms). Also prints the max error of each
against an fp64 evaluation on the GPU (relative to max |o|). Not a test.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def torch_loop(q, k, v, eps=1e-6):
    """Causal linear attention one token at a time (the definition), in the input dtype."""
    B, H, N, D = q.shape
    S = q.new_zeros(B, H, D, v.shape[-1])
    z = q.new_zeros(B, H, D)
    out = []
    for i in range(N):
        S = S + k[:, :, i, :, None] * v[:, :, i, None, :]
        z = z + k[:, :, i]
        num = (q[:, :, i, :, None] * S).sum(2)
        den = (q[:, :, i] * z).sum(-1, keepdim=True) + eps
        out.append(num / den)
    return __import__("torch").stack(out, dim=2)


def main() -> int:
    import torch

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("benchmarks/linear_attention.py needs a CUDA GPU (and TRITON_INTERPRET unset); "
              "none found, nothing timed.", file=sys.stderr)
        return 2
    import triton.testing

    from tritoncheck.controls.linear_attention import torch_linear_attention
    from tritoncheck.kernels.linear_attention import linear_attention

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--dtypes", default="float16,bfloat16,float32")
    p.add_argument("--no-loop", action="store_true", help="skip the slow per-token loop")
    args = p.parse_args()

    N, D = args.n, args.d
    print(f"device: {torch.cuda.get_device_name()}  N={N} D=Dv={D}  (ms, median of do_bench; err = max|o - o64| / max|o64|)")
    header = f"{'dtype':9} {'B':>2} {'H':>2} | " + " ".join(
        f"{'chunk' + str(c):>10}" for c in linear_attention.chunk_sizes
    ) + f" | {'cumsum':>10} {'loop':>10} | {'err chunk':>9} {'err cumsum':>10} {'err loop':>9}"
    print(header)
    print("-" * len(header))
    for dtname in args.dtypes.split(","):
        dtype = getattr(torch, dtname)
        for B, H in ((1, 4), (1, 8), (2, 4), (2, 8)):
            g = torch.Generator(device="cuda").manual_seed(0)
            q = torch.nn.functional.elu(torch.randn(B, H, N, D, device="cuda", generator=g)) + 1
            k = torch.nn.functional.elu(torch.randn(B, H, N, D, device="cuda", generator=g)) + 1
            v = torch.randn(B, H, N, D, device="cuda", generator=g)
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
            ref = torch_linear_attention(q.double(), k.double(), v.double(), causal=True)
            scale = ref.abs().max().item()

            def err(o):
                return (o.double() - ref).abs().max().item() / scale

            times = []
            for c in linear_attention.chunk_sizes:
                times.append(triton.testing.do_bench(
                    lambda c=c: linear_attention(q, k, v, causal=True, chunk_size=c), return_mode="median"))
            e_chunk = err(linear_attention(q, k, v, causal=True))
            try:
                t_cum = triton.testing.do_bench(lambda: torch_linear_attention(q, k, v, causal=True), return_mode="median")
                e_cum = err(torch_linear_attention(q, k, v, causal=True))
            except torch.OutOfMemoryError:
                t_cum, e_cum = float("nan"), float("nan")
            if args.no_loop:
                t_loop, e_loop = float("nan"), float("nan")
            else:
                t_loop = triton.testing.do_bench(lambda: torch_loop(q, k, v), warmup=1, rep=1, return_mode="median")
                e_loop = err(torch_loop(q, k, v))
            print(f"{dtname:9} {B:>2} {H:>2} | " + " ".join(f"{t:10.3f}" for t in times)
                  + f" | {t_cum:10.3f} {t_loop:10.1f} | {e_chunk:9.2e} {e_cum:10.2e} {e_loop:9.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
