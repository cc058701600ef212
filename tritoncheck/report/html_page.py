"""report.html: one self-contained page (no network): the summary, headroom against problem
size per dtype, the per-output table with its notes, and the run's other sections.

The plots draw every recorded example: its problem size (elements of the output) on a
log axis, its headroom (largest error / allowance; above 1 fails) on a log axis, one
panel per dtype and one colour per op, so a reader sees where error grows with size.
An example with no error at all sits on the panel's floor line, marked "0".
"""
from __future__ import annotations

import html
import json
import math

from tritoncheck.coverage import largest_line
from tritoncheck.report import markdown as rp
from tritoncheck.report.assemble import ROUNDING_NOTE
from tritoncheck.report.summary import COLUMNS, run_line, summary_cells


def _table(head, rows) -> str:
    esc = html.escape
    return ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")


def _failures(records: list[dict]) -> list[str]:
    """Every failed check: its message, where it was raised, the case in words, the replay."""
    if not records:
        return []
    esc = html.escape
    items = []
    for f in records:
        impl = esc(f["impl"]) + (f" (<code>{esc(f['impl_target'])}</code>)" if f.get("impl_target") else "")
        items.append(f"<li><code>{esc(f['test'])}</code>: {esc(f['check'])} of {impl} in {esc(f['dtype'])}, "
                     f"{esc(f['kind'])}<pre>{esc(f['message'])}</pre>"
                     + (f"<p>raised at <code>{esc(f['raised_at'])}</code></p>" if f.get("raised_at") else "")
                     + (f"<p>case:</p><pre>{esc(f['case'])}</pre>" if f.get("case") else "")
                     + (f"<p>replay: <code>{esc(f['replay'])}</code></p>" if f.get("replay") else "") + "</li>")
    return [f"<h2>Failures ({len(records)})</h2><p>Each replay command runs from the directory the run ran in; "
            "its files are in <code>failures/</code> beside this page.</p><ul>" + "".join(items) + "</ul>"]


def plot_data(report: dict) -> list[dict]:
    """Per output: its label, dtype and per-example (elements, headroom) points."""
    return [{"op": o["op"], "label": f"{o['op']}/{o['impl']}/{o['output']}", "dtype": o["dtype"],
             "points": [[p[0], p[2] if math.isfinite(p[2]) else 1e9] for p in o["points"]]}
            for o in report["outputs"]]


def page(report: dict) -> str:
    esc = html.escape
    m = report["meta"]
    summary = report.get("summary") or []
    title = f"Tolerance report: {m.get('backend')}, {m.get('device')}"
    sections = [
        f"<h1>{esc(title)}</h1>",
        f"<p>{esc(run_line(report))}</p>",
        "<h2>Summary (one line per op x implementation x dtype)</h2>",
        _table(COLUMNS, [summary_cells(e) for e in summary]) if summary else "<p>No check ran.</p>",
        "<p><small>pass/fail/skip: the checks' verdicts; worst headroom: largest error / allowance over the "
        "recorded examples (above 1 fails); typical ulp: median over examples of the largest error in ulps of the "
        "output dtype at the output's scale; vs torch: the kernel's error / plain PyTorch's where PyTorch's is "
        "nonzero; vacuous: counted elements whose allowance reached |expected|. docs/report-schema.md.</small></p>",
    ]
    sections += _failures(report.get("failures") or [])
    crashes = report.get("crashes") or {}
    if crashes:
        sections.append("<h2>Crashed workers</h2><ul>" + "".join(
            f"<li><code>{esc(test)}</code><pre>{esc(text.strip())}</pre></li>" for test, text in crashes.items())
            + "</ul>")
    refusals = rp.refusal_lines(report)
    if refusals:
        sections.append("<h2>Refusals per op and dtype</h2><ul>" + "".join(f"<li>{esc(x)}</li>" for x in refusals)
                        + "</ul>")
    sections += [
        "<h2>Headroom against problem size, per dtype</h2>",
        "<p>Each dot is one example of one output: its elements (x) and its largest error / allowance (y; the "
        "black line at 1 is the allowance, above it fails). Dots on the floor had no error at all; dots on the "
        "1e-8 line, less than that.</p>",
        '<div id="scatter"></div><p class="legend" id="legend"></p>',
        "<h2>All outputs</h2>", _table(rp.OUTPUT_COLUMNS, rp.output_cells(report)),
        "".join(f"<p><small>{esc(n)}</small></p>" for n in rp.notes(report)),
        "<h2>What each check's examples reached</h2>",
        _table(("check", "counted examples", "largest input", "layouts", "dtypes", "value families"),
               [(test, str(t.get("examples", 0)), largest_line(t), ", ".join(t.get("layouts", [])),
                 ", ".join(t.get("dtypes", [])), ", ".join(t.get("families", [])))
                for test, t in (report.get("coverage_per_test") or {}).items()]),
        f"<h2>Vacuous elements</h2><p>{esc(rp.vacuity_line(report))}</p>",
        "<h2>Examples run (Hypothesis)</h2><div>" + esc(rp.examples_line(report)).replace("`", "")
        + (f"<pre>{esc(rp.discard_table(report))}</pre>" if rp.discard_rows(report) else "")
        + "".join(f"<p>limits of <code>{esc(k)}</code>: {esc(v)}</p>" for k, v in sorted(report.get("limits", {}).items()))
        + f"<p>False alarms: {esc(rp.statistical_line(report) or 'no statistical check ran')}; "
        f"{esc((report.get('statistical') or {}).get('rounding', ROUNDING_NOTE))}.</p></div>",
        "<h2>Compile and autotune time (first example vs the median of the others)</h2>",
        _table(("test", "examples", "first (s)", "median of the others (s)", "total (s)"),
               [(t, str(v["examples"]), f"{v['first_s']:.2f}", rp.fmt(v["median_rest_s"], ".3f"), f"{v['total_s']:.1f}")
                for t, v in rp.slowest_first_examples(report)]),
        "<h2>Skipped and expected failures</h2><ul>" + "".join(
            f"<li><code>{esc(s['test'])}</code> {esc(s['outcome'])}: {esc(s['reason'])}</li>" for s in report["skipped"])
        + "</ul>",
    ]
    return (_HEAD.replace("{{TITLE}}", esc(title))
            + "\n".join(sections) + _SCRIPT.replace("{{DATA}}", json.dumps(plot_data(report))) + "</body></html>\n")


