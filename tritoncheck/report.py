"""The tolerance report: how much of each dtype's error budget every output used.

Every comparison made by a reference check is recorded (one row per example and
output). Each pytest process (each xdist worker) writes its rows to
``<report-dir>/parts/``; the controlling process merges them into ``report.json``
(schema in ``docs/report-schema.md``), ``report.md`` and ``report.html``, and
prints a compact table at the end of the run.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from tritoncheck.coverage import regime
from tritoncheck.report_summary import headroom_cell, output_figures, summary_markdown, ulp_cell

SCHEMA_VERSION = 4


class Collector:
    """Rows recorded in this process."""

    def __init__(self):
        self.rows: list[dict] = []
        self.examples: dict[str, int] = defaultdict(int)  # test id -> examples run
        self.invalid: dict[str, int] = defaultdict(int)  # test id -> of which discarded by assume
        self.refused: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # id -> message -> n
        # of which undeclared (tritoncheck/refusals.py), and the first one's traceback per test
        self.undeclared: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.first_traceback: dict[str, str] = {}
        self.seconds: dict[str, list[float]] = defaultdict(list)  # test id -> each example's duration, in order
        # test id -> output -> [examples that compared it, of which mostly vacuous]
        self.vacuity: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        self.coverage: dict[str, dict] = {}  # test id -> what its counted examples drew (tritoncheck/coverage.py)

    def count(self, target, invalid: bool = False, refused: bool = False, seconds: float | None = None,
              case=None) -> None:
        self.examples[target.id] += 1
        self.invalid[target.id] += int(invalid)
        if seconds is not None:
            self.seconds[target.id].append(seconds)
        if case is not None and not invalid and not refused:
            from tritoncheck import coverage
            coverage.record(self.coverage.setdefault(target.id, {}), case)

    def refuse(self, target, message: str, declared: bool = True, traceback_text: str | None = None) -> None:
        self.refused[target.id][message] += 1
        if not declared:
            self.undeclared[target.id][message] += 1
            if traceback_text:
                self.first_traceback.setdefault(target.id, traceback_text)

    def refusals_of(self, test_id: str) -> dict[str, int]:
        return dict(self.refused.get(test_id, {}))

    def undeclared_of(self, test_id: str) -> dict[str, int]:
        return dict(self.undeclared.get(test_id, {}))

    def counted(self, test_id: str) -> int:
        """Examples of the test that ran its check to the end: neither discarded by a
        precondition (assume) nor refused."""
        return self.examples[test_id] - self.invalid[test_id] - sum(self.refused.get(test_id, {}).values())

    def sink(self, target, case, rows: bool = True):
        """What records ``target``'s comparisons on ``case`` (``tritoncheck.oracle.recording``):
        each counts toward the test's vacuity verdict, and those that are report rows
        (``row``, for a check whose ``rows`` the report tabulates) are added to the rows."""
        from tritoncheck import backend

        def record(c, parity=None, passed=None, row=True):
            # parity: PyTorch's error on the same input (tritoncheck/parity.py); passed: the
            # verdict under the run's --tolerance mode, when it is not the comparison's own
            tally = self.vacuity[target.id][c.output]
            tally[0] += 1
            tally[1] += int(c.mostly_vacuous)
            if not (rows and row):
                return
            baseline = parity.baseline_max_abs if parity is not None else None
            at_scale = ulps_at_scale(c.max_abs, c.scale, c.dtype)
            torch_ulps = None if baseline is None else ulps_at_scale(baseline, c.scale, c.dtype)
            self.rows.append({
                "op": target.op.name, "impl": target.impl.name, "dtype": str(target.dtype).replace("torch.", ""),
                "backend": backend.current(), "check": target.check.name, "output": c.output,
                "numel": c.numel, "max_abs": c.max_abs, "max_rel": c.max_rel, "max_ulp": c.max_ulp,
                "headroom": c.headroom, "allowed_at_worst": c.allowed, "scale": c.scale,
                "passed": c.ok if passed is None else passed, "case": case.to_json(),
                "impl_target": target.impl.target,
                "baseline_max_abs": parity.baseline_max_abs if parity is not None else None,
                "parity_ratio": parity.ratio if parity is not None else None,
                "counted": c.counted, "vacuous": c.vacuous, "mostly_vacuous": c.mostly_vacuous,
                "uncheckable": c.uncheckable, "rule": c.rule,
                # the figures the tables show (docs/report-schema.md): finite wherever the output is
                "ulp_at_scale": at_scale, "rel_counted": c.max_rel_counted, "baseline_ulp_at_scale": torch_ulps,
                # PyTorch's error below TORCH_EXACT_ULP is no error at the output's scale: no ratio there
                "torch_exact": torch_ulps is not None and torch_ulps < TORCH_EXACT_ULP,
                "parity_ratio_finite": parity.ratio if torch_ulps is not None and torch_ulps >= TORCH_EXACT_ULP
                else None,
                "example": self.examples[target.id],  # its index in the test: rows sort by (test, example)
            })
        return record

    def dump(self, folder: Path, name: str, gpu: int | None = None) -> None:
        """Write this process's rows; ``gpu``: the CUDA device index its tests ran on
        (tritoncheck/devices.py: one GPU per xdist worker), None off CUDA."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps({"rows": self.rows, "examples": self.examples,
                                                           "invalid": self.invalid, "refused": self.refused,
                                                           "undeclared": self.undeclared,
                                                           "seconds": self.seconds, "gpu": gpu,
                                                           "coverage": self.coverage}))


