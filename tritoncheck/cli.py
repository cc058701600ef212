"""The ``tritoncheck`` command: check your own kernels from any directory.

    tritoncheck softmax=mykernels.softmax:softmax attention=mykernels.fa:flash_attention

runs every check of the named ops on those functions (imported from the current
directory, as ``python -m`` would, or from ``PYTHONPATH``), writes the tolerance report
and the failing cases' replay files under ``--report-dir`` (``./reports``) and exits 0
only when every check that could run passed. Without ``--profile`` it runs twice: the
``quick`` profile first, a verdict on every check in about a minute, then, when that
passed, the deep profile (``gpu`` on CUDA, ``ci`` on the interpreter) over the same
report directory; ``--profile`` runs that profile only. pytest runs underneath: anything after
``--`` goes to it unchanged, and ``pytest --impl OP=module:function`` does the same.

    tritoncheck report summary reports/report.json     # the summary, as Markdown
    tritoncheck report diff base.json reports/report.json   # what got worse; exit 1 if anything did
    tritoncheck report merge -o reports shard1.json shard2.json shard3.json   # a --shard K/N run, joined

work on the reports runs write (docs/report-schema.md).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

EPILOG = """\
options after -- go to pytest as they are (e.g. -- -x -k rows_sum_to_one).

what your function may declare about itself (attributes, validated when it is loaded):
  fn.dtypes = (torch.float16,)          only these dtypes; the others are skipped with the reason
  fn.supports_backward = False          no gradient checks
  fn.limits = {"max_size": {"N": 65536}}   the domain it accepts: cases are drawn inside it
  fn.refuses = r"rows of \\d+ elements"    refusal messages raised on purpose (or raise tritoncheck.Refusal)
  fn.expected_failures = {...}          strict xfails scoped by check, dtype and backend
  fn.fp32_dot_precision = "ieee"        the tolerance for fp32 tl.dot ("tf32" is the CUDA default)
  an op's own declarations (rms_norm_cast, chunk_sizes, batch_invariant, ...) are listed per op in
  docs/contract.md ("An op's own declarations")

your own op: define it with @tritoncheck.op in a module (docs/your-op.md), then
  tritoncheck --op-module mypkg.ops mm=mypkg.kernels:mm

profiles: without --profile, quick (10 examples, a small pool of shapes, no shrinking: a verdict
on every check in about a minute), then, if every check passed, gpu (on CUDA; ci on the
interpreter) for depth. --profile quick stops after the first; --profile gpu skips it.

exit status: 0 every check passed; 1 a check failed (each failure prints the case in words
and a replay command); 2 a usage error (an --impl that does not import, an unknown op).
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tritoncheck", description="Fuzz-test Triton kernels against fp64 references with derived tolerances.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("impls", nargs="*", metavar="OP=module:function",
                   help="the function to check for OP (repeatable); only the ops named run")
    p.add_argument("--op-module", action="append", default=[], metavar="MODULE",
                   help="import MODULE first: the ops it defines with @tritoncheck.op can be checked (repeatable; "
                        "also [tool.tritoncheck] op-modules in pyproject.toml, or OP written module:op)")
    p.add_argument("--list-ops", action="store_true", help="print the contract table of every op and exit")
    p.add_argument("--dtype", action="append", default=[], metavar="DTYPE",
                   help="only this dtype: float32, float16, bfloat16 (repeatable)")
    p.add_argument("--backend", choices=("auto", "cuda", "interpret"), default="auto",
                   help="cuda, the Triton interpreter on CPU, or auto (cuda if available)")
    p.add_argument("--profile", choices=("quick", "dev", "ci", "gpu", "nightly"), default=None,
                   help="examples and sizes; default: quick (10 examples, few shapes, no shrinking: a first "
                        "verdict in about a minute), then, if it passed, gpu (large shapes, 100 examples) on "
                        "CUDA or ci (small shapes, 20) on the interpreter; nightly (1000), dev. A profile "
                        "named runs alone")
    p.add_argument("--max-examples", type=int, default=None, metavar="N", help="examples per check")
    p.add_argument("--refusals", choices=("auto", "discard", "fail"), default="auto",
                   help="auto: a refusal your function declares (tritoncheck.Refusal, fn.refuses) is discarded and "
                        "counted, any other exception fails with its traceback; discard: undeclared ones are "
                        "counted too, up to a fifth of a test's examples; fail: every refusal fails")
    p.add_argument("--tolerance", choices=("derived", "parity"), default="derived",
                   help="derived allowances, or parity: also within 2x plain PyTorch's own error")
    p.add_argument("--report-dir", default="reports", help="where the report and the replay files go (./reports)")
    p.add_argument("-n", "--workers", default=None, metavar="N",
                   help="pytest-xdist worker processes (a number or auto); default: one per CPU core but one, "
                        "1 to 15, on CUDA at most one per 5 GiB of GPU memory, where pytest-xdist is installed (a cold run is mostly Triton compiling, which the "
                        "workers do in parallel; a kernel that crashes its worker fails the test it ran, by name, "
                        "and the run goes on in a new worker), else the command's own process")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="only the K-th of N deterministic shares of the checks (a CI matrix); "
                        "`tritoncheck report merge` joins the shards' reports")
    return p


