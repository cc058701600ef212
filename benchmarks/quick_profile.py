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
not inflate), and the distinct Triton compile keys the cold run launched
(``benchmarks/compile_keys.py``: the kernels it compiled; the project's kernels, or with
``--impl`` those of the implementation's top-level package or of ``--keys-package``).
Under the interpreter (``--backend interpret``, or no GPU) there is nothing to cache and
cold and warm differ by noise only.

Each row runs the workers the ``tritoncheck`` command would (a core each but one, 1 to
15; ``--workers`` or ``--op-workers OP=N`` choose others). All ops of the project, cold
only, rows one after another on the one GPU::

    python benchmarks/quick_profile.py --cold-only --timeout 150
"""
from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import compile_keys  # benchmarks/compile_keys.py, beside this script (on sys.path as the script's folder)

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 60.0  # issue 25: every check of an op gets a verdict within a minute on one GPU
SLOWEST = 3  # the slowest tests of each run, printed under its row (a row's floor is its slowest test)


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
    keys: int | None = None  # distinct compile keys launched (None: not recorded)
    compile_s: float | None = None  # seconds spent compiling, all processes (None: not recorded)
    slowest: tuple[tuple[str, float], ...] = ()  # the run's slowest tests (junit name, seconds)


def run_once(op: str, impl: str | None, args, cache: Path, report_dir: Path, gpu: int | None = None) -> Outcome:
    """One child pytest of ``op`` (``impl``: an --impl spec, or None for the project's kernel),
    on GPU ``gpu`` alone when given (``CUDA_VISIBLE_DEVICES``)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    xml = report_dir / "junit.xml"
    n = workers_for(op, args)
    workers = ["-n", str(n)] if n > 1 else ["-p", "no:xdist"]
    cmd = [sys.executable, "-m", "pytest", "tests/test_checks.py", "-q", "-p", "no:randomly", *workers,
           "-p", "no:cacheprovider", "--op", op, "--hypothesis-profile", args.profile, "--backend", args.backend,
           "--report-dir", str(report_dir), f"--junitxml={xml}", *args.pytest_arg]
    if impl:
        cmd += ["--impl", impl]
    for dtype in args.dtype:
        cmd += ["--dtype", dtype]
    if args.max_examples:
        cmd += ["--max-examples", str(args.max_examples)]
    keys_file = report_dir / "compile-keys.jsonl"
    if args.keys:
        packages = args.keys_package or ([impl.partition("=")[2].partition(":")[0].split(".")[0]] if impl else [])
        cmd += ["-p", "compile_keys", f"--compile-keys-out={keys_file}",
                *[f"--compile-keys-package={p}" for p in packages]]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    output = report_dir / "output.txt"
    start = time.perf_counter()
    with output.open("w") as out:  # a file, not a pipe: rows run in threads, and wait4 below reaps the child
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        # past the limit the whole session goes (xdist workers too): a row past its limit is a
        # figure (no verdict in that time), not an end
        killed = threading.Event()
        timer = threading.Timer(args.timeout, _kill_session, (proc.pid, killed))
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's CPU alone, whatever other rows run beside it
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall, cpu = time.perf_counter() - start, usage.ru_utime + usage.ru_stime
    if killed.is_set():
        sys.stderr.write(f"{op} {impl or 'kernel'}: no verdict within {args.timeout:.0f} s\n")
        return Outcome(0, 0, 0, 0, float("nan"), wall, cpu, -1)
    if not xml.is_file():
        sys.stderr.write(f"{op} {impl or 'kernel'}: no result (exit {proc.returncode})\n"
                         f"{output.read_text()[-4000:]}\n")
        return Outcome(0, 0, 0, 0, float("nan"), wall, cpu, proc.returncode)
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, skipped = int(suite.get("tests")), int(suite.get("skipped"))
    failed = int(suite.get("failures")) + int(suite.get("errors"))
    keys = len({r["key"] for r in compile_keys.read_keys(keys_file)}) if args.keys else None
    compile_s = compile_keys.compile_seconds(keys_file) if args.keys else None
    times = sorted(((case.get("name", "?"), float(case.get("time", 0))) for case in suite.iter("testcase")),
                   key=lambda t: -t[1])
    return Outcome(tests, tests - failed - skipped, failed, skipped, float(suite.get("time")), wall, cpu,
                   proc.returncode, keys, compile_s, tuple(times[:SLOWEST]))


def _kill_session(pid: int, killed: threading.Event) -> None:
    """The child and its xdist workers (its own session), past the row's limit."""
    killed.set()
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended as the limit came
        pass


def workers_for(op: str, args) -> int:
    """The xdist workers of ``op``'s rows: its --op-workers, else --workers."""
    for spec in args.op_workers:
        name, _, n = spec.partition("=")
        if name.strip() == op:
            return int(n)
    return args.workers


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
    parser.add_argument("--workers", type=int, default=None,
                        help="pytest-xdist workers per run, all on the same GPU (what `tritoncheck -n N` does): "
                             "compilation, most of a cold run, proceeds in parallel; default: the tritoncheck "
                             "command's (a core each but one, 1 to 15)")
    parser.add_argument("--op-workers", action="append", default=[], metavar="OP=N",
                        help="N workers for OP's rows instead of --workers (repeatable)")
    parser.add_argument("--no-keys", dest="keys", action="store_false",
                        help="do not count the distinct compile keys of each cold run (benchmarks/compile_keys.py)")
    parser.add_argument("--keys-package", action="append", default=[], metavar="PACKAGE",
                        help="with --impl: count the kernels of this package (default: the implementation's own)")
    parser.add_argument("--cold-only", action="store_true", help="no warm run (half the time)")
    parser.add_argument("--gpus", type=int, default=1,
                        help="run this many rows at once, each on a GPU of its own (CUDA_VISIBLE_DEVICES): on a host "
                             "of G GPUs and 16 G cores, each row has what a one-GPU machine has")
    args = parser.parse_args()
    if args.workers is None:
        sys.path.insert(0, str(ROOT))
        from tritoncheck.cli import default_workers
        args.workers = default_workers()
    if args.gpus > 1:
        import torch
        # a row given a GPU the machine lacks sees none (CUDA_VISIBLE_DEVICES) and skips every test
        if args.backend == "interpret" or torch.cuda.device_count() < args.gpus:
            parser.error(f"--gpus {args.gpus}: this machine has {torch.cuda.device_count()} GPU(s) for the cuda "
                         f"backend; pass --gpus 1 (rows one after another) or at most the GPUs it has")
    print(f"device: {device(args.backend)}; profile {args.profile}; dtypes {', '.join(args.dtype) or 'all'}; "
          f"{args.workers} worker process(es) per run unless the row says; pytest s: first test to last verdict; "
          f"wall s: the whole child process; keys: distinct compile keys of the cold run; compile s: its "
          f"processes' seconds compiling them (Triton's compilation listener, where it has one)")
    header = (f"{'op':<22} {'impl':<40} {'wk':>3} {'keys':>5} {'compile s':>9} {'tests':>5} {'pass':>4} {'fail':>4} {'skip':>4} "
              f"{'cold pytest s':>13} {'cold wall s':>11} {'cold cpu s':>10} {'warm pytest s':>13} {'warm wall s':>11} "
              f"{'warm cpu s':>10}  goal")
    print(header)
    print("-" * len(header))
    missed = []
    printing = threading.Lock()
    gpus: queue.Queue = queue.Queue()
    for g in range(args.gpus):
        gpus.put(g if args.gpus > 1 else None)

    def row(i: int, op: str, impl: str | None, tmp: str) -> None:
        gpu = gpus.get()  # rows run at most --gpus at a time, each on a free GPU
        try:
            cache = Path(tmp) / f"triton-cache-{i}"
            cold = run_once(op, impl, args, cache, Path(tmp) / f"cold-{i}", gpu)
            warm = None if args.cold_only else run_once(op, impl, args, cache, Path(tmp) / f"warm-{i}", gpu)
        finally:
            gpus.put(gpu)
        with printing:
            print_row(op, impl, args, cold, warm, missed)

    with tempfile.TemporaryDirectory(prefix="tritoncheck-quick-") as tmp:
        threads = [threading.Thread(target=row, args=(i, op, impl, tmp)) for i, (op, impl) in enumerate(rows(args))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(f"{len(missed)} row(s) over {GOAL_S:.0f} s cold" if missed else f"every row under {GOAL_S:.0f} s cold")
    return 1 if missed else 0


def print_row(op: str, impl: str | None, args, cold: Outcome, warm: Outcome | None, missed: list) -> None:
    within = cold.pytest_s < GOAL_S
    if not within:
        missed.append(op)
    name = impl.partition("=")[2] if impl else "project kernel"
    keys = "-" if cold.keys is None else str(cold.keys)
    compiling = "-" if cold.compile_s is None else f"{cold.compile_s:.1f}"
    nan = Outcome(0, 0, 0, 0, float("nan"), float("nan"), float("nan"), 0)
    w = warm or nan
    print(f"{op:<22} {name[-40:]:<40} {workers_for(op, args):>3} {keys:>5} {compiling:>9} "
          f"{cold.tests:>5} {cold.passed:>4} {cold.failed:>4} {cold.skipped:>4} "
          f"{cold.pytest_s:>13.1f} {cold.wall_s:>11.1f} {cold.cpu_s:>10.1f} {w.pytest_s:>13.1f} "
          f"{w.wall_s:>11.1f} {w.cpu_s:>10.1f}  "
          f"{'ok' if within else f'over {GOAL_S:.0f} s'}", flush=True)
    for run, outcome in (("cold", cold), ("warm", warm)):
        if outcome is not None and outcome.slowest:
            print(f"{'':<22} slowest tests, {run}: " + ", ".join(f"{n.partition('[')[2].rstrip(']') or n} {t:.1f} s"
                                                            for n, t in outcome.slowest))
    if warm is not None and (warm.passed, warm.failed, warm.skipped) != (cold.passed, cold.failed, cold.skipped):
        print(f"{'':<22} warm run: {warm.passed} passed, {warm.failed} failed, {warm.skipped} skipped")


if __name__ == "__main__":
    raise SystemExit(main())
