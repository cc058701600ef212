"""The Triton tutorial's grouped GEMM (adapters.py's re-typing) computes its tile offsets in
int32: ``offs_m * lda`` and ``ldc * offs_m`` come from ``tl.arange`` and int32 loads, so one GEMM
of the group whose a or c passes 2**31 elements reads and writes elsewhere past that row. A
mixture-of-experts layer meets it at an expert's gate/up output: T k / E tokens times 2I.

One GEMM, a [4.2M, 128] @ b [128, 512] (c: 2.15G elements, 4.3 GB in fp16), rows on both sides
of element 2**31 of c compared with torch.matmul. Exit 1 while a row past it is wrong. GPU only
(about 9 GB of memory).

    python examples/triton_grouped_gemm/repro_int32_offsets.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapters import group_gemm  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (about 9 GB free)")
        return 2
    n, k = 512, 128
    m = 2**31 // n + 4096
    a = torch.randn((m, k), device="cuda", dtype=torch.float16)
    b = torch.randn((k, n), device="cuda", dtype=torch.float16) / k**0.5
    (c,) = group_gemm([a], [b])
    boundary = 2**31 // n
    wrong = []
    for row in (0, boundary - 1, boundary, boundary + 1, m - 1):
        want = (a[row].float() @ b.float())
        err = float((c[row].float() - want).abs().max())
        print(f"row {row:8d} (element {row * n:11d}): max |error| {err:.3g}")
        if err > 1e-2 * float(want.abs().max()) + 1e-2:
            wrong.append(row)
    print(f"{torch.__version__=} {torch.cuda.get_device_name()}; rows wrong: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
