"""What each pytest process records for the report: one row per reference comparison
(example and output), and per test its examples, discards, refusals, durations and
coverage. Each process (each xdist worker) writes them to ``<report-dir>/parts/``, which
``tritoncheck.report.assemble`` merges.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np


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
        self.coverage: dict[str, dict] = {}  # test id -> what its counted examples drew (tritoncheck/coverage.py)

    def count(self, target, invalid: bool = False, refused: bool = False, seconds: float | None = None,
              case=None) -> None:
        self.examples[target.id] += 1
        self.invalid[target.id] += int(invalid)
        if seconds is not None:
            self.seconds[target.id].append(seconds)
        if case is not None and not invalid and not refused:
            from tritoncheck import coverage
            coverage.record(self.coverage.setdefault(target.id, {}), case)

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
            baseline = parity.baseline_max_abs if parity is not None else None
            at_scale = ulps_at_scale(c.max_abs, c.scale, c.dtype)
            torch_ulps = None if baseline is None else ulps_at_scale(baseline, c.scale, c.dtype)
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
                "uncheckable": c.uncheckable, "rule": c.rule,
                # the figures the tables show (docs/report-schema.md): finite wherever the output is
                "ulp_at_scale": at_scale, "rel_counted": c.max_rel_counted, "baseline_ulp_at_scale": torch_ulps,
                # PyTorch's error below TORCH_EXACT_ULP is no error at the output's scale: no ratio there
                "torch_exact": torch_ulps is not None and torch_ulps < TORCH_EXACT_ULP,
                "parity_ratio_finite": parity.ratio if torch_ulps is not None and torch_ulps >= TORCH_EXACT_ULP
                else None,
                "example": self.examples[target.id],  # its index in the test: rows sort by (test, example)
            })
        return record

    def dump(self, folder: Path, name: str, gpu: int | None = None) -> None:
        """Write this process's rows; ``gpu``: the CUDA device index its tests ran on
        (tritoncheck/devices.py: one GPU per xdist worker), None off CUDA."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps({"rows": self.rows, "examples": self.examples,
                                                           "invalid": self.invalid, "refused": self.refused,
                                                           "undeclared": self.undeclared,
                                                           "seconds": self.seconds, "gpu": gpu,
                                                           "coverage": self.coverage}))


# PyTorch's error below this many ulps of the output dtype at the output's scale counts as
# exact: it is below the resolution at which the output is read (its small elements have
# finer ulps, and an error of 1e-60 on an expected 1e-59 that fp32 flushes is no error at
# the output's scale of 1), and a ratio against it (1.5e58 seen) says nothing actionable.
TORCH_EXACT_ULP = 1e-2


def ulps_at_scale(max_abs: float, scale: float, dtype) -> float:
    """The largest error in ulps of the output dtype at the output's scale (its largest
    |expected|, per tensor): what a kernel loses against the output's own rounding, finite
    wherever the error is. Below the vacuity floors (tritoncheck/oracle.py FLOOR_MULTIPLE
    underflow floors) the scale is taken at that floor: an output that is all zeros or
    all underflow measures its error against the smallest scale that counts."""
    from tritoncheck import tolerance
    from tritoncheck.oracle import FLOOR_MULTIPLE
    if not dtype.is_floating_point:
        return 0.0
    at = max(scale, FLOOR_MULTIPLE * tolerance.underflow_floor(dtype))
    return max_abs / float(tolerance.ulp(np.array([at]), dtype)[0])


def clear_parts(folder: Path) -> None:
    parts = folder / "parts"
    if parts.is_dir():
        for p in parts.glob("*.json"):
            os.unlink(p)