# PyTorch's error below this many ulps of the output dtype at the output's scale counts as
# exact: it is below the resolution at which the output is read (its small elements have
# finer ulps, and an error of 1e-60 on an expected 1e-59 that fp32 flushes is no error at
# the output's scale of 1), and a ratio against it (1.5e58 seen) says nothing actionable.
TORCH_EXACT_ULP = 1e-2


def ulps_at_scale(max_abs: float, scale: float, dtype) -> float:
    """The largest error in ulps of the output dtype at the output's scale (its largest
    |expected|, per tensor): what a kernel loses against the output's own rounding, finite
    wherever the error is. Below the vacuity floors (tritoncheck/oracle.py FLOOR_MULTIPLE
    underflow floors) the scale is taken at that floor: an output that is all zeros or
    all underflow measures its error against the smallest scale that counts."""
    from tritoncheck import tolerance
    from tritoncheck.oracle import FLOOR_MULTIPLE
    if not dtype.is_floating_point:
        return 0.0
    at = max(scale, FLOOR_MULTIPLE * tolerance.underflow_floor(dtype))
    return max_abs / float(tolerance.ulp(np.array([at]), dtype)[0])


def _finite(values):
    return [v for v in values if v is not None and math.isfinite(v)]


def _pct(values, q):
    v = _finite(values)
    return float(np.percentile(v, q)) if v else None


