"""The report's tables and sections as text: ``report.md``, and the terminal's per-output
table and lines (the same figures, aligned). ``docs/report-schema.md`` defines the columns.
"""
from __future__ import annotations

import math
from collections import defaultdict

from tritoncheck.report import failures
from tritoncheck.report.assemble import ROUNDING_NOTE
from tritoncheck.report.summary import headroom_cell, summary_markdown, ulp_cell


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


def fmt(v, spec=".2e"):
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
        for i, _ in enumerate(o.get("notes", [])):
            n += 1
            tags = o.get("note_tags") or []
            refs.append(f"[{n}] {tags[i]}" if i < len(tags) else f"[{n}]")
        cells.append([o["op"], o["impl"], o["dtype"], o["output"], str(o["examples"]), str(o["failed"]),
                      ulp_cell(o.get("max_ulp_at_scale")), ulp_cell(o.get("p50_ulp_at_scale")), _rel_cell(o),
                      headroom_cell(o["max_headroom"]), _torch_cell(o), _vacuous(o), o.get("rule", "-"),
                      "; ".join(refs)])
    return cells


OUTPUT_COLUMNS = ("op", "impl", "dtype", "output", "examples", "failed", "max ulp", "p50 ulp", "max rel",
                  "headroom", "vs torch p50/max", "vacuous", "rule", "note")


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
                 "PyTorch's is nonzero; rule: what judged it (derived: the op's hand-derived rule; derived from ref: "
                 "the running error bound through a defined op's reference; parity; hand-typed). docs/report-schema.md")
    return "\n".join(lines + notes(report))


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


def _vacuous(o: dict) -> str:
    """Vacuous elements, and (after the slash) examples in which most elements were."""
    return f"{o['vacuous']}/{o['vacuous_examples']}"


def vacuity_line(report: dict) -> str:
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


def examples_line(report: dict) -> str:
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


def slowest_first_examples(report: dict, count: int = 15) -> list[tuple[str, dict]]:
    t = report.get("timing_per_test", {})
    return sorted(t.items(), key=lambda kv: -(kv[1]["compile_s"] or 0.0))[:count]


def timing_line(report: dict) -> str | None:
    """The terminal's one line on compile and autotune time."""
    slow = [(t, v) for t, v in slowest_first_examples(report, 3) if v["compile_s"]]
    if not slow:
        return None
    return "slowest first examples (compile + autotune): " + ", ".join(
        f"{t} {v['first_s']:.1f} s (others {v['median_rest_s']:.2f} s)" for t, v in slow)


def markdown(report: dict) -> str:
    m = report["meta"]
    lines = ["# Tolerance report", "", summary_markdown(report), *failures.markdown(report), *crash_section(report),
             "## Outputs", "",
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
             "| " + " | ".join(OUTPUT_COLUMNS) + " |", "|---|---|---|---|" + "---:|" * 8 + "---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in output_cells(report)]
    if notes(report):
        lines += ["", *(f"- {n}" for n in notes(report))]
    lines += coverage_section(report)
    lines += ["", "## Vacuous elements", "", vacuity_line(report)]
    lines += ["", "## Examples run (Hypothesis)", "", examples_line(report)]
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
    slow = slowest_first_examples(report)
    if slow:
        lines += ["", "## Compile and autotune time (first example vs the median of the others)", "",
                  "| test | examples | first (s) | median of the others (s) | total (s) |", "|---|---:|---:|---:|---:|"]
        lines += [f"| `{t}` | {v['examples']} | {v['first_s']:.2f} | {fmt(v['median_rest_s'], '.3f')} | "
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
