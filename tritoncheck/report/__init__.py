"""The report of a run: ``report.json``, ``report.md`` and ``report.html`` under
``--report-dir``, and what the terminal prints at the end (schema: docs/report-schema.md).

- ``collect``: what each pytest process records (rows, per-test counts) into ``parts/``;
- ``assemble``: the run's report from those parts (and ``shards``: from several runs' reports);
- ``summary``: one line per op x implementation x dtype, and the figures the tables show;
- ``failures``: each failed check's record: its message, the case in words, its replay;
- ``markdown``, ``html_page``, ``files``: the pages, and writing the three files;
- ``diff``: two reports compared (``tritoncheck report diff``).

The run's side (the plugin, the harness, tests that build a report) uses the names below.
"""
from tritoncheck.report.assemble import SCHEMA_VERSION, build
from tritoncheck.report.collect import Collector

__all__ = ["SCHEMA_VERSION", "Collector", "build"]