def summarise(rows: list[dict]) -> list[dict]:
    """One entry per (op, impl, dtype, backend, output)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["op"], r["impl"], r["dtype"], r["backend"], r["output"])].append(r)
    out = []
    for (op, impl, dtype, be, output), rs in sorted(groups.items()):
        worst = max(rs, key=lambda r: r["headroom"] if math.isfinite(r["headroom"]) else 1e300)
        out.append({
            "op": op, "impl": impl, "dtype": dtype, "backend": be, "output": output,
            "examples": len(rs), "failed": sum(not r["passed"] for r in rs),
            "max_abs": max(r["max_abs"] for r in rs), "p99_abs": _pct([r["max_abs"] for r in rs], 99),
            "max_rel": max(r["max_rel"] for r in rs), "p99_rel": _pct([r["max_rel"] for r in rs], 99),
            "max_ulp": max(r["max_ulp"] for r in rs), "p99_ulp": _pct([r["max_ulp"] for r in rs], 99),
            "vacuous": sum(r["vacuous"] for r in rs), "counted": sum(r["counted"] for r in rs),
            "uncheckable": sum(r.get("uncheckable", 0) for r in rs),
            "vacuous_examples": sum(r["mostly_vacuous"] for r in rs),
            "vacuous_where": vacuous_where(rs),
            "max_headroom": worst["headroom"], "allowed_at_worst": worst["allowed_at_worst"],
            "closest_case": {"check": worst["check"], "impl": worst["impl_target"], "case": worst["case"]},
            "points": [[r["numel"], r["max_rel"], r["headroom"]] for r in rs],
            "parity_ratio_at_worst": worst.get("parity_ratio"), "baseline_at_worst": worst.get("baseline_max_abs"),
            **_parity_summary(rs),
            **output_figures(rs),
        })
    return out


def vacuous_where(rows: list[dict], top: int = 3) -> list[dict]:
    """Where an output's vacuous elements came from: the input regimes (:func:`regime`) of
    the examples that had them, most elements first, with element and example counts."""
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        if r["vacuous"]:
            t = tally[r["regime"] if "regime" in r else regime(r["case"])]
            t[0] += r["vacuous"]
            t[1] += 1
    ranked = sorted(tally.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"regime": k, "elements": v[0], "examples": v[1]} for k, v in ranked]


def _parity_summary(rows: list[dict]) -> dict:
    """The largest kernel / PyTorch error ratio over the examples that had a yardstick,
    with PyTorch's own error on that example (tritoncheck/parity.py)."""
    measured = [r for r in rows if r.get("parity_ratio") is not None]
    if not measured:
        return {"max_parity_ratio": None, "baseline_at_max_ratio": None, "parity_examples": 0}
    top = max(measured, key=lambda r: r["parity_ratio"])
    return {"max_parity_ratio": top["parity_ratio"], "baseline_at_max_ratio": top["baseline_max_abs"],
            "parity_examples": len(measured)}


def merge(folder: Path) -> dict:
    rows, examples, invalid, seconds, gpu, covered = [], defaultdict(int), defaultdict(int), {}, {}, {}
    refused: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    undeclared: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for part in sorted((folder / "parts").glob("*.json")):
        data = json.loads(part.read_text())
        rows.extend(data["rows"])
        for k, v in data["examples"].items():
            examples[k] += v
        for k, v in data.get("invalid", {}).items():
            invalid[k] += v
        for k, messages in data.get("refused", {}).items():
            for msg, n in messages.items():
                refused[k][msg] += n
        for k, messages in data.get("undeclared", {}).items():
            for msg, n in messages.items():
                undeclared[k][msg] += n
        covered.update(data.get("coverage", {}))  # a test runs in one process: its tally is in one part
        seconds.update(data.get("seconds", {}))  # a test runs in one process: its durations are in one part
        if data.get("gpu") is not None:  # the process's GPU ran every test of its part
            gpu.update({test: data["gpu"] for test in data["examples"]})
    return {"rows": rows, "examples": dict(examples), "invalid": dict(invalid),
            "refused": {k: dict(v) for k, v in refused.items()},
            "undeclared": {k: dict(v) for k, v in undeclared.items()}, "seconds": seconds, "gpu": gpu,
            "coverage": covered}


def timings(seconds: dict[str, list[float]]) -> dict[str, dict]:
    """Per test: the first example's duration (where compilation and autotuning land in a
    fresh process), the median of the others, and their difference (the compile and
    autotune estimate)."""
    out = {}
    for test, ds in seconds.items():
        rest = float(np.median(ds[1:])) if len(ds) > 1 else None
        out[test] = {"examples": len(ds), "first_s": ds[0], "median_rest_s": rest, "total_s": float(sum(ds)),
                     "compile_s": max(0.0, ds[0] - rest) if rest is not None else None}
    return out


# The derived rounding bounds are not statistical checks, but their sqrt(n) part is a
# probabilistic bound (tritoncheck/tolerance.py, SUM_LAMBDA): said once in every report.
ROUNDING_NOTE = ("the derived allowances' sqrt(n) sum terms are probabilistic bounds acting at lambda = "
                 "SAFETY x SUM_LAMBDA = 10: at most 2 exp(-50) = 3.9e-22 per sum (tritoncheck/tolerance.py)")


