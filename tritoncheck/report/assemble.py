"""The run's report from its processes' parts: every recorded comparison, summarised per
output and per op x implementation x dtype, with the verdicts, refusals, coverage, timing
and false-alarm bounds (the schema is ``docs/report-schema.md``). A run and the merge of
its shards (``tritoncheck.report.shards``) both come through :func:`assemble`.
"""
from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from tritoncheck.coverage import regime
from tritoncheck.report import summary

SCHEMA_VERSION = 5


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
            "rule": rule_label(sorted({r.get("rule") or "" for r in rs})),
            "vacuous_examples": sum(r["mostly_vacuous"] for r in rs),
            "vacuous_where": vacuous_where(rs),
            "max_headroom": worst["headroom"], "allowed_at_worst": worst["allowed_at_worst"],
            "closest_case": {"check": worst["check"], "impl": worst["impl_target"], "case": worst["case"]},
            "points": [[r["numel"], r["max_rel"], r["headroom"]] for r in rs],
            "parity_ratio_at_worst": worst.get("parity_ratio"), "baseline_at_worst": worst.get("baseline_max_abs"),
            **_parity_summary(rs),
            **summary.output_figures(rs),
        })
    return out


def rule_label(rules: list[str]) -> str:
    """What judged an output, in a word: ``derived`` (a rule derived by hand for the op, a
    function of properties/), ``derived from ref`` (a defined op's running error bound
    through its reference), ``parity``, ``hand-typed`` (an allclose someone typed)."""
    labels = []
    for rule in rules:
        if rule.startswith("derived from the reference"):
            labels.append("derived from ref")
        elif rule.startswith("parity"):
            labels.append("parity")
        elif rule.startswith("hand-typed"):
            labels.append("hand-typed")
        elif rule:
            labels.append("derived")
    return ", ".join(dict.fromkeys(labels)) or "-"


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


def build(folder: Path, skipped: list[dict], meta: dict, limits: dict | None = None,
          verdicts: dict[str, str] | None = None, crashes: dict[str, str] | None = None,
          failures: list[dict] | None = None) -> dict:
    """The report of a run from its processes' parts; ``verdicts``: test id -> outcome;
    ``crashes``: test id -> what was said of the worker that died in it (a failed verdict);
    ``failures``: the failed checks' records (``tritoncheck.report.failures``)."""
    merged = merge(folder)
    return assemble(merged["rows"], {"examples": merged["examples"], "invalid": merged["invalid"],
                                     "refused": merged["refused"], "undeclared": merged["undeclared"]},
                    meta=meta, skipped=skipped, limits=limits or {}, verdicts=verdicts or {},
                    coverage=merged["coverage"], timing=timings(merged["seconds"]), gpu=merged["gpu"],
                    crashes=crashes, failures=failures)


def row_order(row: dict) -> tuple:
    """Rows in (test, example) order, whatever order processes or shards ran the tests in:
    the figures that depend on row order (points, ties of the worst case) are then the same
    for a run split over shards and merged (``tritoncheck.report.shards``)."""
    return (f"{row['op']}-{row['impl']}-{row['dtype']}-{row['check']}", row["backend"], row.get("example", 0))


def slim(rows: list[dict]) -> list[dict]:
    """The rows with their input regime (:func:`regime`), and the whole case only where a
    figure of the report names it: per test and output, the example closest to failing,
    the passing one with the most ulps and the first whose expected output was all zeros
    (``summary.notes_for``). Whatever a run's shards, each test's rows come
    from one process, so the cases kept, and so the report, are the same."""
    keep: dict[tuple, dict[str, int]] = defaultdict(dict)
    # as summarise and summary.notes_for rank them: a non-finite headroom is the worst
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
             crashes: dict[str, str] | None = None, failures: list[dict] | None = None) -> dict:
    """The report from its raw records: the recorded comparisons (``rows``), the per-test
    counts (``per_test``: examples, invalid, refused, undeclared), the verdicts, the failed
    checks' records and the coverage tallies. A run and the merge of its shards both come
    through here."""
    rows = slim(sorted(rows, key=row_order))  # stable: one example's outputs keep their recorded order
    examples, invalid = per_test["examples"], per_test["invalid"]
    refused, undeclared = per_test["refused"], per_test["undeclared"]
    report = {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "meta": meta,
        "outputs": summarise(rows),
        "verdicts": dict(sorted(verdicts.items())),
        "failures": sorted(failures or [], key=lambda f: f["test"]),
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
    report["summary"] = summary.summary(report)
    return report


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


def _vacuous_per_test(rows: list[dict]) -> dict[str, int]:
    """Per test, the compared elements whose allowance reached |expected| (the vacuity guard)."""
    out: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.get("vacuous"):
            out[f"{r['op']}-{r['impl']}-{r['dtype']}-{r['check']}"] += r["vacuous"]
    return dict(out)
