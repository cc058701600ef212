"""Coverage by intent (issue 24 ask 6, issue 27): every row-wide test of every profile
runs its check once at each length class its rows can reach (2^k - 1, 2^k, 2^k + 1, past
4096, past 65536 where the profile draws rows that long), deterministically, before
Hypothesis draws at random; a kernel wrong only at one of them fails with few examples.
"""
import dataclasses
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from tritoncheck import harness, registry, selfcheck
from tritoncheck.config import CONFIG
from tritoncheck.limits import NotApplicable
from tritoncheck.registry import Implementation
from tritoncheck.strategies import LENGTH_CLASSES, length_classes

ROOT = Path(__file__).resolve().parents[1]
EVERYDAY = LENGTH_CLASSES[:3]
# The row-wide ops and the classes each reaches per profile size. On the interpreter a row
# costs what its column blocks cost: softmax and cross-entropy afford one past 65536 (a
# 1 x 65537 call and its gradient in about 1 and 3.5 s), the norms one past 4096 (their
# long_max, 4099), the dropout norm none (its Philox mask is the dearest: no long branch).
REACHED = {
    "small": {"softmax": LENGTH_CLASSES, "cross_entropy": LENGTH_CLASSES,
              "layer_norm": EVERYDAY + ("past 4096",), "rms_norm": EVERYDAY + ("past 4096",),
              "add_rms_norm": EVERYDAY + ("past 4096",), "dropout_residual_layer_norm": EVERYDAY,
              "linear_cross_entropy": EVERYDAY,  # its vocabulary, V
              "swiglu": EVERYDAY},  # a defined op (tritoncheck.op): its last dim's lengths by the generic strategy

    "large": {**{op: LENGTH_CLASSES for op in ("softmax", "cross_entropy", "layer_norm", "rms_norm", "add_rms_norm",
                                               "dropout_residual_layer_norm")},
              # V up to 8192, then 2^17 + 3 in the long draws: 2^12 + 1 is also the class past 4096
              "linear_cross_entropy": EVERYDAY + ("past 65536",),
              # swiglu: a pointwise op's rows are as long as the element budget lets them (past 4096, not 65536)
              "swiglu": EVERYDAY + ("past 4096",)},
}


def test_length_classes_are_generic_powers_of_two_and_the_long_thresholds():
    assert length_classes(1, 2100, long_max=2**17 + 3, long_percent=5) == {
        "2^k - 1": 2047, "2^k": 2048, "2^k + 1": 2049, "past 4096": 4097, "past 65536": 65537}
    assert length_classes(1, 1024, long_max=0, long_percent=3) == {"2^k - 1": 511, "2^k": 512, "2^k + 1": 513}
    # 2^16 + 1 stands for both "2^k + 1" and "past 65536": run once
    assert list(length_classes(1, 2**17 + 3, long_max=2**17 + 3, long_percent=33).values()) == [
        131071, 131072, 131073, 4097, 65537]
    assert length_classes(3000, 3500, long_max=4099, long_percent=3) == {"past 4096": 4097}  # 2^11 + 1 < 3000


def _recorder(drawn: list):
    def run(case, impl):
        drawn.append(case)
    return run


def _applicable(target) -> bool:
    try:
        target.strategy()
    except NotApplicable:
        return False
    return True


def _row_lengths(op, case) -> set[int]:
    return {case.tensors[t].shape[a] for t, a in op.dims.values() if t in case.tensors}


@pytest.mark.parametrize("size", ["small", "large"])
def test_every_row_wide_test_draws_every_length_class(size, monkeypatch):
    """The drawn sizes, recorded: each test of a row-wide op runs one case per class its
    profile reaches, whose row has that length; the other ops have no row length class."""
    monkeypatch.setattr(CONFIG, "size", size)
    monkeypatch.setattr(CONFIG, "configured", True)
    monkeypatch.setattr(harness, "_collector", None)
    row_wide, ran = set(), 0
    for target in harness.targets():
        if target.dtype != torch.float16 or target.skip_reason():
            continue
        if size == "large" and target.check.name != "matches_reference":
            continue  # every check's strategy: the small run above; the sizes of the large one here
        drawn: list = []
        recording = dataclasses.replace(target, check=dataclasses.replace(target.check, run=_recorder(drawn)))
        done = harness.run_length_classes(recording)
        if not done:
            if not _applicable(target):
                continue  # skipped up front (unbiased_rounding in an op without a narrowing output)
            assert target.op.name not in REACHED[size], f"{target.id} tries no length class"
            continue
        row_wide.add(target.op.name)
        assert [name for name, _, _ in done] == list(REACHED[size][target.op.name]), target.id
        assert all(outcome == "ran" for _, _, outcome in done), (target.id, done)
        assert len(drawn) == len(done)
        for (name, n, _), case in zip(done, drawn):
            assert n in _row_lengths(target.op, case), f"{target.id}: class {name} ({n}) drew {case.describe()}"
        ran += len(done)
    assert row_wide == set(REACHED[size]), row_wide
    assert ran >= 3 * len(REACHED[size])  # every row-wide op ran its classes


def _suite(tmp_path: Path, *impls: str) -> tuple[dict[str, str], str]:
    xml = tmp_path / "out.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/test_checks.py", "-q", "-p", "no:randomly", "-p", "no:xdist",
           "--hypothesis-profile", "ci", "--op", "softmax", "--dtype", "float32", "-k", "matches_reference",
           "--max-examples", "2", "--report-dir", str(tmp_path / "reports"), f"--junitxml={xml}"]
    for impl in impls:
        cmd += ["--impl", f"softmax=tests.size_cheats:{impl}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        failure = case.find("failure")
        outcomes[case.get("name").partition("[")[2].split("-")[1]] = failure.get("message", "") + (failure.text or "") \
            if failure is not None else "passed"
    return outcomes, proc.stdout


def test_kernels_wrong_only_at_a_length_class_fail_with_two_examples_under_ci(tmp_path):
    outcomes, out = _suite(tmp_path, "softmax", "softmax_wrong_past_4096", "softmax_wrong_one_past_a_power_of_two")
    assert outcomes["softmax"] == "passed", out
    past_4096 = outcomes["softmax_wrong_past_4096"]
    assert past_4096 != "passed" and "4097]" in past_4096, past_4096  # the case names its shape [..., 4097]
    tail = outcomes["softmax_wrong_one_past_a_power_of_two"]
    assert tail != "passed" and "2049]" in tail, tail
    report = json.loads((tmp_path / "reports" / "report.json").read_text())
    assert report["outputs"], "no comparison recorded"


@pytest.mark.parametrize("cheat,length", [("softmax_wrong_past_4096", "4097"),
                                          ("softmax_wrong_one_past_a_power_of_two", "2049")])
def test_a_self_test_hunt_tries_the_length_classes_its_random_draws_missed(cheat, length, monkeypatch):
    """The self-test's hunts (tritoncheck/selfcheck.py) kill a size-keyed planted bug
    deterministically: one random example misses it, the length classes after it do not."""
    from tests import size_cheats

    monkeypatch.setattr(CONFIG, "size", "small")
    op = registry.load()["softmax"]
    impl = Implementation.of("softmax", getattr(size_cheats, cheat), kind="mutant", target=f"tests.size_cheats:{cheat}")
    check = next(c for c in op.checks if c.name == "matches_reference")
    verdict = selfcheck.hunt(op, impl, check, torch.float32, examples=1)
    assert verdict.killed, verdict.text
    assert f"{length}]" in verdict.text, verdict.text
