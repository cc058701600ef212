"""The rule audit: each derived rule's tightest case against PyTorch's own result in the same dtype.

    python benchmarks/rule_audit.py [--op softmax] [--dtype float16] [--check gradients_match_reference]
        [--examples 200] [--seed N] [--shard 0/2] [--markdown]

For every op record's controls (correct plain-PyTorch implementations that compute in the
input dtype as users write them: ``OpSpec.controls``), every dtype and every reference
check (default: ``matches_reference`` and ``gradients_match_reference``, the forward and
gradient rules), a Hypothesis search over the check's own strategy steered by
``hypothesis.target`` toward the largest headroom, max |error| / allowance over every
comparison the check makes. One row per (control, dtype, check): the examples judged, the
worst headroom found, the failures (headroom > 1: a correct implementation rejected, a
gap in the rule) and the tightest case. Exits 1 when any row failed.

docs/rule-audit.md says what it searches and what it cannot prove. Distributed ops
(``OpSpec.distributed``) run on ranks and are not audited here.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the interpreter's numpy chatter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHECKS = ("matches_reference", "gradients_match_reference")
AUDIT_SEED = 20261205


@dataclass
class Row:
    op: str
    control: str
    dtype: str
    check: str
    judged: int = 0
    failed: int = 0
    crashed: int = 0
    worst: float = 0.0
    case: str = ""
    where: str = ""  # the worst element: its error and allowance in ulps of the output dtype
    seconds: float = 0.0
    expected_failure: str = ""


def audit(op, impl, check, dtype, examples: int, base_seed: int) -> Row:
    """Search ``check`` on ``impl`` for its largest headroom; every example is judged, none stops the search."""
    from hypothesis import HealthCheck, Phase, given, seed, settings, target
    from hypothesis.errors import UnsatisfiedAssumption

    from tritoncheck.oracle import recording

    row = Row(op.name, impl.name, str(dtype).replace("torch.", ""), check.name)
    strategy = check.cases(op, dtype) if check.cases is not None else op.cases(dtype)

    @seed(zlib.crc32(f"{base_seed}:{op.name}:{impl.name}:{check.name}:{dtype}".encode()))
    @settings(max_examples=examples, database=None, deadline=None, print_blob=False, derandomize=False,
              phases=(Phase.explicit, Phase.generate, Phase.target), suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def search(case):
        seen = [0.0, ""]

        def sink(comparison, parity=None, passed=None, row=True):
            if comparison.headroom > seen[0]:
                seen[0], seen[1] = comparison.headroom, _in_ulps(comparison)

        try:
            with recording(sink):
                check.run(case, impl)
        except UnsatisfiedAssumption:
            raise  # outside the check's domain, or discarded as vacuous: not judged
        except AssertionError:
            row.failed += 1
        except Exception:  # noqa: BLE001 - a control that crashes is a row to look at, not the end of the audit
            row.crashed += 1
            return
        row.judged += 1
        if seen[0] > row.worst:
            row.worst, row.where, row.case = seen[0], seen[1], case.describe()
        target(min(seen[0], 1e6), label="headroom")

    start = time.perf_counter()
    try:
        search()
    except Exception as exc:  # noqa: BLE001 - e.g. every example discarded
        row.case = row.case or f"search ended: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    row.seconds = time.perf_counter() - start
    return row


def _in_ulps(c) -> str:
    """The worst element of a comparison in ulps of its dtype: a rule tight on one rounding
    (error half an ulp, allowance half an ulp) reaches headroom 1 and cannot pass it."""
    from tritoncheck.tolerance import ulp
    if c.worst is None or not c.dtype.is_floating_point:
        return ""
    spacing = float(ulp(abs(c.expected), c.dtype))
    return (f"{c.output}{list(c.worst)}: expected {c.expected:.6g}, |error| {abs(c.got - c.expected) / spacing:.3g} ulp, "
            f"allowed {c.allowed / spacing:.3g} ulp")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", action="append", default=[])
    parser.add_argument("--dtype", action="append", default=[])
    parser.add_argument("--check", action="append", default=[])
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=AUDIT_SEED)
    parser.add_argument("--shard", default="0/1", help="i/n: every n-th row starting at i")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--tightest", type=int, default=12, help="how many of the tightest cases to print")
    args = parser.parse_args()
    index, count = (int(x) for x in args.shard.split("/"))

    from tritoncheck import backend
    backend.select(args.backend)
    import torch
    torch.set_num_threads(1)
    from tritoncheck import registry, selfcheck

    ops = registry.load()
    jobs = []
    for impl in selfcheck.controls():
        op = ops[impl.op]
        if (args.op and op.name not in args.op) or op.distributed:
            continue
        for dtype in op.dtypes:
            if args.dtype and str(dtype).replace("torch.", "") not in args.dtype:
                continue
            for check in op.checks:
                if check.name in (args.check or CHECKS) and not selfcheck.runnable(op, impl, check, dtype):
                    jobs.append((op, impl, check, dtype))
    # a control's declared expected failure (registry data, with its reason) is no rule gap
    declared = [j for j in jobs if j[1].expected_failure(j[2].name, j[3])]
    jobs = [j for j in jobs if j not in declared]
    jobs = jobs[index::count]
    head = ("op", "control", "dtype", "check", "judged", "failed", "crashed", "worst headroom", "s")
    fmt = "| " + " | ".join(["{}"] * len(head)) + " |" if args.markdown else \
        "{:<24} {:<36} {:<9} {:<26} {:>6} {:>6} {:>7} {:>14} {:>6}"
    print(fmt.format(*head), flush=True)
    if args.markdown:
        print("|" + "---|" * len(head))
    rows = []
    for op, impl, check, dtype in jobs:
        r = audit(op, impl, check, dtype, args.examples, args.seed)
        rows.append(r)
        print(fmt.format(r.op, r.control, r.dtype, r.check, r.judged, r.failed, r.crashed, f"{r.worst:.3g}",
                         f"{r.seconds:.0f}"), flush=True)
    print(f"\n{len(rows)} rows (backend {backend.current()}, {args.examples} examples each, seed {args.seed}); "
          f"the tightest cases:")
    for r in sorted(rows, key=lambda r: -r.worst)[:args.tightest]:
        print(f"- {r.op} {r.control} {r.dtype} {r.check}: {r.worst:.3g} ({r.where})\n    "
              + r.case.replace("\n", "\n    "))
    for op, impl, check, dtype in declared[index::count]:
        print(f"not audited: {op.name} {impl.name} {str(dtype).replace('torch.', '')} {check.name}: declared "
              f"expected failure ({impl.expected_failure(check.name, dtype).reason})")
    bad = [r for r in rows if r.failed or r.crashed]
    for r in bad:
        print(f"FAILED: {r.op} {r.control} {r.dtype} {r.check}: {r.failed} over the allowance, {r.crashed} crashed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
