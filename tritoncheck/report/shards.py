"""A run split over machines: ``--shard K/N`` keeps a deterministic share of the tests, and
``tritoncheck report merge`` joins the shards' report.json files into one report.

A test belongs to shard ``1 + (h mod N)``, ``h`` the first 8 bytes of the SHA-256 of its
node id (``tests/test_checks.py::test_check[softmax-triton-float16-matches_reference]``):
the same on every machine, in every Python process (no hash seed) and whatever order
the tests are collected or run in, so the N shards of a CI matrix cover every test once.

The merged report is built by the same function as a run's (``tritoncheck.report.assemble``) from
the shards' raw records (their ``rows``, per-test counts, verdicts and coverage), so its
figures are those of the unsharded run on the same seed: each test ran in one shard, and
its examples are the same wherever it ran (the ``ci`` profile is derandomized; pass the
same ``--hypothesis-seed`` to every shard otherwise).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path


def parse(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), 1 <= K <= N; anything else is a ValueError saying what is expected."""
    k, sep, n = text.partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit():
        raise ValueError(f"--shard {text!r}: expected K/N, e.g. 2/3 (the second of three shards)")
    k_i, n_i = int(k), int(n)
    if not 1 <= k_i <= n_i:
        raise ValueError(f"--shard {text!r}: K must be between 1 and N")
    return k_i, n_i


def shard_of(node_id: str, count: int) -> int:
    """The shard (1..count) that runs the test ``node_id``."""
    digest = hashlib.sha256(node_id.encode()).digest()
    return 1 + int.from_bytes(digest[:8], "big") % count


def merge(reports: list[dict]) -> dict:
    """One report from the shards' reports (each with ``rows``: schema 4 or later).

    Refused: reports of different runs (backend, profile, tolerance or shard count
    differ), two reports of the same shard, and a test reported by two shards."""
    from tritoncheck.report import assemble
    if not reports:
        raise ValueError("report merge: no report given")
    for i, r in enumerate(reports):
        if "rows" not in r:
            raise ValueError(f"report merge: report {i + 1} has schema {r.get('schema_version')}, without rows; "
                             f"merge needs schema {assemble.SCHEMA_VERSION} (a run of this version)")
    same = ("backend", "profile", "tolerance", "device")
    first = reports[0]["meta"]
    for r in reports[1:]:
        diff = [k for k in same if r["meta"].get(k) != first.get(k)]
        if diff:
            raise ValueError(f"report merge: the reports come from different runs ({', '.join(diff)} differ)")
    shards = [r["meta"].get("shard") for r in reports]
    if any(shards) and len({s for s in shards if s}) != len(shards):
        raise ValueError(f"report merge: the same shard given twice, or a whole run among shards: {shards}")
    per_test: dict[str, dict] = {"examples": {}, "invalid": {}, "refused": {}, "undeclared": {}}
    keys = {"examples": "examples_per_test", "invalid": "invalid_per_test", "refused": "refusals_per_test",
            "undeclared": "undeclared_refusals_per_test"}
    rows, skipped, failures, limits, verdicts, coverage, timing, gpu, crashes = [], [], [], {}, {}, {}, {}, {}, {}
    for r in reports:
        twice = set(verdicts) & set(r.get("verdicts", {}))
        if twice:
            raise ValueError(f"report merge: {len(twice)} test(s) reported by two shards, e.g. {sorted(twice)[0]}")
        rows += r["rows"]
        skipped += r.get("skipped", [])
        failures += r.get("failures", [])
        for key, name in keys.items():
            per_test[key].update(r.get(name, {}))
        limits.update(r.get("limits", {}))
        verdicts.update(r.get("verdicts", {}))
        crashes.update(r.get("crashes", {}))
        coverage.update(r.get("coverage_per_test", {}))
        timing.update(r.get("timing_per_test", {}))
        gpu.update(r.get("gpu_per_test", {}))
    meta = {k: v for k, v in first.items() if k != "shard"}
    meta["merged_from"] = [s or "whole run" for s in shards]
    return assemble.assemble(rows, per_test, meta=meta, skipped=skipped, limits=limits, verdicts=verdicts,
                             coverage=coverage, timing=timing, gpu=gpu, crashes=crashes, failures=failures)


def merge_files(paths: list[Path], out: Path) -> dict:
    """Merge report.json files into ``out`` (a folder: report.json, .md and .html)."""
    from tritoncheck.report import files
    merged = merge([json.loads(Path(p).read_text()) for p in paths])
    files.write(out, merged)
    return merged