def statistical(examples: dict[str, int], invalid: dict[str, int]) -> dict:
    """Per test of a statistical check (``Check.false_alarm`` set): the examples that reached
    a verdict, the rate per example and their product; and the union bound over the run."""
    from tritoncheck import registry
    tests = {}
    for test, n in sorted(examples.items()):
        op, check = test.split("-")[0], test.rsplit("-", 1)[-1]
        spec = registry.OPS.get(op)
        found = [c for c in spec.checks if c.name == check] if spec else []
        if found and found[0].false_alarm is not None:
            ran = max(0, n - invalid.get(test, 0))
            tests[test] = {"examples": ran, "rate": found[0].false_alarm, "bound": ran * found[0].false_alarm}
    return {"tests": tests, "run_bound": sum(t["bound"] for t in tests.values()), "rounding": ROUNDING_NOTE}


def gpu_line(report: dict) -> str:
    """How many tests each GPU ran (empty off CUDA): a run with ``-n N`` on G GPUs spreads
    its workers over all of them (tritoncheck/devices.py)."""
    per_test = report.get("gpu_per_test") or {}
    if not per_test:
        return ""
    counts = defaultdict(int)
    for index in per_test.values():
        counts[index] += 1
    return "tests per GPU: " + ", ".join(f"cuda:{i} {n}" for i, n in sorted(counts.items()))


def statistical_line(report: dict) -> str:
    figures = report.get("statistical") or {}
    tests = figures.get("tests", {})
    if not tests:
        return ""
    worst = max(tests.items(), key=lambda kv: kv[1]["bound"])
    return (f"statistical checks: {len(tests)} tests, {sum(t['examples'] for t in tests.values())} examples, "
            f"false-alarm bound {figures['run_bound']:.2g} for this run (union bound; largest: {worst[0]} "
            f"{worst[1]['examples']} x {worst[1]['rate']:.0e} = {worst[1]['bound']:.2g})")


def build(folder: Path, skipped: list[dict], meta: dict, limits: dict | None = None,
          verdicts: dict[str, str] | None = None, crashes: dict[str, str] | None = None) -> dict:
    """The report of a run from its processes' parts; ``verdicts``: test id -> outcome;
    ``crashes``: test id -> what was said of the worker that died in it (a failed verdict)."""
    merged = merge(folder)
    return assemble(merged["rows"], {"examples": merged["examples"], "invalid": merged["invalid"],
                                     "refused": merged["refused"], "undeclared": merged["undeclared"]},
                    meta=meta, skipped=skipped, limits=limits or {}, verdicts=verdicts or {},
                    coverage=merged["coverage"], timing=timings(merged["seconds"]), gpu=merged["gpu"],
                    crashes=crashes)


def row_order(row: dict) -> tuple:
    """Rows in (test, example) order, whatever order processes or shards ran the tests in:
    the figures that depend on row order (points, ties of the worst case) are then the same
    for a run split over shards and merged (tritoncheck/report_shards.py)."""
    return (f"{row['op']}-{row['impl']}-{row['dtype']}-{row['check']}", row["backend"], row.get("example", 0))


def slim(rows: list[dict]) -> list[dict]:
    """The rows with their input regime (:func:`regime`), and the whole case only where a
    figure of the report names it: per test and output, the example closest to failing,
    the passing one with the most ulps and the first whose expected output was all zeros
    (tritoncheck/report_summary.py notes). Whatever a run's shards, each test's rows come
    from one process, so the cases kept, and so the report, are the same."""
    keep: dict[tuple, dict[str, int]] = defaultdict(dict)
    # as summarise and report_summary.notes_for rank them: a non-finite headroom is the worst
    headroom = [r["headroom"] if math.isfinite(r["headroom"]) else 1e300 for r in rows]
    for i, r in enumerate(rows):
        if "case" not in r:
            continue
        k = keep[(row_order(r)[:2], r["output"])]
        if "worst" not in k or headroom[i] > headroom[k["worst"]]:
            k["worst"] = i
        u = r.get("ulp_at_scale")
        if r["passed"] and u is not None and math.isfinite(u) and ("ulp" not in k or u > rows[k["ulp"]]["ulp_at_scale"]):
            k["ulp"] = i
        if r.get("scale", 1.0) == 0 and r["max_abs"] > 0:
            k.setdefault("zero", i)
    named = {i for k in keep.values() for i in k.values()}
    out = []
    for i, r in enumerate(rows):
        r = dict(r)
        if "case" in r:
            r["regime"] = regime(r["case"])
            if i not in named:
                del r["case"]
        out.append(r)
    return out


