"""The quick profile and the one-verdict rule for implementations that cannot run (issue 25, ask 4).

A run of the user's functions (``--impl``) defaults to the ``quick`` profile (few examples,
a small pool of shapes, no shrinking); an implementation that raises on every input ends
each test after ten inputs with one verdict (``tritoncheck/unrunnable.py``; a partial
domain: tests/test_refusals.py), and under the Triton interpreter an ``InterpreterError``
is a skip that says to run on a GPU. A correct control still passes and a planted bug
still fails at that profile; a wrong value is never taken for a constant error.

The end-to-end tests run the suite in a child pytest on softmax in float32 (the
fixtures are in ``tests/unrunnable_kernels.py``), as tests/test_refusals.py does, on the
backend of this run.
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tritoncheck import backend, cli, registry, unrunnable

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = "tests.unrunnable_kernels"
GRADIENT_CHECKS = ("gradients_match_reference", "backward_repeatable", "deterministic")


def softmax_checks() -> int:
    return len(registry.load()["softmax"].checks)


def applicable(outcomes: dict) -> dict:
    """``outcomes`` less the checks skipped up front as not applicable to the op and dtype (in
    float32 no output narrows, for unbiased_rounding; no autotuned kernels declared, for
    autotune_configs_agree), which never call the implementation."""
    return {k: v for k, v in outcomes.items() if not (v.startswith("skipped") and "not applicable" in v)}


def run_quick(tmp_path: Path, impls: list[str], *extra: str):
    """Outcomes by test id ('passed', 'failed: <message>', 'skipped: <reason>'), seconds
    by test id (pytest's own, per test), the report and the output, at the default
    profile of an --impl run."""
    xml = tmp_path / "run.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/test_checks.py", "-q", "-p", "no:randomly", "-p", "no:xdist",
           "-p", "no:cacheprovider", "--op", "softmax", "--dtype", "float32", "--report-dir",
           str(tmp_path / "reports"), f"--junitxml={xml}", "--hypothesis-seed", "0", *extra]  # quick draws afresh
    for impl in impls:
        cmd += ["--impl", f"softmax={impl}"]
    # pytest prints whole failure messages in its short summary under CI (CI or BUILD_NUMBER
    # set), the first test's traceback a third time: the counts below are those of a terminal
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    outcomes, seconds = {}, {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test_id = case.get("name").partition("[")[2].rstrip("]")
        failed, skipped = case.find("failure"), case.find("skipped")
        outcomes[test_id] = (f"failed: {failed.get('message')}" if failed is not None else
                             f"skipped: {skipped.get('message')}" if skipped is not None else "passed")
        seconds[test_id] = float(case.get("time"))
    report = json.loads((tmp_path / "reports" / "report.json").read_text())
    return outcomes, seconds, report, proc


def test_a_missing_dependency_is_one_verdict_in_seconds(tmp_path):
    """Every test fails on the ModuleNotFoundError after ten inputs that all raised it: 13
    tests in a few seconds in all (each took about 30 s of shrinking before), the traceback
    once (later tests point to it), one line for the implementation in the summary; and an
    --impl run's default profile is quick."""
    outcomes, seconds, report, proc = run_quick(tmp_path, [f"{FIXTURES}:softmax_missing_dependency"])
    assert len(outcomes) == softmax_checks(), proc.stdout[-3000:]
    verdict = (f"raised ModuleNotFoundError: No module named 'tritoncheck_absent_optional_dependency' on "
               f"{unrunnable.EVERY_INPUT_AFTER} of the {unrunnable.EVERY_INPUT_AFTER} inputs this test tried: on every "
               "input tried")
    outcomes = applicable(outcomes)
    assert all(o.startswith("failed") for o in outcomes.values()), outcomes
    assert proc.stdout.count(verdict) >= len(outcomes), proc.stdout[-3000:]  # each test says it
    assert proc.stdout.count("A missing dependency?") >= len(outcomes), proc.stdout[-3000:]
    assert proc.stdout.count("inputs the implementations raised on") == 1
    assert proc.stdout.count("its traceback:\n") == 1, proc.stdout[-3000:]  # the first test's; the others point there
    # ten inputs a test (a repeated draw counts once), never a shrink: 10 s in all on this project's
    # 2-core CPU (4.7 s the first test, imports and all), 25 s at a load of 17; the bound is for shrinking's 390 s
    raised = {t: sum(n.values()) for t, n in report["refusals_per_test"].items()}
    assert len(raised) == len(outcomes) and all(n <= 2 * unrunnable.EVERY_INPUT_AFTER for n in raised.values()), raised
    assert sum(seconds.values()) < 60, seconds
    assert report["meta"]["profile"] == "quick"
    assert proc.returncode == 1


def test_a_kernel_the_interpreter_cannot_run_is_one_skip_verdict(tmp_path):
    """Under the interpreter: every test skipped as "does not run under the Triton
    interpreter" with the error and the advice to run on a GPU, never a kernel failure, and
    the run verified nothing (exit status 1). Compiled on a GPU the same kernel is correct
    and passes."""
    outcomes, seconds, _, proc = run_quick(tmp_path, [f"{FIXTURES}:softmax_interpreter_unrunnable"])
    forward = {k: v for k, v in outcomes.items() if not k.endswith(GRADIENT_CHECKS)}
    assert len(forward) == softmax_checks() - len(GRADIENT_CHECKS), outcomes
    forward = applicable(forward)
    if backend.current() == "cuda":
        assert all(v == "passed" for v in forward.values()), outcomes
        return
    assert all("raised InterpreterError: AttributeError(\"'float' object has no attribute 'to'\")" in v
               and "does not run under the Triton interpreter" in v and "run it on a GPU" in v and v.startswith("skipped")
               for v in forward.values()), forward
    assert proc.stdout.count("inputs the implementations raised on") == 1
    assert sum(seconds.values()) < 60, seconds  # ten inputs a test, as above
    assert proc.returncode == 1 and "nothing was verified" in proc.stdout


def test_an_error_on_one_path_leaves_the_other_checks_their_own_verdicts(tmp_path):
    """A backward that imports a missing module: the gradient checks end on that error,
    the forward checks pass (each test judges its own inputs)."""
    outcomes, _, _, proc = run_quick(tmp_path, [f"{FIXTURES}:softmax_backward_missing_dependency"])
    for test_id, outcome in applicable(outcomes).items():
        if test_id.endswith(GRADIENT_CHECKS):
            assert outcome.startswith("failed") and "raised ModuleNotFoundError" in outcome, (test_id, outcome)
        else:
            assert outcome == "passed", (test_id, outcome, proc.stdout[-3000:])


@pytest.mark.slow  # 20 CPU-s; every commit: the command's quick profile passes a correct softmax and fails a
# wrong one (test_cli's smoke test), padded_lanes_zero dies in the smoke tier's kills
def test_quick_passes_a_correct_control_and_fails_a_planted_bug_with_its_values(tmp_path):
    """The quick profile keeps its power: the plain-PyTorch control passes every check, and
    softmax's padded_lanes_zero mutant fails on a wrong value (an AssertionError of a check,
    shown as found, not a constant-error verdict)."""
    outcomes, _, _, proc = run_quick(tmp_path, ["tritoncheck.controls.softmax:torch_softmax_fp32",
                                                "tritoncheck.mutants.softmax:padded_lanes_zero"],
                                     "--hypothesis-seed", "0")
    control = {k: v for k, v in outcomes.items() if "-torch_softmax_fp32-" in k}
    mutant = {k: v for k, v in outcomes.items() if "-padded_lanes_zero-" in k}
    assert len(control) == len(mutant) == softmax_checks(), outcomes
    assert all(v == "passed" for v in applicable(control).values()), control
    failed = [v for v in mutant.values() if v.startswith("failed")]
    assert failed, mutant
    assert "raises the same error" not in proc.stdout
    assert "failed for padded_lanes_zero on:" in proc.stdout


def test_the_command_runs_quick_then_the_deep_profile_and_a_named_profile_alone():
    ns = cli.parser().parse_args(["softmax=m:f"])
    assert cli.pytest_args(ns, [], "quick")[-2:] == ["--hypothesis-profile", "quick"]
    assert "--hypothesis-profile" not in cli.pytest_args(ns, [])  # the plugin's --impl default: quick
    assert cli.deep_profile("cuda") == "gpu" and cli.deep_profile("interpret") == "ci"
    named = cli.parser().parse_args(["softmax=m:f", "--profile", "gpu"])
    assert cli.pytest_args(named, [])[-2:] == ["--hypothesis-profile", "gpu"]
