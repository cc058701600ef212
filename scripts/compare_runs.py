"""Run the suite several times and say whether the verdicts and the report agree (no flakes).

    python scripts/compare_runs.py [--runs 3] [-- pytest arguments]

Each run is ``python -m pytest tests/test_checks.py -n 2`` (plus the arguments given
after ``--``) with its own report directory and JUnit file. The ``ci`` profile is
derandomized, so every run must give every test the same verdict and write the same
report.json once what measures time (and the report's creation stamp and paths) is
left out. Prints one line per run and exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING_KEY = re.compile(r"(^created$|seconds|_s$|time|duration|elapsed|path|dir$)")


def verdicts(junit: Path) -> dict[str, str]:
    out = {}
    for case in ET.parse(junit).iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        out[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return out


def canonical(value):
    """The report without what differs between identical runs: timings, stamps, paths,
    and the order in which xdist workers happened to finish."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in sorted(value.items()) if not TIMING_KEY.search(k)}
    if isinstance(value, list):
        return sorted((canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            folder = Path(tmp) / f"run{i}"
            cmd = [sys.executable, "-m", "pytest", "tests/test_checks.py", "-n", "2", "-q", "-p", "no:randomly",
                   "--report-dir", str(folder), f"--junitxml={folder}.xml", *args.pytest_args]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            v = verdicts(Path(f"{folder}.xml"))
            report = canonical(json.loads((folder / "report.json").read_text()))
            results.append((done.returncode, v, report))
            counts = {o: list(v.values()).count(o) for o in ("passed", "failure", "error", "skipped")}
            same_v = v == results[0][1]
            same_r = report == results[0][2]
            print(f"run {i + 1}: exit {done.returncode}, {counts['passed']} passed, {counts['failure']} failed, "
                  f"{counts['error']} errors, {counts['skipped']} skipped; verdicts "
                  f"{'identical to run 1' if same_v else 'DIFFER from run 1'}; report.json "
                  f"{'identical to run 1' if same_r else 'DIFFERS from run 1'} (timings aside, sha256 "
                  f"{hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()[:16]}, "
                  f"{len(json.dumps(report))} bytes)", flush=True)
            if not same_v:
                for test in sorted(set(v) | set(results[0][1])):
                    if v.get(test) != results[0][1].get(test):
                        print(f"  {test}: {results[0][1].get(test)} -> {v.get(test)}")
    return 0 if all(r[1] == results[0][1] and r[2] == results[0][2] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