def assemble(rows: list[dict], per_test: dict, *, meta: dict, skipped: list[dict], limits: dict,
             verdicts: dict[str, str], coverage: dict, timing: dict, gpu: dict,
             crashes: dict[str, str] | None = None) -> dict:
    """The report from its raw records: the recorded comparisons (``rows``), the per-test
    counts (``per_test``: examples, invalid, refused, undeclared), the verdicts and the
    coverage tallies. A run and the merge of its shards both come through here."""
    from tritoncheck import report_summary
    rows = slim(sorted(rows, key=row_order))  # stable: one example's outputs keep their recorded order
    examples, invalid = per_test["examples"], per_test["invalid"]
    refused, undeclared = per_test["refused"], per_test["undeclared"]
    report = {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "meta": meta,
        "outputs": summarise(rows),
        "verdicts": dict(sorted(verdicts.items())),
        "crashes": dict(sorted((crashes or {}).items())),
        "coverage_per_test": dict(sorted(coverage.items())),
        "examples_per_test": dict(sorted(examples.items())),
        "invalid_per_test": dict(sorted(invalid.items())),
        "refusals_per_test": dict(sorted(refused.items())),
        "undeclared_refusals_per_test": dict(sorted(undeclared.items())),
        "refusals_per_op_dtype": refusals_per_op_dtype(examples, refused, undeclared),
        "limits": limits,
        "vacuous_per_test": _vacuous_per_test(rows),
        "timing_per_test": timing,
        "gpu_per_test": gpu,
        "statistical": statistical(examples, invalid),
        "skipped": sorted(skipped, key=lambda s: s["test"]),
        "rows": rows,
    }
    report["summary"] = report_summary.summary(report)
    return report


def _fmt(v, spec=".2e"):
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def _torch_cell(o: dict) -> str:
    """The kernel's max |error| / PyTorch's over the examples where PyTorch's was nonzero
    (median, max); 'exact' where PyTorch never erred; '-' without a yardstick."""
    if o.get("max_parity_ratio_finite") is not None:
        exact = f", torch exact in {o['torch_exact_examples']}" if o.get("torch_exact_examples") else ""
        return f"{o['p50_parity_ratio']:.3g}x / {o['max_parity_ratio_finite']:.3g}x{exact}"
    return "exact" if o.get("torch_exact_examples") else "-"


def _rel_cell(o: dict) -> str:
    v = o.get("max_rel_counted")
    return "-" if v is None else ulp_cell(v) if not math.isfinite(v) else f"{v:.3g}"


def output_cells(report: dict) -> list[list[str]]:
    """Per output: the finite figures the tables show (docs/report-schema.md), and the
    numbers of its notes (listed under the table)."""
    cells, n = [], 0
    for o in report["outputs"]:
        refs = []
        for _ in o.get("notes", []):
            n += 1
            refs.append(f"[{n}]")
        cells.append([o["op"], o["impl"], o["dtype"], o["output"], str(o["examples"]), str(o["failed"]),
                      ulp_cell(o.get("max_ulp_at_scale")), ulp_cell(o.get("p50_ulp_at_scale")), _rel_cell(o),
                      headroom_cell(o["max_headroom"]), _torch_cell(o), _vacuous(o), " ".join(refs)])
    return cells


OUTPUT_COLUMNS = ("op", "impl", "dtype", "output", "examples", "failed", "max ulp", "p50 ulp", "max rel",
                  "headroom", "vs torch p50/max", "vacuous", "note")


