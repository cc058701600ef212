"""Failing cases people can act on, and the tolerance report.

A mutant's failure must come with a case in words, a replay command and a
standalone script that reproduces it; a run must write the JSON, Markdown and HTML
reports in the documented schema.
"""
import json
import subprocess
import sys

import pytest

from tritoncheck import harness, registry, report, selfcheck
from tritoncheck.config import CONFIG
from tritoncheck.strategies import Case, TensorSpec


@pytest.fixture
def report_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(CONFIG, "report_dir", tmp_path)
    # the planted failures here must not reach the run's own report
    monkeypatch.setattr(harness, "_collector", report.Collector())
    return tmp_path


def _failing_target():
    op = registry.load()["softmax"]
    m = next(m for m in selfcheck.mutants() if m.name == "padded_lanes_zero")
    check = next(c for c in op.checks if c.name == "matches_reference")
    return harness.Target(op, selfcheck.as_implementation(m), __import__("torch").float32, check)


CASE = Case("softmax", "float32", ("x", "temperature"),
            {"x": TensorSpec((2, 5), "float32", "normal", 1.0, 0)}, {"temperature": 1.0})


def test_failure_names_the_case_the_worst_element_and_a_replay_command(report_dir):
    with pytest.raises(AssertionError) as info:
        _failing_target().run(CASE)
    text = str(info.value)
    for part in ("worst at index", "expected", "allowed", "x the tolerance",
                 "x: shape [2, 5] float32, normal scale=1, seed 0", "replay: python -m tritoncheck.replay"):
        assert part in text, f"{part!r} missing from:\n{text}"