def pytest_args(ns: argparse.Namespace, extra: list[str], profile: str | None = None) -> list[str]:
    """The pytest command line that runs what ``ns`` asks for, at ``profile`` (default
    ``ns.profile``; with neither, the plugin's default for --impl runs, ``quick``)."""
    here = Path(__file__).parent
    # --confcutdir: from an editable install the suite's file lies in a checkout, whose
    # conftest.py would put the checkout first on sys.path, where its kernels/ would
    # shadow a user's package of that name. --rootdir: test ids read suite.py::test_check[...].
    args = [str(here / "suite.py"), "-p", "tritoncheck.plugin", "-o", "tritoncheck=true", "-p", "no:cacheprovider",
            "--confcutdir", str(here), "--rootdir", str(here), "--report-dir", ns.report_dir, "--backend", ns.backend,
            "--refusals", ns.refusals, "--tolerance", ns.tolerance]
    for module in ns.op_module:
        args += ["--op-module", module]
    for spec in ns.impls:
        args += ["--impl", spec]
    for dtype in ns.dtype:
        args += ["--dtype", dtype]
    workers = ns.workers or (None if ns.list_ops else crash_isolating_workers(extra, ns.backend))
    if workers:
        args += ["-n", str(workers)]
    if ns.list_ops:
        args.append("--list-ops")
    if profile or ns.profile:
        args += ["--hypothesis-profile", profile or ns.profile]
    if ns.max_examples is not None:
        args += ["--max-examples", str(ns.max_examples)]
    if ns.shard:
        args += ["--shard", ns.shard]
    return args + extra


MAX_DEFAULT_WORKERS = 15
# GPU memory a default worker may count on. Not measured per worker: a bound chosen so that
# an 80 GB card keeps the 15 workers the timings were taken with (docs/speed.md) while a
# 24 GB card gets 4 and an 8 GB card 1 (each worker holds its own CUDA context, the gpu
# profile's largest cases and their references); -n N overrides it.
GIB_PER_WORKER = 5


def crash_isolating_workers(extra: list[str], backend: str = "auto") -> str | None:
    """The xdist workers a run without ``--workers`` gets (``default_workers``), so that a
    kernel that takes its process down (a segfault, a heap-corrupting store) costs the test
    it ran, which fails naming the crash, and not the run; None where pytest-xdist is not
    installed, or where the options after ``--`` choose workers themselves (``-n``) or turn
    xdist off. The cost: each worker process's start (torch, Triton and the suite imported
    again), in parallel."""
    import importlib.util
    if importlib.util.find_spec("xdist") is None:
        return None
    if any(a.startswith(("-n", "--numprocesses")) or a.endswith("no:xdist") for a in extra):
        return None
    return str(default_workers(backend))