def notes(report: dict) -> list[str]:
    return [f"[{i}] {text}" for i, text in enumerate((t for o in report["outputs"] for t in o.get("notes", [])), 1)]


def table(report: dict) -> str:
    """The per-output table printed at the end of a run, under the summary."""
    rows = [list(OUTPUT_COLUMNS)] + output_cells(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(OUTPUT_COLUMNS))]
    lines = ["  ".join(c.rjust(w) if 4 <= i <= 11 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append("ulp: largest |error| in ulps of the output dtype at the output's scale (per tensor), max and median "
                 "over examples; rel: over the elements where it is defined; vs torch: kernel / PyTorch error where "
                 "PyTorch's is nonzero. docs/report-schema.md")
    return "\n".join(lines + notes(report))


def refusals_per_op_dtype(examples: dict[str, int], refused: dict[str, dict[str, int]],
                          undeclared: dict[str, dict[str, int]]) -> list[dict]:
    """Refusals summed per (op, implementation, dtype) over its checks' tests (ids
    ``op-impl-dtype-check``), those with any first, with the messages: what the run did
    not check, before any figure of what it did."""
    groups: dict[tuple[str, str, str], dict] = {}
    for test in sorted(set(examples) | set(refused)):
        op, *impl, dtype, _check = test.split("-")
        g = groups.setdefault((op, "-".join(impl), dtype), {"op": op, "impl": "-".join(impl), "dtype": dtype,
                                                            "examples": 0, "refused": 0, "undeclared": 0,
                                                            "messages": defaultdict(int)})
        g["examples"] += examples.get(test, 0)
        g["refused"] += sum(refused.get(test, {}).values())
        g["undeclared"] += sum(undeclared.get(test, {}).values())
        for msg, n in refused.get(test, {}).items():
            g["messages"][msg] += n
    return [{**g, "messages": dict(g["messages"])} for g in groups.values() if g["refused"]]


def refusal_lines(report: dict) -> list[str]:
    """One line per (op, implementation, dtype) with refusals: the terminal summary and
    the markdown report lead with these."""
    from tritoncheck.refusals import summarise
    return [f"{g['op']}/{g['impl']}/{g['dtype']}: {g['refused']} of {g['examples']} examples refused "
            f"({g['undeclared']} undeclared): {summarise(g['messages'], width=90)}"
            for g in report.get("refusals_per_op_dtype", [])]


DISCARD_SHOWN = 0.10  # a test whose examples were discarded more often than this is listed


def discard_rows(report: dict) -> list[dict]:
    """Tests whose examples were refused, vacuous, or discarded (assume) more than
    :data:`DISCARD_SHOWN` of the time: what a pass did not cover."""
    from tritoncheck.refusals import summarise
    ex, bad = report.get("examples_per_test", {}), report.get("invalid_per_test", {})
    refused, vacuous = report.get("refusals_per_test", {}), report.get("vacuous_per_test", {})
    rows = []
    for test in sorted(set(ex) | set(refused)):
        n, d = ex.get(test, 0), bad.get(test, 0)
        r = sum(refused.get(test, {}).values())
        v = vacuous.get(test, 0)
        if r or v or (n and d / n > DISCARD_SHOWN):
            rows.append({"test": test, "examples": n, "discarded": d, "refused": r, "vacuous": v,
                         "messages": summarise(refused.get(test, {}), width=90) if r else ""})
    return rows


def discard_table(report: dict) -> str:
    """Printed under the tolerance table: examples that did not count."""
    rows = discard_rows(report)
    if not rows:
        return ""
    head = f"{'test':<58} {'n':>5} {'assume':>7} {'refused':>8} {'vacuous':>8}  refusal messages"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['test'][:58]:<58} {r['examples']:>5} {r['discarded']:>7} {r['refused']:>8} "
                     f"{r['vacuous']:>8}  {r['messages']}")
    return "\n".join(lines)