def test_standalone_script_reproduces_the_failure(report_dir):
    with pytest.raises(AssertionError):
        _failing_target().run(CASE)
    script = next(report_dir.glob("failures/*.py"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "softmax output y: max |error|" in done.stdout and "FAILED: does not match" in done.stdout


def test_replay_module_reproduces_the_failure(report_dir):
    with pytest.raises(AssertionError):
        _failing_target().run(CASE)
    from tritoncheck import replay
    assert replay.main([str(next(report_dir.glob("failures/*.json")))]) == 1


def test_reports_follow_the_schema(tmp_path):
    collector = report.Collector()
    target = _failing_target()
    import numpy as np
    import torch

    from tritoncheck.oracle import compare
    sink = collector.sink(target, CASE)
    sink(compare("y", torch.tensor([1.0, 2.0]), np.array([1.0, 2.5]), np.array([0.1, 0.1])))
    collector.dump(tmp_path / "parts", "main")
    data = report.build(tmp_path, [{"test": "t", "outcome": "skipped", "reason": "r"}], {"backend": "interpret"})
    report.write(tmp_path, data)
    loaded = json.loads((tmp_path / "report.json").read_text())
    assert loaded["schema_version"] == report.SCHEMA_VERSION
    (row,) = loaded["outputs"]
    for key in ("op", "impl", "dtype", "backend", "output", "examples", "failed", "max_abs", "p99_abs", "max_rel",
                "p99_rel", "max_ulp", "p99_ulp", "max_headroom", "allowed_at_worst", "closest_case", "points",
                "counted", "vacuous", "vacuous_examples"):
        assert key in row
    assert row["max_headroom"] == pytest.approx(5.0) and row["failed"] == 1
    assert Case.from_json(row["closest_case"]["case"]).to_json() == CASE.to_json()
    assert "| softmax | padded_lanes_zero | float32 | y |" in (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    assert "headroom against elements" in html and "padded_lanes_zero" in html


def test_case_json_keeps_string_params_and_non_finite_floats():
    # a linear_attention case records its feature maps as strings ('elu'); replay of
    # such a case once failed on float('elu')
    case = Case("softmax", "float32", ("x",), {}, {"q_map": "elu", "t": float("inf"), "e": 1e-6})
    back = Case.from_json(json.loads(json.dumps(case.to_json())))
    assert back.params == {"q_map": "elu", "t": float("inf"), "e": 1e-6}


def test_examples_and_discarded_examples_are_counted_per_test(report_dir, monkeypatch):
    collector = report.Collector()
    monkeypatch.setattr(harness, "_collector", collector)
    target = _failing_target()

    from hypothesis.errors import UnsatisfiedAssumption

    def discards(case, impl):
        raise UnsatisfiedAssumption  # what assume(False) raises inside a Hypothesis test

    discarding = harness.Target(target.op, target.impl, target.dtype,
                                registry.Check("discards", discards))
    for _ in range(3):
        with pytest.raises(UnsatisfiedAssumption):
            discarding.run(CASE)
    collector.dump(report_dir / "parts", "main")
    data = report.build(report_dir, [], {"backend": "interpret"})
    assert data["examples_per_test"] == {discarding.id: 3} and data["invalid_per_test"] == {discarding.id: 3}
    assert not (report_dir / "failures").exists()  # a discarded example is not a failure
    assert "3 examples over 1 tests, 3 discarded" in report.markdown(data)


def test_refusals_and_discards_reach_every_report(tmp_path):
    collector = report.Collector()
    target = _failing_target()
    for i in range(10):
        collector.count(target, invalid=i < 2)
    collector.refuse(target, "ValueError: x: rows of 70000 elements")
    collector.refuse(target, "ValueError: x: rows of 90001 elements")
    collector.dump(tmp_path / "parts", "main")
    data = report.build(tmp_path, [], {"backend": "interpret"}, limits={"softmax-k": "N <= 65536"})
    assert data["refusals_per_test"][target.id] == {"ValueError: x: rows of 70000 elements": 1,
                                                    "ValueError: x: rows of 90001 elements": 1}
    table = report.discard_table(data)
    assert target.id in table and "2x ValueError: x: rows of 70000 elements (and 1 variant(s))" in table
    md = report.markdown(data)
    assert "## Refusals, vacuous comparisons and discards" in md and "N <= 65536" in md
    assert "rows of 70000" in report.html_page(data)


def test_statistical_checks_add_up_to_a_union_bound_per_run():
    registry.load()
    examples = {"dropout_residual_layer_norm-triton-float16-keep_fraction_binomial": 25,
                "dropout_residual_layer_norm-triton-float16-seed_reproducible": 10,
                "softmax-triton-float16-matches_reference": 40}
    invalid = {"dropout_residual_layer_norm-triton-float16-keep_fraction_binomial": 5}
    figures = report.statistical(examples, invalid)
    keep = figures["tests"]["dropout_residual_layer_norm-triton-float16-keep_fraction_binomial"]
    assert keep["examples"] == 20 and keep["bound"] == pytest.approx(20 * keep["rate"])
    assert "softmax-triton-float16-matches_reference" not in figures["tests"]  # exact checks carry no rate
    assert figures["run_bound"] == pytest.approx(sum(t["bound"] for t in figures["tests"].values()))
    line = report.statistical_line({"statistical": figures})
    assert line.startswith("statistical checks: 2 tests, 30 examples, false-alarm bound")


@pytest.mark.parametrize("rate", [0.0, 1.0, 2, True, "1e-6"])
def test_a_check_false_alarm_rate_must_be_a_probability(rate):
    with pytest.raises(ValueError, match="false_alarm must be a float in \\(0, 1\\)"):
        registry.Check("keep_fraction", lambda case, impl: None, false_alarm=rate)


def test_vacuous_elements_are_traced_to_the_input_regime_they_came_from():
    case = Case("softmax", "float16", ("x", "temperature"),
                {"x": TensorSpec((2, 5), "float16", "near_max", 1.0, 0),
                 "dy": TensorSpec((2, 5), "float16", "normal", 1e3, 1)}, {"temperature": 1.0}).to_json()
    quiet = dict(case, tensors={"x": dict(case["tensors"]["x"], family="normal")})
    rows = [{"vacuous": 7, "case": case}, {"vacuous": 2, "case": case}, {"vacuous": 0, "case": quiet}]
    assert report.vacuous_where(rows) == [{"regime": "dy normal x1000, x near_max", "elements": 9, "examples": 2}]
