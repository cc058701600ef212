"""How many examples per second the suite checks, per op and dtype (a script, not a test).

    python benchmarks/suite_speed.py [--examples 50] [--op softmax] [--dtype float16] [--profile gpu|ci]

Each (op, dtype) runs the same seeded examples twice through
matches_reference (and gradients_match_reference where the op has gradients): the
first pass compiles what it needs, the second finds every kernel compiled, so
compile time = pass 1 - pass 2 and the warm rate is examples / pass 2. The warm pass's
time is split by phase (``properties/phases.py``): inputs (materialising the drawn cases),
kernel (the implementation, forward and backward), reference (fp64), allowance (the
derived rules), torch (PyTorch's same-dtype baseline), compare (errors, ULPs, vacuity
and the report's records of each output) and the rest (Hypothesis's drawing and
bookkeeping; the whole of an op's own checks, which are not split).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the interpreter's numpy overflow chatter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=50)
    parser.add_argument("--op", action="append", default=[])
    parser.add_argument("--dtype", action="append", default=[], help="float32, float16, bfloat16 (default: all)")
    parser.add_argument("--profile", default=None, help="size class: ci (small) or gpu (large); default by backend")
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()

    from properties import backend
    chosen = backend.select(args.backend)
    import torch

    from properties import registry, selfcheck
    from properties.config import CONFIG, PROFILE_SIZES
    CONFIG.size = PROFILE_SIZES[args.profile or ("gpu" if chosen == "cuda" else "ci")]
    ops = registry.load()
    device = torch.cuda.get_device_name() if chosen == "cuda" else "CPU (Triton interpreter)"
    print(f"backend {chosen}, device {device}, size {CONFIG.size}, {args.examples} examples per row, "
          f"torch {torch.__version__}, pid {os.getpid()}")
    from properties import phases
    columns = ("inputs", "kernel", "reference", "allowance", "torch baseline", "compare")
    print(f"{'op':<28} {'dtype':<9} {'check':<26} {'cold s':>8} {'warm s':>8} {'ex/s warm':>10} {'compile %':>9}  "
          "warm share %: inputs kernel reference allowance torch compare rest")
    for name in args.op or sorted(ops):
        op = ops[name]
        impl = registry.implementations(name)[0]
        checks = [c for c in op.checks if c.name in ("matches_reference", "gradients_match_reference")]
        for dtype in (d for d in op.dtypes if not args.dtype or str(d)[6:] in args.dtype):
            for check in checks:
                if selfcheck.runnable(op, impl, check, dtype):
                    continue
                times = []
                for warm_pass in (False, True):
                    if warm_pass:
                        phases.start()
                    start = time.perf_counter()
                    verdict = selfcheck.hunt(op, impl, check, dtype, args.examples)
                    if chosen == "cuda":
                        torch.cuda.synchronize()
                    times.append(time.perf_counter() - start)
                cold, warm = times
                spent = phases.stop()
                shares = [100 * spent.get(c, 0.0) / warm for c in columns]
                shares.append(max(0.0, 100 - sum(shares)))
                flag = "  FAILED" if verdict.failed else ""
                print(f"{name:<28} {str(dtype)[6:]:<9} {check.name:<26} {cold:8.2f} {warm:8.2f} "
                      f"{args.examples / warm:10.1f} {100 * max(cold - warm, 0) / cold:8.0f}%  "
                      + " ".join(f"{x:.0f}" for x in shares) + flag, flush=True)


if __name__ == "__main__":
    main()
