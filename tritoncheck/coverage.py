"""What a run's examples actually reached, per test: the largest inputs, and the layouts,
dtypes and value families drawn. A green run that never went past a few hundred rows, or
never drew a transposed input, shows as such in the report (docs/report-schema.md,
``coverage_per_test``; the summary's "not exercised" column).

Only examples that ran their check to the end are recorded: a refused or discarded
example exercised nothing.
"""
from __future__ import annotations

from tritoncheck.strategies import FAMILIES, Case, TensorSpec

# How an input sat in memory (tritoncheck/strategies.py Layout): its logical dims in
# another order, gaps between elements, a storage offset; one input may be several.
LAYOUTS = ("contiguous", "permuted", "strided", "offset")


def layouts_of(spec: TensorSpec) -> list[str]:
    layout = spec.layout
    if layout is None or layout.contiguous:
        return ["contiguous"]
    kinds = []
    if layout.order != tuple(range(len(layout.order))):
        kinds.append("permuted")
    if layout.step > 1:
        kinds.append("strided")
    if layout.offset:
        kinds.append("offset")
    return kinds


def _is_float(spec: TensorSpec) -> bool:
    return spec.family != "indices" and spec.torch_dtype.is_floating_point


def record(tally: dict, case: Case) -> None:
    """Add ``case`` to one test's ``tally`` (a JSON-ready dict, updated in place)."""
    tally["examples"] = tally.get("examples", 0) + 1
    tensors = tally.setdefault("tensors", {})
    for name, spec in case.tensors.items():
        numel = 1
        for d in spec.shape:
            numel *= d
        row = spec.shape[-1] if spec.shape else 1
        t = tensors.setdefault(name, {"max_numel": -1, "largest": [], "max_rows": 0, "max_row_length": 0})
        if numel > t["max_numel"]:
            t["max_numel"], t["largest"] = numel, list(spec.shape)
        t["max_rows"] = max(t["max_rows"], numel // row if row else 0)
        t["max_row_length"] = max(t["max_row_length"], row)
        for key, values in (("layouts", layouts_of(spec)), ("dtypes", [spec.dtype]),
                            ("families", [spec.family] if _is_float(spec) else [])):
            seen = tally.setdefault(key, [])
            seen.extend(v for v in values if v not in seen)
            seen.sort()


def merge(tallies: list[dict]) -> dict:
    """One tally over several tests' (an op x dtype x implementation's checks)."""
    out: dict = {"examples": 0, "tensors": {}, "layouts": [], "dtypes": [], "families": []}
    for tally in tallies:
        out["examples"] += tally.get("examples", 0)
        for key in ("layouts", "dtypes", "families"):
            out[key] = sorted(set(out[key]) | set(tally.get(key, [])))
        for name, t in tally.get("tensors", {}).items():
            o = out["tensors"].setdefault(name, {"max_numel": -1, "largest": [], "max_rows": 0, "max_row_length": 0})
            if t["max_numel"] > o["max_numel"]:
                o["max_numel"], o["largest"] = t["max_numel"], t["largest"]
            o["max_rows"] = max(o["max_rows"], t["max_rows"])
            o["max_row_length"] = max(o["max_row_length"], t["max_row_length"])
    return out


def largest_line(tally: dict) -> str:
    """The largest input drawn, in words: its name, shape and rows (elements / last dim)."""
    tensors = tally.get("tensors", {})
    if not tensors:
        return "no example counted"
    name, t = max(tensors.items(), key=lambda kv: (kv[1]["max_numel"], kv[0]))
    shape = "x".join(str(d) for d in t["largest"]) or "scalar"
    return f"largest {name} {shape}, at most {t['max_rows']} rows of <= {t['max_row_length']}"


def not_exercised(tally: dict) -> str:
    """What the examples never drew: value families and layouts, beside the largest input."""
    if not tally.get("examples"):
        return "nothing: no example counted"
    missing_families = [f for f in FAMILIES if f not in tally.get("families", [])]
    missing_layouts = [k for k in LAYOUTS if k not in tally.get("layouts", [])]
    parts = [largest_line(tally)]
    if missing_families:
        parts.append("no " + "/".join(missing_families) + " values")
    if missing_layouts:
        parts.append("no " + "/".join(missing_layouts) + " layout")
    return "; ".join(parts)
