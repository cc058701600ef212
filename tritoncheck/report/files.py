"""The report's three files: ``report.json`` (the data, ``docs/report-schema.md``),
``report.md`` (``markdown``) and ``report.html`` (``html_page``)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from tritoncheck.report import html_page, markdown


def _finite_or_null(output: dict) -> dict:
    """An output's figures with a non-finite one (the raw elementwise ``max_rel`` of an
    expected value of 0, a ratio to PyTorch's exact 0) as null: ``Infinity`` is not JSON,
    and the tables read the defined figures beside them (docs/report-schema.md)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in output.items()}


def write(folder: Path, data: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    # one recorded row a line: a gpu run records thousands, which indent would spread over 30 lines each
    head = json.dumps({k: ([_finite_or_null(o) for o in v] if k == "outputs" else v)
                       for k, v in data.items() if k != "rows"}, indent=1)
    rows = ",\n".join(json.dumps(r) for r in data.get("rows", []))
    (folder / "report.json").write_text(f'{head[:-2]},\n "rows": [\n{rows}\n ]\n}}\n')
    (folder / "report.md").write_text(markdown.markdown(data))
    (folder / "report.html").write_text(html_page.page(data))