def _vacuous_per_test(rows: list[dict]) -> dict[str, int]:
    """Per test, the compared elements whose allowance reached |expected| (the vacuity guard)."""
    out: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.get("vacuous"):
            out[f"{r['op']}-{r['impl']}-{r['dtype']}-{r['check']}"] += r["vacuous"]
    return dict(out)


def _vacuous(o: dict) -> str:
    """Vacuous elements, and (after the slash) examples in which most elements were."""
    return f"{o['vacuous']}/{o['vacuous_examples']}"


def _vacuity_line(report: dict) -> str:
    bad = [o for o in report["outputs"] if o["vacuous"]]
    if not bad:
        return "No vacuous elements: every counted allowance stayed below |expected|."
    listed = "; ".join(f"{o['op']}/{o['impl']}/{o['dtype']}/{o['output']}: {o['vacuous']} of {o['counted']} "
                       f"elements, {o['vacuous_examples']} of {o['examples']} examples" + _where(o) for o in bad)
    return (f"Vacuous elements (allowance >= |expected|: an output of 0 would have passed there), "
            f"per output, with the input regimes they came from: {listed}. Why an output can be vacuous "
            f"there: docs/vacuity.md.")


def vacuous_lines(report: dict) -> list[str]:
    """For the terminal: outputs with at least one mostly vacuous example, and where."""
    return [f"vacuous {o['op']}/{o['impl']}/{o['dtype']}/{o['output']}: {o['vacuous']} of {o['counted']} elements, "
            f"{o['vacuous_examples']} of {o['examples']} examples mostly" + _where(o)
            for o in report["outputs"] if o["vacuous_examples"]]


def _where(o: dict) -> str:
    where = o.get("vacuous_where") or []
    return (" (where: " + "; ".join(f"{w['regime']}: {w['elements']} in {w['examples']} ex." for w in where) + ")"
            if where else "")


def _examples_line(report: dict) -> str:
    ex, bad = report.get("examples_per_test", {}), report.get("invalid_per_test", {})
    total, invalid = sum(ex.values()), sum(bad.values())
    refused = sum(n for messages in report.get("refusals_per_test", {}).values() for n in messages.values())
    worst = sorted(((bad.get(t, 0) / n, t) for t, n in ex.items() if n), reverse=True)[:3]
    most = ", ".join(f"`{t}` {r:.0%}" for r, t in worst if r > 0) or "none"
    return (f"{total} examples over {len(ex)} tests, {invalid} discarded by the checks' preconditions "
            f"(assume), {refused} refused by the implementation; the most discarded: {most}.")


def coverage_section(report: dict) -> list[str]:
    """Markdown: what each check's counted examples drew (``coverage_per_test``), so a green
    check that never went past a few hundred rows shows as such."""
    from tritoncheck.coverage import largest_line
    cov = report.get("coverage_per_test") or {}
    if not cov:
        return []
    lines = ["", "## What each check's examples reached", "",
             "| check | counted examples | largest input | layouts | dtypes | value families |", "|---|---:|---|---|---|---|"]
    lines += [f"| `{test}` | {t.get('examples', 0)} | {largest_line(t)} | {', '.join(t.get('layouts', []))} | "
              f"{', '.join(t.get('dtypes', []))} | {', '.join(t.get('families', []))} |" for test, t in cov.items()]
    return lines


def _slowest_first_examples(report: dict, count: int = 15) -> list[tuple[str, dict]]:
    t = report.get("timing_per_test", {})
    return sorted(t.items(), key=lambda kv: -(kv[1]["compile_s"] or 0.0))[:count]


def timing_line(report: dict) -> str | None:
    """The terminal's one line on compile and autotune time."""
    slow = [(t, v) for t, v in _slowest_first_examples(report, 3) if v["compile_s"]]
    if not slow:
        return None
    return "slowest first examples (compile + autotune): " + ", ".join(
        f"{t} {v['first_s']:.1f} s (others {v['median_rest_s']:.2f} s)" for t, v in slow)


