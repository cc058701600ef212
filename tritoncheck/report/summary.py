"""The report's summary and the figures its tables show.

One line per op x implementation x dtype, read in seconds: the checks' verdicts, the
worst headroom and where, the typical error in ulps of the output dtype at the output's
scale, PyTorch's error beside the kernel's, the vacuous share and what the examples
never reached. The terminal prints these lines; report.md opens with them, and
``python -m tritoncheck report summary`` writes them for a CI step summary.

Every figure shown is finite: errors are in ulps at the output's scale (per tensor,
``tritoncheck.report.collect.ulps_at_scale``), relative errors only over the elements where they
are defined (``Comparison.max_rel_counted``), PyTorch's ratio only where PyTorch's own
error is nonzero. What a figure alone would mislead on (an error far above the output's
rounding, an output that was never wrong because it was never exercised) gets a note
naming the case. docs/report-schema.md defines every column.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch

from tritoncheck import coverage

# An error past this many ulps of the output's scale in a passing output is explained by a
# note: the allowance there is set by the inputs' magnitudes (a result that cancels), and
# the figure alone reads as a broken kernel.
ULP_NOTE = 1e6
SKIPPED = ("skipped", "xfailed")
FAILED = ("failed", "error", "xpassed")


def parse_test(test: str) -> tuple[str, str, str, str] | None:
    """(op, impl, dtype, check) of a check's id ``op-impl-dtype-check``; None for others."""
    parts = test.split("-")
    # the dtype part: any torch dtype's name (scaled_mm runs in float8_e4m3fn, float8_e5m2, int8)
    if len(parts) < 4 or not isinstance(getattr(torch, parts[-2], None), torch.dtype):
        return None
    return parts[0], "-".join(parts[1:-2]), parts[-2], parts[-1]


def check_id(name: str) -> str:
    """A check's id from its pytest name (``test_check[op-impl-dtype-check]`` -> the bracket)."""
    return name.partition("[")[2].rstrip("]") or name


