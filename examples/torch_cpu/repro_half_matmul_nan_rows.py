"""A NaN in one row of A reaches another row of A @ B: torch's CPU matmul in bfloat16
and float16 (torch 2.13.0+cpu, MKL-DNN 3.12, AVX512), not in float32.

Row 0 of A is e_0 and B is all ones, so row 0 of A @ B is exactly 1 whatever the other
rows of A hold. Exit 1 while a half-precision product returns anything else there.

    python examples/torch_cpu/repro_half_matmul_nan_rows.py
"""
import sys

import torch


def row_zero(m: int, inner: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    a = torch.zeros(m, inner, dtype=dtype)
    a[0, 0] = 1.0
    a[1] = float("nan")  # one other row
    b = torch.ones(inner, n, dtype=dtype)
    return (a @ b)[0]


def main() -> int:
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    leaked = False
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for m, inner, n in ((2, 16, 16), (64, 16, 16), (64, 65, 16), (65, 65, 64)):
            row = row_zero(m, inner, n, dtype)
            ok = bool((row == 1).all())
            leaked |= not ok
            print(f"{str(dtype)[6:]:9s} A [{m}, {inner}] @ B [{inner}, {n}]: row 0 = {row[0].item()} "
                  f"({'right' if ok else 'WRONG: the NaN of row 1 reached it'})")
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