def markdown(report: dict) -> str:
    m = report["meta"]
    lines = ["# Tolerance report", "", summary_markdown(report), *crash_section(report), "## Outputs", "",
             f"Backend `{m.get('backend')}`, profile `{m.get('profile')}`, device {m.get('device')}, "
             f"{report['created']}. Headroom is the largest error divided by its allowance (<= 1 passes). "
             f"Tolerance mode `{m.get('tolerance', 'derived')}`"
             + (f"; shape pool `--shapes {m['shapes']}`" if m.get("shapes") else "")
             + (f"; autotuned kernels pinned to config {m['autotune_config']}" if m.get("autotune_config") is not None
                else "") + "; vs torch is the ratio of the kernel's max "
             "|error| to plain PyTorch's in the input dtype on the same input, over the examples where PyTorch's "
             "error was nonzero (median / max; 'exact': PyTorch never erred). ulp: the largest |error| in ulps of "
             "the output dtype at the output's scale (per tensor), max and median over examples; rel: max |error| / "
             "|expected| over the elements where it is defined (docs/report-schema.md). Vacuous: elements whose "
             "allowance reached |expected| (0 would have passed) / examples in which most elements did.", "",
             *(["## Refusals per op and dtype", "", *(f"- {line}" for line in refusal_lines(report)), "",
                "## Tolerances", ""] if refusal_lines(report) else []),
             "| " + " | ".join(OUTPUT_COLUMNS) + " |", "|---|---|---|---|" + "---:|" * 8 + "---|"]
    lines += ["| " + " | ".join(row) + " |" for row in output_cells(report)]
    if notes(report):
        lines += ["", *(f"- {n}" for n in notes(report))]
    lines += coverage_section(report)
    lines += ["", "## Vacuous elements", "", _vacuity_line(report)]
    lines += ["", "## Examples run (Hypothesis)", "", _examples_line(report)]
    lines += ["", "## False alarms", "", (statistical_line(report) or "no statistical check ran") + ";",
              (report.get("statistical") or {}).get("rounding", ROUNDING_NOTE) + "."]
    rows = discard_rows(report)
    if rows:
        lines += ["", f"## Refusals, vacuous comparisons and discards (over {DISCARD_SHOWN:.0%})", "",
                  "| test | examples | discarded (assume) | refused | vacuous | refusal messages |",
                  "|---|---:|---:|---:|---:|---|"]
        lines += [f"| `{r['test']}` | {r['examples']} | {r['discarded']} | {r['refused']} | {r['vacuous']} | "
                  f"{r['messages']} |" for r in rows]
    if report.get("limits"):
        lines += ["", "## Declared limits", "", "| implementation | limits |", "|---|---|"]
        lines += [f"| `{k}` | {v} |" for k, v in sorted(report["limits"].items())]
    slow = _slowest_first_examples(report)
    if slow:
        lines += ["", "## Compile and autotune time (first example vs the median of the others)", "",
                  "| test | examples | first (s) | median of the others (s) | total (s) |", "|---|---:|---:|---:|---:|"]
        lines += [f"| `{t}` | {v['examples']} | {v['first_s']:.2f} | {_fmt(v['median_rest_s'], '.3f')} | "
                  f"{v['total_s']:.1f} |" for t, v in slow]
    if report["skipped"]:
        lines += ["", "## Skipped and expected failures", "", "| test | outcome | reason |", "|---|---|---|"]
        for s in report["skipped"]:
            lines.append(f"| `{s['test']}` | {s['outcome']} | {s['reason']} |")
    return "\n".join(lines) + "\n"


def crash_section(report: dict) -> list[str]:
    """The checks whose worker died (a failed verdict each), with what was said of it: the
    case that was running and its replay command, where one was."""
    crashes = report.get("crashes") or {}
    if not crashes:
        return []
    lines = ["## Crashed workers", "", f"{len(crashes)} check(s) took their worker process down (failed):", ""]
    for test, text in crashes.items():
        lines += [f"- `{test}`:", "", "  ```", *(f"  {line}" for line in text.strip().splitlines()), "  ```"]
    return lines + [""]


def clear_parts(folder: Path) -> None:
    parts = folder / "parts"
    if parts.is_dir():
        for p in parts.glob("*.json"):
            os.unlink(p)
