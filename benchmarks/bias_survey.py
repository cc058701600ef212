"""The rounding-bias statistic on every project kernel, control and truncating mutant: how close each comes to failing.

    python benchmarks/bias_survey.py [--op softmax] [--dtype float16] [--examples 20] [--shard 0/2]

For each op with an output narrower than fp32, each implementation (the project's kernel,
the record's controls, and the mutants that claim ``unbiased_rounding``) and each narrowing
dtype runnable here: ``--examples`` cases of the check's own strategy, each measured as the
check measures it (tritoncheck/rounding_bias.py), as a table: examples judged and discarded
(no example could show a bias), the calls per example, and the largest |mean| / allowed
over the examples and directions (above 1 fails). The kernels and controls must stay below
1, the mutants above it. Exits 1 when one of them is on the wrong side.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
import zlib
from pathlib import Path

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the interpreter's numpy chatter
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def survey(op, impl, dtype, examples: int) -> dict:
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from tritoncheck import rounding_bias
    from tritoncheck.generic import observed
    from tritoncheck.poisoning import poisoned_allocations_for
    row = {"judged": 0, "discarded": 0, "calls": 0, "worst": 0.0, "where": ""}

    @seed(zlib.crc32(f"bias:{op.name}:{impl.name}:{dtype}".encode()))
    @settings(max_examples=examples, database=None, deadline=None, print_blob=False,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(case=next(c for c in op.checks if c.name == "unbiased_rounding").cases(op, dtype))
    def search(case):
        with poisoned_allocations_for(impl.fn):
            calls, found = rounding_bias.measure(case, impl, observed)
        row["calls"] += calls
        ratios = [(abs(b.mean) / b.allowed, f"{n} {d}: {b.mean:+.3f} of {b.allowed:.3f} ulp, {b.elements} elements")
                  for n, by in found.items() for d, b in by.items() if b.allowed <= rounding_bias.DETECTABLE]
        if not ratios:
            row["discarded"] += 1
            return
        row["judged"] += 1
        worst = max(ratios)
        if worst[0] > row["worst"]:
            row["worst"], row["where"] = worst

    search()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", action="append", default=[])
    parser.add_argument("--dtype", action="append", default=[])
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--shard", default="0/1")
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    index, count = (int(x) for x in args.shard.split("/"))
    from tritoncheck import backend
    backend.select(args.backend)
    import torch
    torch.set_num_threads(1)
    from tritoncheck import registry, rounding_bias, selfcheck
    from tritoncheck.limits import NotApplicable
    ops = registry.load()
    impls = [(i, "control") for i in selfcheck.controls()]
    impls += [(registry.Implementation.of(o, registry.resolve(s.kernel), name="triton", kind="kernel"), "kernel")
              for o, s in ops.items()]
    impls += [(selfcheck.as_implementation(m), "mutant") for m in selfcheck.mutants() if "unbiased_rounding" in m.kills]
    jobs = []
    for impl, role in impls:
        op = ops[impl.op]
        if op.distributed or (args.op and op.name not in args.op):
            continue
        for dtype in rounding_bias.NARROW:
            if args.dtype and str(dtype).replace("torch.", "") not in args.dtype:
                continue
            try:
                next(c for c in op.checks if c.name == "unbiased_rounding").cases(op, dtype)
            except (NotApplicable, StopIteration):
                continue
            if backend.limit_for(op, dtype, impl.fn) or impl.unsupported(dtype):
                continue
            jobs.append((op, impl, role, dtype))
    wrong = 0
    print(f"{'op':<24} {'implementation':<40} {'dtype':<9} {'judged':>6} {'discarded':>9} {'calls/ex':>8} "
          f"{'worst |m|/allowed':>17}  where", flush=True)
    for op, impl, role, dtype in jobs[index::count]:
        start = time.perf_counter()
        r = survey(op, impl, dtype, args.examples)
        bad = (r["worst"] > 1) != (role == "mutant")
        wrong += bad
        n = r["judged"] + r["discarded"]
        print(f"{op.name:<24} {role + ' ' + impl.name:<40} {str(dtype).replace('torch.', ''):<9} {r['judged']:>6} "
              f"{r['discarded']:>9} {r['calls'] / max(n, 1):>8.1f} {r['worst']:>17.3f}  {r['where']}"
              f"{'  <- WRONG SIDE' if bad else ''} ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"{wrong} implementation(s) on the wrong side of 1")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
