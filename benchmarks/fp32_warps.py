"""The project's float32 kernels at 4 and 8 warps: compile seconds and run time on CUDA
(a script that prints a table, not a test).

    python benchmarks/fp32_warps.py

float32's ``tl.dot(..., input_precision="ieee")`` is FMA code unrolled per thread, so a
kernel's compile time grows with its tile's multiply-adds per thread: attention's and
linear cross-entropy's kernels launch float32 at 8 warps for that (the comments at
``kernels/attention.py: _FP32_WARPS`` and ``kernels/linear_cross_entropy.py: NUM_WARPS``).
This prints, per kernel family and warp count, the seconds a fresh Triton cache took to
compile what one forward and backward call launches, and the median time of a forward and
backward call after (``triton.testing.do_bench``, ms). Sizes: attention B 2, H 8, N 2048,
D 64, causal; linear cross-entropy N 4096, H 1024, V 32000.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _attention_call(torch):
    from tritoncheck.kernels.attention import attention
    q, k, v = (torch.randn(2, 8, 2048, 64, device="cuda", requires_grad=True) for _ in range(3))
    grad = torch.randn(2, 8, 2048, 64, device="cuda")

    def call():
        o, _ = attention(q, k, v, causal=True)
        o.backward(grad)
    return call


def _lce_call(torch):
    from tritoncheck.kernels.linear_cross_entropy import linear_cross_entropy
    x = torch.randn(4096, 1024, device="cuda", requires_grad=True)
    w = (torch.randn(32000, 1024, device="cuda") / 32).requires_grad_()
    t = torch.randint(0, 32000, (4096,), device="cuda")

    def call():
        linear_cross_entropy(x, w, t).backward()
    return call


def main() -> int:
    import torch
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    import triton
    import triton.testing

    from tritoncheck.kernels import attention as attention_module
    from tritoncheck.kernels import linear_cross_entropy as lce_module

    print(f"device: {torch.cuda.get_device_name()}; Triton {triton.__version__}; float32")
    print(f"{'kernels':<22} {'warps':>5} {'compile s':>10} {'fwd+bwd ms':>11}")
    for name, module, warps_name, make in (("attention", attention_module, "_FP32_WARPS", _attention_call),
                                           ("linear_cross_entropy", lce_module, "NUM_WARPS", _lce_call)):
        for warps in (4, 8):
            setattr(module, warps_name, warps)  # read at each launch
            with tempfile.TemporaryDirectory() as cache:
                os.environ["TRITON_CACHE_DIR"] = cache  # Triton's knobs read it at each compile
                for kernel in _kernels(module):
                    kernel.device_caches.clear()
                call = make(torch)
                torch.cuda.synchronize()
                start = time.perf_counter()
                call()
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - start
                ms = triton.testing.do_bench(call)
            print(f"{name:<22} {warps:>5} {compile_s:>10.2f} {ms:>11.3f}", flush=True)
    return 0


def _kernels(module):
    from triton.runtime.jit import JITFunction
    return [v for v in vars(module).values() if isinstance(v, JITFunction)]


if __name__ == "__main__":
    raise SystemExit(main())