def _finite(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def output_figures(rows: list[dict]) -> dict:
    """The finite figures of one output (its recorded rows, one per example)."""
    ulps = _finite(r.get("ulp_at_scale") for r in rows)
    rel = _finite(r.get("rel_counted") for r in rows)
    ratios = _finite(r.get("parity_ratio_finite") for r in rows)
    return {
        "max_ulp_at_scale": max(ulps) if ulps else None,
        "p50_ulp_at_scale": float(np.median(ulps)) if ulps else None,
        "nonfinite_examples": sum(1 for r in rows if r.get("ulp_at_scale") is not None
                                  and not math.isfinite(r["ulp_at_scale"])),
        "max_rel_counted": max(rel) if rel else None,
        "rel_defined_examples": len(rel),
        "torch_exact_examples": sum(1 for r in rows if r.get("torch_exact")),
        "p50_parity_ratio": float(np.median(ratios)) if ratios else None,
        "max_parity_ratio_finite": max(ratios) if ratios else None,
        "zero_scale_examples": sum(1 for r in rows if r.get("scale", 1.0) == 0 and r.get("max_abs", 0) > 0),
    }


def _case_words(row: dict) -> str:
    shapes = ", ".join(f"{k} {'x'.join(map(str, v.get('shape', [])))}"
                       for k, v in sorted(row["case"].get("tensors", {}).items()))
    return f"{row['check']} on {coverage.regime(row['case'])} ({shapes})"


def notes_for(output: dict, rows: list[dict], tally: dict | None) -> list[tuple[str, str]]:
    """Why an output's figures read as they do, where the figure alone would mislead: per
    note, a few words for the output's row of the table, and the note naming the case."""
    from tritoncheck import tolerance
    from tritoncheck.strategies import dtype_from_name
    name = f"{output['op']}/{output['impl']}/{output['dtype']}/{output['output']}"
    notes = []
    if rows and all(r["max_abs"] == 0 for r in rows):
        seen = coverage.largest_line(tally) if tally else "coverage not recorded"
        notes.append(("0 error: exact, or not exercised",
                      f"{name}: 0 error in all {len(rows)} examples: exact there, or not exercised ({seen})"))
    big = [r for r in rows if r["passed"] and r.get("ulp_at_scale") is not None
           and math.isfinite(r["ulp_at_scale"]) and r["ulp_at_scale"] > ULP_NOTE]
    if big:
        top = max(big, key=lambda r: r["ulp_at_scale"])
        ulp = float(tolerance.ulp(np.array([max(top["scale"], 1e-300)]), dtype_from_name(output["dtype"]))[0])
        near_zero = top["scale"] <= top["allowed_at_worst"]
        tag = ("expected ~0 (within its allowance of 0): its ulps measure nothing" if near_zero else
               "ulps past 1e6 allowed: the inputs' magnitudes set the allowance (it cancels)")
        why = (f"the whole expected output ({top['scale']:.3g} at most) is smaller than its allowance "
               f"({top['allowed_at_worst']:.3g}): zero up to cancellation (a constant upstream gradient, equal "
               "scores), so its own ulp measures nothing" if near_zero else
               "the rule charges the inputs' magnitudes, far above the output's own (a result that cancels)")
        notes.append((f"{tag}, {len(big)} ex.",
                      f"{name}: {top['ulp_at_scale']:.3g} ulp of the output's scale {top['scale']:.3g} on "
                      f"{_case_words(top)}, within its allowance ({top['allowed_at_worst'] / ulp:.3g} ulp there, "
                      f"headroom {top['headroom']:.3g}): {why}; {len(big)} passing example(s) past {ULP_NOTE:.0e} "
                      "ulp"))
    zero = [r for r in rows if r.get("scale", 1.0) == 0 and r["max_abs"] > 0]
    if zero:
        notes.append((f"expected all 0 in {len(zero)} ex.: ulps at the floor",
                      f"{name}: {len(zero)} example(s) expected all zeros (e.g. {_case_words(zero[0])}): the "
                      "error there is in ulps at the smallest scale that counts (tritoncheck/oracle.py floors)"))
    return notes


def summary(report: dict) -> list[dict]:
    """One entry per (op, impl, dtype) that ran a check; also writes each output's notes
    into ``report['outputs']``."""
    rows_of: dict[tuple, list[dict]] = defaultdict(list)
    for r in report.get("rows", []):
        rows_of[(r["op"], r["impl"], r["dtype"], r["backend"], r["output"])].append(r)
    cov = report.get("coverage_per_test", {})
    for o in report["outputs"]:
        rows = rows_of.get((o["op"], o["impl"], o["dtype"], o["backend"], o["output"]), [])
        check = o["closest_case"]["check"]
        found = notes_for(o, rows, cov.get(f"{o['op']}-{o['impl']}-{o['dtype']}-{check}"))
        o["note_tags"], o["notes"] = [tag for tag, _ in found], [text for _, text in found]
    verdicts = report.get("verdicts") or {}
    skipped = {check_id(s["test"]) for s in report.get("skipped", [])}
    tests = set(verdicts) | set(report.get("examples_per_test", {})) | skipped
    groups: dict[tuple, dict] = {}
    for test in sorted(tests):
        parsed = parse_test(test)
        if parsed is None:
            continue
        op, impl, dtype, check = parsed
        g = groups.setdefault((op, impl, dtype), {"op": op, "impl": impl, "dtype": dtype, "passed": 0, "failed": 0,
                                                  "skipped": 0, "failed_checks": [], "tests": []})
        g["tests"].append(test)
        outcome = verdicts.get(test)
        if outcome in FAILED:
            g["failed"] += 1
            g["failed_checks"].append(check)
        elif outcome in SKIPPED or (outcome is None and test in skipped):
            g["skipped"] += 1
        elif outcome == "passed":
            g["passed"] += 1
    out = []
    for (op, impl, dtype), g in sorted(groups.items()):
        outputs = [o for o in report["outputs"] if (o["op"], o["impl"], o["dtype"]) == (op, impl, dtype)]
        rows = [r for o in outputs for r in rows_of.get((o["op"], o["impl"], o["dtype"], o["backend"], o["output"]), [])]
        worst = max(outputs, key=lambda o: o["max_headroom"] if math.isfinite(o["max_headroom"]) else 1e300,
                    default=None)
        ulps = _finite(r.get("ulp_at_scale") for r in rows)
        ratios = _finite(r.get("parity_ratio_finite") for r in rows)
        counted = sum(o["counted"] for o in outputs)
        out.append({
            "op": op, "impl": impl, "dtype": dtype,
            "passed": g["passed"], "failed": g["failed"], "skipped": g["skipped"],
            "failed_checks": g["failed_checks"],
            "worst_headroom": worst["max_headroom"] if worst else None,
            "worst_at": f"{worst['closest_case']['check']}/{worst['output']}" if worst else None,
            "typical_ulp": float(np.median(ulps)) if ulps else None,
            "max_parity_ratio": max(ratios) if ratios else None,
            "torch_exact_examples": sum(1 for r in rows if r.get("torch_exact")),
            "parity_examples": sum(1 for r in rows if r.get("baseline_max_abs") is not None),
            "vacuous_share": sum(o["vacuous"] for o in outputs) / counted if counted else None,
            "not_exercised": coverage.not_exercised(coverage.merge([cov[t] for t in g["tests"] if t in cov])),
            "notes": sum(len(o["notes"]) for o in outputs),
        })
    return out


def headroom_cell(h: float | None) -> str:
    if h is None:
        return "-"
    return "non-finite" if not math.isfinite(h) else f"{h:.3g}"


def ulp_cell(v: float | None) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "non-finite output"
    # below a thousandth of an ulp the error is the fp64 reference's own noise: the output is exact
    return "<0.001" if 0 < v < 1e-3 else f"{v:.3g}"


def torch_cell(entry: dict) -> str:
    """PyTorch's ratio where its error was nonzero; 'exact' where it never erred."""
    if entry.get("max_parity_ratio") is not None:
        return f"{entry['max_parity_ratio']:.3g}x"
    if entry.get("torch_exact_examples"):
        return "torch exact"
    return "-"


def verdict_cell(entry: dict, named: int | None = None) -> str:
    """passed/failed/skipped, and the failed checks (the first ``named`` of them, if given)."""
    checks = entry["failed_checks"]
    if named is not None and len(checks) > named:
        checks = [*checks[:named], f"+{len(checks) - named} more"] if named else []
    return f"{entry['passed']}/{entry['failed']}/{entry['skipped']}" + (f" failed: {', '.join(checks)}" if checks else "")


def _share(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


COLUMNS = ("op", "impl", "dtype", "pass/fail/skip", "worst headroom (check/output)", "typical ulp",
           "vs torch (max)", "vacuous", "not exercised")


def summary_cells(entry: dict, named: int | None = None) -> list[str]:
    worst = (f"{headroom_cell(entry['worst_headroom'])} ({entry['worst_at']})"
             if entry["worst_headroom"] is not None else "- (no reference check recorded)")
    return [entry["op"], entry["impl"], entry["dtype"], verdict_cell(entry, named), worst, ulp_cell(entry["typical_ulp"]),
            torch_cell(entry), _share(entry["vacuous_share"]), entry["not_exercised"]]


def summary_text(report: dict, named: int | None = None) -> str:
    """The summary as the terminal prints it: aligned columns, one line per op x impl x dtype
    (``named``: how many failed checks a line names)."""
    entries = report.get("summary") or []
    if not entries:
        return ""
    table = [list(COLUMNS)] + [summary_cells(e, named) for e in entries]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in table]
    lines.insert(1, "-" * min(160, len(lines[0])))
    return "\n".join(lines)


def run_line(report: dict) -> str:
    """What ran, in words: the backend and device, the profile and the settings that narrow
    it, the versions and when (the report's ``meta`` and ``created``)."""
    m = report.get("meta", {})
    parts = [f"{m.get('backend')} backend on {m.get('device')}", f"profile {m.get('profile')}"]
    if m.get("tolerance", "derived") != "derived":
        parts.append(f"tolerance {m['tolerance']}")
    if m.get("shapes"):
        parts.append(f"specialised dims from a pool of {m['shapes']} sizes"
                     + (f" in {m['shape_classes']} power-of-two class(es)" if m.get("shape_classes") else ""))
    if m.get("autotune_config") is not None:
        parts.append(f"declared autotuned kernels at config {m['autotune_config']}")
    if m.get("shard"):
        parts.append(f"shard {m['shard']}")
    if m.get("merged_from"):
        parts.append(f"merged from {', '.join(m['merged_from'])}")
    versions = ", ".join(f"{name} {m[name]}" for name in ("torch", "triton") if m.get(name))
    return ", ".join(parts) + (f"; {versions}" if versions else "") + (f"; {report['created']}" if report.get("created")
                                                                       else "")


def summary_markdown(report: dict, title: str = "## Summary") -> str:
    """The summary as a Markdown table (report.md's first section; GitHub's step summary)."""
    entries = report.get("summary") or []
    lines = [title, "", f"{run_line(report)}. Typical ulp: the median over examples of the largest error in ulps of "
             "the output dtype at the output's scale (per tensor). Columns: docs/report-schema.md.", ""]
    if not entries:
        return "\n".join(lines + ["No check ran."]) + "\n"
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in summary_cells(e)) + " |" for e in entries]
    notes = [n for o in report.get("outputs", []) for n in o.get("notes", [])]
    if notes:
        lines += ["", "Notes:", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"
