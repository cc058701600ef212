"""The tolerance report: how much of each dtype's error budget every output used.

Every comparison made by a reference check is recorded (one row per example and
output). Each pytest process (each xdist worker) writes its rows to
``<report-dir>/parts/``; the controlling process merges them into ``report.json``
(schema in ``docs/report-schema.md``), ``report.md`` and ``report.html``, and
prints a compact table at the end of the run.
"""
from __future__ import annotations

import html
import json
import math
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

SCHEMA_VERSION = 3


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

    def count(self, target, invalid: bool = False, refused: bool = False, seconds: float | None = None) -> None:
        self.examples[target.id] += 1
        self.invalid[target.id] += int(invalid)
        if seconds is not None:
            self.seconds[target.id].append(seconds)

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
                "uncheckable": c.uncheckable,
            })
        return record

    def dump(self, folder: Path, name: str, gpu: int | None = None) -> None:
        """Write this process's rows; ``gpu``: the CUDA device index its tests ran on
        (tritoncheck/devices.py: one GPU per xdist worker), None off CUDA."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps({"rows": self.rows, "examples": self.examples,
                                                           "invalid": self.invalid, "refused": self.refused,
                                                           "undeclared": self.undeclared,
                                                           "seconds": self.seconds, "gpu": gpu}))


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
        })
    return out


def regime(case: dict) -> str:
    """The value regime of a case's float inputs, in a few words: each tensor's strategy
    family (normal, near_max, tiny, offset, ...) and its scale where it has one."""
    parts = []
    for name in sorted(case.get("tensors", {})):
        spec = case["tensors"][name]
        if spec.get("family") == "indices" or spec.get("dtype") == "bool":
            continue
        scale = spec.get("scale", 1.0)
        shown = f" x{scale:g}" if scale not in (1, 1.0) and spec.get("family") not in ("near_max", "tiny") else ""
        parts.append(f"{name} {spec.get('family')}{shown}")
    return ", ".join(parts)


def vacuous_where(rows: list[dict], top: int = 3) -> list[dict]:
    """Where an output's vacuous elements came from: the input regimes (:func:`regime`) of
    the examples that had them, most elements first, with element and example counts."""
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        if r["vacuous"]:
            t = tally[regime(r["case"])]
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
    rows, examples, invalid, seconds, gpu = [], defaultdict(int), defaultdict(int), {}, {}
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
        seconds.update(data.get("seconds", {}))  # a test runs in one process: its durations are in one part
        if data.get("gpu") is not None:  # the process's GPU ran every test of its part
            gpu.update({test: data["gpu"] for test in data["examples"]})
    return {"rows": rows, "examples": dict(examples), "invalid": dict(invalid),
            "refused": {k: dict(v) for k, v in refused.items()},
            "undeclared": {k: dict(v) for k, v in undeclared.items()}, "seconds": seconds, "gpu": gpu}


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


def build(folder: Path, skipped: list[dict], meta: dict, limits: dict | None = None) -> dict:
    merged = merge(folder)
    return {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "meta": meta,
        "outputs": summarise(merged["rows"]),
        "examples_per_test": merged["examples"],
        "invalid_per_test": merged["invalid"],
        "refusals_per_test": merged["refused"],
        "undeclared_refusals_per_test": merged["undeclared"],
        "refusals_per_op_dtype": refusals_per_op_dtype(merged["examples"], merged["refused"], merged["undeclared"]),
        "limits": limits or {},
        "vacuous_per_test": _vacuous_per_test(merged["rows"]),
        "timing_per_test": timings(merged["seconds"]),
        "gpu_per_test": merged["gpu"],
        "statistical": statistical(merged["examples"], merged["invalid"]),
        "skipped": skipped,
    }


def _fmt(v, spec=".2e"):
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def table(report: dict) -> str:
    """The compact table printed at the end of a run."""
    head = (f"{'op':<28} {'impl':<14} {'dtype':<9} {'output':<7} {'n':>5} {'max abs':>9} {'max rel':>9} "
            f"{'max ulp':>9} {'headroom':>9} {'vs torch':>9} {'vacuous':>11}")
    lines = [head, "-" * len(head)]
    for o in report["outputs"]:
        lines.append(f"{o['op']:<28} {o['impl'][:14]:<14} {o['dtype']:<9} {o['output'][:7]:<7} {o['examples']:>5} "
                     f"{_fmt(o['max_abs']):>9} {_fmt(o['max_rel']):>9} {_fmt(o['max_ulp'], '.3g'):>9} "
                     f"{_fmt(o['max_headroom'], '.3f'):>9} {_fmt(o.get('parity_ratio_at_worst'), '.3g'):>9} "
                     f"{_vacuous(o):>11}")
    lines.append("vs torch: the kernel's max |error| / plain PyTorch's in the input dtype on the example closest to "
                 "failing ('-': PyTorch could not run there); the largest such ratio is in the report")
    return "\n".join(lines)


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


def _parity_cell(o: dict) -> str:
    """'ratio (PyTorch's error)' on the closest case; then the largest ratio over the examples."""
    if o.get("max_parity_ratio") is None:
        return "-"
    at_worst = "-" if o.get("parity_ratio_at_worst") is None else \
        f"{_fmt(o['parity_ratio_at_worst'], '.3g')} ({_fmt(o.get('baseline_at_worst'))})"
    return f"{at_worst}; max {_fmt(o['max_parity_ratio'], '.3g')} ({_fmt(o.get('baseline_at_max_ratio'))})"


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
    lines = ["# Tolerance report", "",
             f"Backend `{m.get('backend')}`, profile `{m.get('profile')}`, device {m.get('device')}, "
             f"{report['created']}. Headroom is the largest error divided by its allowance (<= 1 passes). "
             f"Tolerance mode `{m.get('tolerance', 'derived')}`"
             + (f"; shape pool `--shapes {m['shapes']}`" if m.get("shapes") else "")
             + (f"; autotuned kernels pinned to config {m['autotune_config']}" if m.get("autotune_config") is not None
                else "") + "; vs torch is the ratio of the kernel's max "
             "|error| to plain PyTorch's in the input dtype on the same input (PyTorch's error in brackets): on "
             "the example closest to failing, then the largest over the examples. Vacuous: elements whose allowance "
             "reached |expected| (0 would have passed) / examples in which most elements did.", "",
             *(["## Refusals per op and dtype", "", *(f"- {line}" for line in refusal_lines(report)), "",
                "## Tolerances", ""] if refusal_lines(report) else []),
             "| op | impl | dtype | output | examples | max abs | p99 abs | max rel | max ULP | headroom | vs torch | vacuous |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for o in report["outputs"]:
        lines.append(f"| {o['op']} | {o['impl']} | {o['dtype']} | {o['output']} | {o['examples']} | "
                     f"{_fmt(o['max_abs'])} | {_fmt(o['p99_abs'])} | {_fmt(o['max_rel'])} | "
                     f"{_fmt(o['max_ulp'], '.3g')} | {_fmt(o['max_headroom'], '.3f')} | {_parity_cell(o)} | {_vacuous(o)} |")
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


def html_page(report: dict) -> str:
    """One self-contained page: the table, error vs problem size per dtype, headroom per op."""
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(o['op'])}</td><td>{esc(o['impl'])}</td><td>{o['dtype']}</td><td>{esc(o['output'])}</td>"
        f"<td>{o['examples']}</td><td>{_fmt(o['max_abs'])}</td><td>{_fmt(o['max_rel'])}</td>"
        f"<td>{_fmt(o['max_ulp'], '.3g')}</td><td>{_fmt(o['max_headroom'], '.3f')}</td>"
        f"<td>{esc(_parity_cell(o))}</td><td>{_vacuous(o)}</td></tr>"
        for o in report["outputs"])
    data = json.dumps([{"label": f"{o['op']}/{o['impl']}/{o['output']}", "dtype": o["dtype"], "points": o["points"],
                        "headroom": o["max_headroom"] if math.isfinite(o["max_headroom"]) else 1e9}
                       for o in report["outputs"]])
    m = report["meta"]
    return _HTML.replace("{{TITLE}}", esc(f"Tolerance report: {m.get('backend')}, {m.get('device')}")) \
        .replace("{{META}}", esc(json.dumps(m))) \
        .replace("{{REFUSALS}}", ("<h2>Refusals per op and dtype</h2><ul>" + "".join(
            f"<li>{esc(line)}</li>" for line in refusal_lines(report)) + "</ul>") if refusal_lines(report) else "") \
        .replace("{{ROWS}}", rows).replace("{{DATA}}", data) \
        .replace("{{EXAMPLES}}", esc(_examples_line(report)).replace("`", "")
                 + (f"<pre>{esc(discard_table(report))}</pre>" if discard_rows(report) else "")
                 + "".join(f"<p>limits of <code>{esc(k)}</code>: {esc(v)}</p>"
                           for k, v in sorted(report.get("limits", {}).items()))
                 + f"<p>False alarms: {esc(statistical_line(report) or 'no statistical check ran')}; "
                 f"{esc((report.get('statistical') or {}).get('rounding', ROUNDING_NOTE))}.</p>") \
        .replace("{{TIMING}}", "".join(
            f"<tr><td>{esc(t)}</td><td>{v['examples']}</td><td>{v['first_s']:.2f}</td>"
            f"<td>{_fmt(v['median_rest_s'], '.3f')}</td><td>{v['total_s']:.1f}</td></tr>"
            for t, v in _slowest_first_examples(report))) \
        .replace("{{VACUITY}}", esc(_vacuity_line(report))) \
        .replace("{{SKIPPED}}", "".join(f"<li><code>{esc(s['test'])}</code> {esc(s['outcome'])}: {esc(s['reason'])}</li>"
                                        for s in report["skipped"]))