def default_workers(backend: str = "auto") -> int:
    """One worker per core this process may use but one (the controller's), 1 to
    ``MAX_DEFAULT_WORKERS``, and on CUDA at most one per ``GIB_PER_WORKER`` of the smallest
    visible GPU's memory, times the GPUs (workers take GPUs in turn). A cold quick run is
    mostly Triton compiling, one kernel per distinct key in the process that meets it
    first, so its time falls with the workers compiling at once: the project's attention,
    84 checks and 289 keys, gave every verdict in 53 s cold on an H200 host of 16 cores with
    15 workers, its compilations 319 s of the workers' time (docs/speed.md)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    workers = min(cores - 1, MAX_DEFAULT_WORKERS)
    if backend != "interpret":
        import torch
        if torch.cuda.is_available():
            gib = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())) / 2**30
            workers = min(workers, torch.cuda.device_count() * int(gib // GIB_PER_WORKER))
    return max(1, workers)


def report_parser() -> argparse.ArgumentParser:
    from tritoncheck import report_diff
    p = argparse.ArgumentParser(prog="tritoncheck report", description="Read, compare and join report.json files.")
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("summary", help="print a report's summary (Markdown: a CI step summary takes it)")
    s.add_argument("report")
    s.add_argument("--text", action="store_true", help="aligned text, as the terminal prints it")
    d = sub.add_parser("diff", help="A (base) against B: checks that changed verdict, outputs whose headroom grew, "
                                    "new refusals, as Markdown; exit 1 when anything got worse")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--factor", type=float, default=report_diff.GROWTH_FACTOR,
                   help="report an output whose headroom grew past this many times A's (default %(default)s)")
    d.add_argument("--floor", type=float, default=report_diff.HEADROOM_FLOOR,
                   help="... and reached at least this headroom (default %(default)s)")
    m = sub.add_parser("merge", help="join the report.json files of a --shard K/N run into one report")
    m.add_argument("reports", nargs="+")
    m.add_argument("-o", "--out", required=True, help="folder for the merged report.json, .md and .html")
    return p


def report_command(argv: list[str]) -> int:
    """``tritoncheck report ...``: 0 done (diff: nothing worse), 1 diff found something worse,
    2 a usage error or a file that is not a report."""
    from tritoncheck import report_diff, report_shards, report_summary
    ns = report_parser().parse_args(argv)
    try:
        if ns.action == "summary":
            data = report_diff.load(ns.report)
            print(report_summary.summary_text(data) + "\n" if ns.text else report_summary.summary_markdown(data), end="")
            return 0
        if ns.action == "diff":
            a, b = report_diff.load(ns.a), report_diff.load(ns.b)
            found = report_diff.diff(a, b, ns.factor, ns.floor)
            print(report_diff.markdown(found, a, b, (ns.a, ns.b)), end="")
            return 1 if found["regression"] else 0
        merged = report_shards.merge_files([Path(p) for p in ns.reports], Path(ns.out))
        print(f"merged {len(ns.reports)} report(s) into {Path(ns.out) / 'report.json'}: "
              f"{len(merged['verdicts'])} checks, {len(merged['rows'])} recorded comparisons")
        return 0
    except ValueError as exc:
        print(f"tritoncheck report: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        return report_command(argv[1:])
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ns = parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if not ns.impls and not ns.list_ops:
        parser().error("name at least one OP=module:function (tritoncheck --list-ops lists the ops)")
    for spec in ns.impls:
        if "=" not in spec or ":" not in spec.partition("=")[2]:
            parser().error(f"{spec!r}: expected OP=package.module:function")
    # The user's code imports from the current directory, as under `python -m`: here, and
    # in xdist's worker processes, which inherit PYTHONPATH.
    here = os.getcwd()
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
    import pytest
    if ns.profile or ns.list_ops:
        return exit_status(pytest.main(pytest_args(ns, extra)))
    status = exit_status(pytest.main(pytest_args(ns, extra, "quick")))
    deep = deep_profile(ns.backend)
    if status == 2:
        return status  # a usage error: pytest said what it is
    if status != 0:
        print(f"tritoncheck: the quick profile did not pass (exit status {status}); the {deep} profile is not run. "
              f"Fix what it found, or run --profile {deep} for depth anyway.")
        return status
    print(f"tritoncheck: the quick profile passed; now the {deep} profile, for depth (--profile quick stops "
          "after the first).", flush=True)
    # a fresh process: a second pytest.main here would find the suite's module, the
    # registered implementations and the run's settings left by the first
    own = argv[:argv.index("--")] if "--" in argv else argv
    return subprocess.call([sys.executable, "-m", "tritoncheck", *own, "--profile", deep, "--", *extra])


def exit_status(pytest_status: int) -> int:
    """The command's exit status for pytest's: a usage error (pytest's 4: an --impl that does
    not import or whose signature cannot bind the contract's call, an unknown op) is 2, as
    argparse's own usage errors are; every other status is pytest's."""
    return 2 if int(pytest_status) == 4 else int(pytest_status)


def deep_profile(chosen_backend: str) -> str:
    """The profile that follows ``quick``: ``gpu`` where kernels run compiled, else ``ci``."""
    if chosen_backend == "auto":
        import torch
        return "gpu" if torch.cuda.is_available() else "ci"
    return "gpu" if chosen_backend == "cuda" else "ci"


if __name__ == "__main__":
    raise SystemExit(main())
