"""The ``tritoncheck`` command: check your own kernels from any directory.

    tritoncheck softmax=mykernels.softmax:softmax attention=mykernels.fa:flash_attention

runs every check of the named ops on those functions (imported from the current
directory, as ``python -m`` would, or from ``PYTHONPATH``), writes the tolerance report
and the failing cases' replay files under ``--report-dir`` (``./reports``) and exits 0
only when every check that could run passed. pytest runs underneath: anything after
``--`` goes to it unchanged, and ``pytest --impl OP=module:function`` does the same.

    tritoncheck report summary reports/report.json     # the summary, as Markdown
    tritoncheck report diff base.json reports/report.json   # what got worse; exit 1 if anything did
    tritoncheck report merge -o reports shard1.json shard2.json shard3.json   # a --shard K/N run, joined

work on the reports runs write (docs/report-schema.md).
"""
from __future__ import annotations

import argparse
import os
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
  fn.rms_norm_cast = "before_weight"    an RMSNorm that rounds x * rstd before the weight (Llama/HF)
  fn.batch_invariant = True             each row's outputs bitwise free of the other rows in the call
  (docs/contract.md lists them all)

exit status: 0 every check passed; 1 a check failed (each failure prints the case in words
and a replay command); 2 a usage error (an --impl that does not import, an unknown op).
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tritoncheck", description="Fuzz-test Triton kernels against fp64 references with derived tolerances.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("impls", nargs="*", metavar="OP=module:function",
                   help="the function to check for OP (repeatable); only the ops named run")
    p.add_argument("--list-ops", action="store_true", help="print the contract table of every op and exit")
    p.add_argument("--dtype", action="append", default=[], metavar="DTYPE",
                   help="only this dtype: float32, float16, bfloat16 (repeatable)")
    p.add_argument("--backend", choices=("auto", "cuda", "interpret"), default="auto",
                   help="cuda, the Triton interpreter on CPU, or auto (cuda if available)")
    p.add_argument("--profile", choices=("dev", "ci", "gpu", "nightly"), default=None,
                   help="examples and sizes: ci (small shapes, 20 examples; the CPU default), gpu (large shapes, "
                        "100; the CUDA default), nightly (1000), dev")
    p.add_argument("--max-examples", type=int, default=None, metavar="N", help="examples per check")
    p.add_argument("--refusals", choices=("auto", "discard", "fail"), default="auto",
                   help="auto: a refusal your function declares (tritoncheck.Refusal, fn.refuses) is discarded and "
                        "counted, any other exception fails with its traceback; discard: undeclared ones are "
                        "counted too, up to a fifth of a test's examples; fail: every refusal fails")
    p.add_argument("--tolerance", choices=("derived", "parity"), default="derived",
                   help="derived allowances, or parity: also within 2x plain PyTorch's own error")
    p.add_argument("--report-dir", default="reports", help="where the report and the replay files go (./reports)")
    p.add_argument("-n", "--workers", default=None, metavar="N",
                   help="pytest-xdist worker processes (a number or auto); default: one process")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="only the K-th of N deterministic shares of the checks (a CI matrix); "
                        "`tritoncheck report merge` joins the shards' reports")
    return p


def pytest_args(ns: argparse.Namespace, extra: list[str]) -> list[str]:
    """The pytest command line that runs what ``ns`` asks for."""
    here = Path(__file__).parent
    # --confcutdir: from an editable install the suite's file lies in a checkout, whose
    # conftest.py would put the checkout first on sys.path, where its kernels/ would
    # shadow a user's package of that name. --rootdir: test ids read suite.py::test_check[...].
    args = [str(here / "suite.py"), "-p", "tritoncheck.plugin", "-o", "tritoncheck=true", "-p", "no:cacheprovider",
            "--confcutdir", str(here), "--rootdir", str(here), "--report-dir", ns.report_dir, "--backend", ns.backend,
            "--refusals", ns.refusals, "--tolerance", ns.tolerance]
    for spec in ns.impls:
        args += ["--impl", spec]
    for dtype in ns.dtype:
        args += ["--dtype", dtype]
    if ns.list_ops:
        args.append("--list-ops")
    if ns.profile:
        args += ["--hypothesis-profile", ns.profile]
    if ns.max_examples is not None:
        args += ["--max-examples", str(ns.max_examples)]
    if ns.workers:
        args += ["-n", str(ns.workers)]
    if ns.shard:
        args += ["--shard", ns.shard]
    return args + extra


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
    return int(pytest.main(pytest_args(ns, extra)))


if __name__ == "__main__":
    raise SystemExit(main())
