"""Two reports compared: ``tritoncheck report diff A.json B.json``.

A is the base (the main branch, or a library's kernel), B the candidate. Listed, as
Markdown a pull request comment or a CI step summary can take as it is:

* checks whose verdict changed (passed -> failed first), and checks in one report only;
* outputs whose headroom grew: B's worst error / allowance is more than ``factor`` times
  A's and at least ``floor`` (below it an output is far from its budget either way, and
  a change is rounding noise), or crossed 1;
* refusals new in B: messages a test of B refused with that the same test of A did not.

Exit status: 1 when any check got worse (a pass or skip that now fails), any headroom
grew as above or B has new refusals; 0 otherwise; 2 when a file cannot be read as a
report. So ``tritoncheck report diff base.json reports/report.json >> "$GITHUB_STEP_SUMMARY"``
is a CI step that fails on a regression and says which.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

GROWTH_FACTOR = 1.25  # B's headroom past this many times A's is reported
HEADROOM_FLOOR = 0.01  # ... when B's is at least this (1% of the allowance)
WORSE = {("passed", "failed"), ("passed", "error"), ("skipped", "failed"), ("xfailed", "failed"),
         ("passed", "xpassed"), ("skipped", "error"), ("xfailed", "error")}


def _key(o: dict) -> tuple:
    return (o["op"], o["impl"], o["dtype"], o["backend"], o["output"])


def _h(v: float) -> float:
    return v if math.isfinite(v) else math.inf


def _impls(report: dict) -> dict[str, set[str]]:
    from tritoncheck.report.summary import parse_test
    out: dict[str, set[str]] = {}
    for o in report["outputs"]:
        out.setdefault(o["op"], set()).add(o["impl"])
    for test in report.get("verdicts") or {}:
        parsed = parse_test(test)
        if parsed:
            out.setdefault(parsed[0], set()).add(parsed[1])
    return out


def paired_impls(a: dict, b: dict) -> dict[tuple[str, str], str]:
    """(op, B's impl) -> A's impl, for each op that each report ran with one implementation
    under different names (the project's kernel against a library's): compared as one."""
    ia, ib = _impls(a), _impls(b)
    return {(op, next(iter(ib[op]))): next(iter(ia[op])) for op in set(ia) & set(ib)
            if len(ia[op]) == len(ib[op]) == 1 and ia[op] != ib[op]}


def _as_a(b: dict, pairs: dict[tuple[str, str], str]) -> dict:
    """B with its implementations named as A's (:func:`paired_impls`)."""
    from tritoncheck.report.summary import parse_test
    if not pairs:
        return b

    def test_name(test: str) -> str:
        parsed = parse_test(test)
        if parsed is None or (parsed[0], parsed[1]) not in pairs:
            return test
        op, impl, dtype, check = parsed
        return f"{op}-{pairs[(op, impl)]}-{dtype}-{check}"

    outputs = [dict(o, impl=pairs.get((o["op"], o["impl"]), o["impl"])) for o in b["outputs"]]
    return dict(b, outputs=outputs,
                verdicts={test_name(t): v for t, v in (b.get("verdicts") or {}).items()},
                refusals_per_test={test_name(t): v for t, v in (b.get("refusals_per_test") or {}).items()})


def diff(a: dict, b: dict, factor: float = GROWTH_FACTOR, floor: float = HEADROOM_FLOOR) -> dict:
    pairs = paired_impls(a, b)
    b = _as_a(b, pairs)
    va, vb = a.get("verdicts") or {}, b.get("verdicts") or {}
    changed = [{"test": t, "a": va[t], "b": vb[t], "worse": (va[t], vb[t]) in WORSE}
               for t in sorted(set(va) & set(vb)) if va[t] != vb[t]]
    changed.sort(key=lambda c: (not c["worse"], c["test"]))
    oa, ob = {_key(o): o for o in a["outputs"]}, {_key(o): o for o in b["outputs"]}
    grew = []
    for key in sorted(set(oa) & set(ob)):
        ha, hb = _h(oa[key]["max_headroom"]), _h(ob[key]["max_headroom"])
        crossed = ha <= 1 < hb
        if crossed or (hb >= floor and hb > factor * ha):
            grew.append({"output": "/".join(key[:3] + key[4:]), "a": ha, "b": hb,
                         "factor": hb / ha if ha > 0 else math.inf, "crossed": crossed,
                         "check": ob[key]["closest_case"]["check"]})
    ra, rb = a.get("refusals_per_test") or {}, b.get("refusals_per_test") or {}
    new_refusals = [{"test": t, "message": m, "count": n} for t in sorted(rb)
                    for m, n in sorted(rb[t].items()) if m not in ra.get(t, {})]
    return {"changed": changed, "grew": grew, "new_refusals": new_refusals,
            "only_a": sorted(set(va) - set(vb)), "only_b": sorted(set(vb) - set(va)),
            "paired": [f"{op}: {impl_a} (A) ~ {impl_b} (B)" for (op, impl_b), impl_a in sorted(pairs.items())],
            "regression": any(c["worse"] for c in changed) or bool(grew) or bool(new_refusals)}


def _num(v: float) -> str:
    return "non-finite" if not math.isfinite(v) else f"{v:.3g}"


def _growth(g: dict) -> str:
    if g["a"] == 0:
        return "from 0"
    return "-" if not math.isfinite(g["factor"]) else f"{g['factor']:.3g}x"


def _label(r: dict) -> str:
    m = r.get("meta", {})
    return (f"{m.get('backend')}, {m.get('device')}, profile {m.get('profile')}, {r.get('created')}"
            + (f", shard {m['shard']}" if m.get("shard") else ""))


def markdown(d: dict, a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> str:
    lines = ["## tritoncheck report diff", "",
             f"A: `{names[0]}` ({_label(a)})  ", f"B: `{names[1]}` ({_label(b)})", "",
             ("**Regression**: " if d["regression"] else "No regression: ")
             + f"{sum(c['worse'] for c in d['changed'])} check(s) worse, {len(d['grew'])} output(s) with more "
             f"headroom used (> {GROWTH_FACTOR}x and >= {HEADROOM_FLOOR}, or past 1), "
             f"{len(d['new_refusals'])} new refusal message(s)."
             + (" Compared as one implementation (named as in A below): " + "; ".join(d["paired"]) + "."
                if d["paired"] else ""), ""]
    lines += ["### Checks that changed verdict", ""]
    if d["changed"]:
        lines += ["| check | A | B |", "|---|---|---|"]
        lines += [f"| `{c['test']}` | {c['a']} | {'**' + c['b'] + '**' if c['worse'] else c['b']} |"
                  for c in d["changed"]]
    else:
        lines.append("None.")
    lines += ["", "### Outputs whose headroom grew", ""]
    if d["grew"]:
        lines += ["| op/impl/dtype/output | check at worst (B) | headroom A | headroom B | growth |",
                  "|---|---|---:|---:|---:|"]
        lines += [f"| {g['output']} | {g['check']} | {_num(g['a'])} | {_num(g['b'])}"
                  f"{' (fails)' if g['crossed'] else ''} | {_growth(g)} |" for g in d["grew"]]
    else:
        lines.append("None.")
    lines += ["", "### New refusals", ""]
    if d["new_refusals"]:
        lines += ["| check | message | examples |", "|---|---|---:|"]
        lines += [f"| `{r['test']}` | {r['message'].replace('|', '/')[:200]} | {r['count']} |"
                  for r in d["new_refusals"]]
    else:
        lines.append("None.")
    for side, tests in (("A", d["only_a"]), ("B", d["only_b"])):
        if tests:
            lines += ["", f"Checks only in {side} ({len(tests)}): " + ", ".join(f"`{t}`" for t in tests[:20])
                      + (" ..." if len(tests) > 20 else "")]
    return "\n".join(lines) + "\n"


def load(path: str) -> dict:
    """A report.json; a ValueError naming the file when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read a report ({exc})") from None
    if not isinstance(data, dict) or "outputs" not in data:
        raise ValueError(f"{path}: not a tritoncheck report.json (no outputs)")
    return data