def write(folder: Path, report: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=1))
    (folder / "report.md").write_text(markdown(report))
    (folder / "report.html").write_text(html_page(report))


def clear_parts(folder: Path) -> None:
    parts = folder / "parts"
    if parts.is_dir():
        for p in parts.glob("*.json"):
            os.unlink(p)


_HTML = """<!doctype html><html><head><meta charset="utf-8"><title>{{TITLE}}</title>
<style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:nth-child(-n+4){text-align:left}
canvas{border:1px solid #ddd;margin:8px 16px 8px 0}.legend span{margin-right:14px}</style></head><body>
<h1>{{TITLE}}</h1><p><small>{{META}}</small></p>
{{REFUSALS}}
<h2>Headroom per output (largest error / allowed: above 1 fails; exact outputs, 0, draw no bar)</h2>
<p class="legend"><span style="color:#1f77b4">&#9632; float32</span><span style="color:#d62728">&#9632; float16</span>
<span style="color:#2ca02c">&#9632; bfloat16</span><span>&#9632; black: failed</span></p>
<canvas id="bars" width="900" height="420"></canvas>
<h2>Relative error against problem size, per dtype</h2><div id="scatter"></div>
<h2>All outputs</h2><table><tr><th>op</th><th>impl</th><th>dtype</th><th>output</th><th>examples</th>
<th>max abs</th><th>max rel</th><th>max ULP</th><th>headroom</th><th>vs torch (torch's error)</th><th>vacuous</th></tr>{{ROWS}}</table>
<h2>Vacuous elements</h2><p>{{VACUITY}}</p>
<h2>Examples run (Hypothesis)</h2><div>{{EXAMPLES}}</div>
<h2>Compile and autotune time (first example vs the median of the others)</h2>
<table><tr><th>test</th><th>examples</th><th>first (s)</th><th>median of the others (s)</th><th>total (s)</th></tr>
{{TIMING}}</table>
<h2>Skipped and expected failures</h2><ul>{{SKIPPED}}</ul>
<script>
const data = {{DATA}};
const colors = {float32:"#1f77b4", float16:"#d62728", bfloat16:"#2ca02c"};
function log10(v){return Math.log(v)/Math.LN10}
(function bars(){
  const c=document.getElementById("bars"), g=c.getContext("2d"), n=data.length; if(!n) return;
  const bw=Math.min(40, Math.max(14, 1100/n)); c.width=n*bw+200; const W=n*bw, H=240, x0=50, y0=20;
  const lo=-6, hi=1; const y=v=>y0+H-(Math.min(Math.max(log10(Math.max(v,1e-6)),lo),hi)-lo)/(hi-lo)*H;
  g.font="10px sans-serif"; g.strokeStyle="#999";
  for(let e=lo;e<=hi;e++){g.fillText("1e"+e,4,y(Math.pow(10,e))+3); g.beginPath(); g.moveTo(x0,y(Math.pow(10,e))); g.lineTo(x0+W,y(Math.pow(10,e))); g.stroke();}
  g.strokeStyle="#000"; g.beginPath(); g.moveTo(x0,y(1)); g.lineTo(x0+W,y(1)); g.stroke();
  data.forEach((d,i)=>{g.fillStyle=d.headroom>1?"#000":colors[d.dtype]||"#888"; const top=y(d.headroom);
    g.fillRect(x0+i*bw+2, top, bw-4, y0+H-top);
    g.save(); g.translate(x0+i*bw+bw/2, y0+H+6); g.rotate(Math.PI/3); g.fillStyle="#333"; g.fillText(d.label+" "+d.dtype,0,0); g.restore();});
})();
(function scatter(){
  const host=document.getElementById("scatter");
  const dtypes=[...new Set(data.map(d=>d.dtype))];
  dtypes.forEach(dt=>{
    const c=document.createElement("canvas"); c.width=420; c.height=300; host.appendChild(c);
    const g=c.getContext("2d"); const pts=[];
    data.filter(d=>d.dtype===dt).forEach(d=>d.points.forEach(p=>{if(p[1]>0&&isFinite(p[1])) pts.push([p[0],p[1]])}));
    const x0=50,y0=20,W=350,H=230;
    g.font="11px sans-serif"; g.fillText(dt+": max relative error vs elements", x0, 12);
    if(!pts.length){g.fillText("no nonzero errors", x0+20, y0+40); return;}
    const xs=pts.map(p=>log10(p[0])), ys=pts.map(p=>log10(p[1]));
    const xl=Math.floor(Math.min(...xs)), xh=Math.ceil(Math.max(...xs))||1, yl=Math.floor(Math.min(...ys)), yh=Math.ceil(Math.max(...ys));
    const X=v=>x0+(v-xl)/Math.max(xh-xl,1)*W, Y=v=>y0+H-(v-yl)/Math.max(yh-yl,1)*H;
    g.strokeStyle="#999"; g.strokeRect(x0,y0,W,H);
    const step=Math.max(1, Math.ceil((yh-yl)/8));
    for(let e=yl;e<=yh;e+=step) g.fillText("1e"+e,8,Y(e)+4);
    for(let e=xl;e<=xh;e++) g.fillText("1e"+e,X(e)-10,y0+H+14);
    g.fillStyle=colors[dt]||"#888";
    pts.forEach((p,i)=>{g.beginPath(); g.arc(X(xs[i]),Y(ys[i]),2.5,0,7); g.fill();});
  });
})();
</script></body></html>
"""