_HEAD = """<!doctype html><html><head><meta charset="utf-8"><title>{{TITLE}}</title>
<style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
canvas{border:1px solid #ddd;margin:8px 16px 8px 0}.legend span{margin-right:14px;white-space:nowrap}</style>
</head><body>
"""

_SCRIPT = """<script>
const data = {{DATA}};
const palette = ["#1f77b4","#d62728","#2ca02c","#9467bd","#ff7f0e","#8c564b","#e377c2","#17becf","#7f7f7f",
                 "#bcbd22","#393b79","#637939","#843c39","#7b4173","#3182bd","#e6550d"];
const ops = [...new Set(data.map(d => d.op))].sort();
const colour = op => palette[ops.indexOf(op) % palette.length];
const log10 = v => Math.log(v) / Math.LN10;
document.getElementById("legend").innerHTML =
  ops.map(op => `<span style="color:${colour(op)}">&#9679; ${op}</span>`).join("");
(function scatter() {
  const host = document.getElementById("scatter");
  const dtypes = [...new Set(data.map(d => d.dtype))].sort();
  dtypes.forEach(dt => {
    const c = document.createElement("canvas"); c.width = 460; c.height = 320; host.appendChild(c);
    const g = c.getContext("2d"), pts = [];
    data.filter(d => d.dtype === dt).forEach(d => d.points.forEach(p => pts.push([p[0], p[1], d.op])));
    const x0 = 56, y0 = 24, W = 380, H = 240;
    g.font = "12px sans-serif"; g.fillStyle = "#222"; g.fillText(dt + ": headroom against elements", x0, 14);
    if (!pts.length) { g.fillText("no recorded example", x0 + 20, y0 + 40); return; }
    const xs = pts.map(p => log10(Math.max(p[0], 1)));
    const nz = pts.filter(p => p[1] > 0).map(p => log10(p[1]));
    const xl = Math.floor(Math.min(...xs)), xh = Math.max(Math.ceil(Math.max(...xs)), xl + 1);
    // below 1e-8 of its allowance an error is far from mattering: drawn on the 1e-8 line
    const yl = Math.max(-8, nz.length ? Math.min(Math.floor(Math.min(...nz)), -1) : -3);
    const yh = Math.max(1, nz.length ? Math.ceil(Math.max(...nz)) : 1);
    const floor = yl - 0.5;  // where examples with no error sit
    const X = v => x0 + (v - xl) / (xh - xl) * W, Y = v => y0 + H - (v - floor) / (yh - floor) * H;
    g.strokeStyle = "#999"; g.strokeRect(x0, y0, W, H); g.fillStyle = "#444"; g.font = "10px sans-serif";
    const step = Math.max(1, Math.ceil((yh - yl) / 8));
    for (let e = yl; e <= yh; e += step) { g.fillText((e === -8 ? "<=" : "") + "1e" + e, 4, Y(e) + 4); }
    g.fillText("0", 8, Y(floor) + 4);
    for (let e = xl; e <= xh; e++) { g.fillText("1e" + e, X(e) - 10, y0 + H + 14); }
    g.fillText("elements of the output", x0 + W / 2 - 50, y0 + H + 28);
    g.strokeStyle = "#000"; g.beginPath(); g.moveTo(x0, Y(0)); g.lineTo(x0 + W, Y(0)); g.stroke();
    g.fillText("allowance", x0 + W - 50, Y(0) - 3);
    pts.forEach((p, i) => {
      g.fillStyle = colour(p[2]); g.beginPath();
      g.arc(X(xs[i]), Y(p[1] > 0 ? Math.max(log10(p[1]), yl) : floor), 2.5, 0, 7); g.fill();
    });
  });
})();
</script>
"""
