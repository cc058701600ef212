"""How long the quick profile takes to give every check of an op a verdict (a script, not a test).

    python benchmarks/quick_profile.py                         # the project's kernels, every op
    python benchmarks/quick_profile.py --op softmax --op rope  # some of them
    python benchmarks/quick_profile.py --impl softmax=tritoncheck.controls.softmax:torch_softmax_fp32
    PYTHONPATH=examples/liger python benchmarks/quick_profile.py --impl softmax=adapters:softmax \\
        --impl layer_norm=adapters:layer_norm                  # third-party kernels (docs/third-party/)

Each row (an op's project kernel, or one ``--impl``) is the suite itself in a child pytest
(``tests/test_checks.py --op OP``, every dtype unless ``--dtype``, one process: one GPU),
run twice: cold, with an empty Triton cache (``TRITON_CACHE_DIR`` in a new temporary
directory), so every kernel compiles and every autotuned one sweeps its configs, as on a
new user's first run; then warm, the same command on the cache the first filled. Printed
per row: the tests and how they ended (passed, failed, skipped with a reason; an error
counts as failed), pytest's own time for the run (what the 60 s goal of issue 25 is about:
the time from the first test to the last verdict, compilation included) and the wall time
of the whole child (Python, torch and Triton imports included), and the child's CPU time
(user + system, all its threads: on a shared CPU machine the figure that other load does
not inflate). Under the interpreter
(``--backend interpret``, or no GPU) there is nothing to cache and cold and warm differ by
noise only.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 60.0  # issue 25: every check of an op gets a verdict within a minute on one GPU


@dataclass
class Outcome:
    tests: int
    passed: int
    failed: int
    skipped: int
    pytest_s: float
    wall_s: float
    cpu_s: float
    status: int


def run_once(op: str, impl: str | None, args, cache: Path, report_dir: Path) -> Outcome:
    """One child pytest of ``op`` (``impl``: an --impl spec, or None for the project's kernel)."""
    xml = report_dir / "junit.xml"
    workers = ["-n", str(args.workers)] if args.workers > 1 else ["-p", "no:xdist"]
    cmd = [sys.executable, "-m", "pytest", "tests/test_checks.py", "-q", "-p", "no:randomly", *workers,
           "-p", "no:cacheprovider", "--op", op, "--hypothesis-profile", args.profile, "--backend", args.backend,
           "--report-dir", str(report_dir), f"--junitxml={xml}", *args.pytest_arg]
    if impl:
        cmd += ["--impl", impl]
    for dtype in args.dtype:
        cmd += ["--dtype", dtype]
    if args.max_examples:
        cmd += ["--max-examples", str(args.max_examples)]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    start, cpu_start = time.perf_counter(), _children_cpu()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:  # a row past its limit is a figure (no verdict in that time), not an end
        wall = time.perf_counter() - start
        sys.stderr.write(f"{op} {impl or 'kernel'}: no verdict within {args.timeout:.0f} s\n")
        return Outcome(0, 0, 0, 0, float("nan"), wall, _children_cpu() - cpu_start, -1)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu_start
    if not xml.is_file():
        sys.stderr.write(f"{op} {impl or 'kernel'}: no result (exit {proc.returncode})\n{proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}\n")
        return Outcome(0, 0, 0, 0, float("nan"), wall, cpu, proc.returncode)
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, skipped = int(suite.get("tests")), int(suite.get("skipped"))
    failed = int(suite.get("failures")) + int(suite.get("errors"))
    return Outcome(tests, tests - failed - skipped, failed, skipped, float(suite.get("time")), wall, cpu,
                   proc.returncode)


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes: on a shared machine
    the figure that does not grow with the other load, where wall time does."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rows(args) -> list[tuple[str, str | None]]:
    """(op, --impl spec or None): each --impl, else the project's kernel of each op."""
    if args.impl:
        return [(spec.partition("=")[0].strip(), spec) for spec in args.impl]
    if args.op:
        return [(op, None) for op in args.op]
    sys.path.insert(0, str(ROOT))
    from tritoncheck import registry
    return [(op, None) for op in sorted(registry.load())]


def device(chosen: str) -> str:
    import torch
    if chosen == "interpret" or not torch.cuda.is_available():
        return "CPU (Triton interpreter)"
    return torch.cuda.get_device_name()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", action="append", default=[], metavar="OP=module:function",
                        help="a row per implementation (else the project's kernels)")
    parser.add_argument("--op", action="append", default=[], help="the project's kernel of this op (repeatable)")
    parser.add_argument("--dtype", action="append", default=[], help="float32, float16, bfloat16 (default: all)")
    parser.add_argument("--backend", default="auto", choices=("auto", "cuda", "interpret"))
    parser.add_argument("--profile", default="quick", help="the Hypothesis profile timed (default quick)")
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                        help="passed to each child pytest (e.g. --pytest-arg=--tolerance=parity)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per child run")
    parser.add_argument("--workers", type=int, default=1,
                        help="pytest-xdist workers per run, all on the same GPU (what `tritoncheck -n N` does): "
                             "compilation, most of a cold run, proceeds in parallel")
    args = parser.parse_args()
    print(f"device: {device(args.backend)}; profile {args.profile}; dtypes {', '.join(args.dtype) or 'all'}; "
          f"{args.workers} worker process(es) per run; pytest s: first test to last verdict; wall s: the whole child process")
    header = (f"{'op':<22} {'impl':<40} {'tests':>5} {'pass':>4} {'fail':>4} {'skip':>4} "
              f"{'cold pytest s':>13} {'cold wall s':>11} {'cold cpu s':>10} {'warm pytest s':>13} {'warm wall s':>11} "
              f"{'warm cpu s':>10}  goal")
    print(header)
    print("-" * len(header))
    missed = 0
    with tempfile.TemporaryDirectory(prefix="tritoncheck-quick-") as tmp:
        for i, (op, impl) in enumerate(rows(args)):
            cache = Path(tmp) / f"triton-cache-{i}"
            cold = run_once(op, impl, args, cache, Path(tmp) / f"cold-{i}")
            warm = run_once(op, impl, args, cache, Path(tmp) / f"warm-{i}")
            within = cold.pytest_s < GOAL_S
            missed += not within
            name = impl.partition("=")[2] if impl else "project kernel"
            print(f"{op:<22} {name[-40:]:<40} {cold.tests:>5} {cold.passed:>4} {cold.failed:>4} {cold.skipped:>4} "
                  f"{cold.pytest_s:>13.1f} {cold.wall_s:>11.1f} {cold.cpu_s:>10.1f} {warm.pytest_s:>13.1f} "
                  f"{warm.wall_s:>11.1f} {warm.cpu_s:>10.1f}  "
                  f"{'ok' if within else f'over {GOAL_S:.0f} s'}", flush=True)
            if (warm.passed, warm.failed, warm.skipped) != (cold.passed, cold.failed, cold.skipped):
                print(f"{'':<22} warm run: {warm.passed} passed, {warm.failed} failed, {warm.skipped} skipped")
    print(f"{missed} row(s) over {GOAL_S:.0f} s cold" if missed else f"every row under {GOAL_S:.0f} s cold")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
