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
from tritoncheck.report import assemble, diff, files, html_page, markdown
from tritoncheck.report import shards as report_shards
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


@pytest.mark.smoke
def test_failure_names_the_case_the_worst_element_and_a_replay_command(report_dir):
    with pytest.raises(AssertionError) as info:
        _failing_target().run(CASE)
    text = str(info.value)
    for part in ("worst at index", "expected", "allowed", "x the tolerance",
                 "x: shape [2, 5] float32, normal scale=1, seed 0", "replay: python -m tritoncheck.replay"):
        assert part in text, f"{part!r} missing from:\n{text}"


@pytest.mark.smoke
def test_standalone_script_reproduces_the_failure(report_dir):
    with pytest.raises(AssertionError):
        _failing_target().run(CASE)
    script = next(report_dir.glob("failures/*.py"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "softmax output y: max |error|" in done.stdout and "FAILED: does not match" in done.stdout


@pytest.mark.smoke
def test_replay_module_reproduces_the_failure(report_dir):
    with pytest.raises(AssertionError):
        _failing_target().run(CASE)
    from tritoncheck import replay
    assert replay.main([str(next(report_dir.glob("failures/*.json")))]) == 1
    (report_dir / "other.json").write_text("[1]")
    assert replay.main([str(report_dir / "missing.json")]) == 2 and replay.main([str(report_dir / "other.json")]) == 2


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
    files.write(tmp_path, data)
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
    assert "<p>interpret backend on None, profile None;" in html and '{"backend"' not in html  # words, not a dict


def test_two_implementations_of_one_function_name_get_their_own_ids_rows_and_replay_files(tmp_path, monkeypatch):
    """--impl softmax=lib_a:softmax softmax=lib_b:softmax: pytest numbered the ids
    (matches_reference0/1) and the report merged their rows; each is named by its path now."""
    import torch
    for lib in ("lib_a", "lib_b"):
        (tmp_path / f"{lib}.py").write_text("import torch\ndef softmax(x, temperature=1.0):\n"
                                            "    return torch.softmax(x / temperature, -1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_user_impls", {})
    registry.register_implementation("softmax", "lib_a:softmax")
    registry.register_implementation("softmax", "lib_b:softmax")
    registry.register_implementation("softmax", "lib_a:softmax")  # named twice: checked once
    impls = registry.user_implementations()["softmax"]
    assert [i.name for i in impls] == ["lib_a.softmax", "lib_b.softmax"]
    check = registry.OPS["softmax"].checks[0]
    ids = {harness.Target(registry.OPS["softmax"], i, torch.float32, check).id for i in impls}
    assert ids == {f"softmax-lib_a.softmax-float32-{check.name}", f"softmax-lib_b.softmax-float32-{check.name}"}
    assert len({harness.failure_stem(i) for i in ids}) == 2
    with pytest.raises(ValueError, match="that name is already lib_a:softmax's"):
        registry.register_implementation("softmax", "lib_b:softmax", name="lib_a.softmax")


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
    assert "3 examples over 1 tests, 3 discarded" in markdown.markdown(data)


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
    table = markdown.discard_table(data)
    assert target.id in table and "2x ValueError: x: rows of 70000 elements (and 1 variant(s))" in table
    md = markdown.markdown(data)
    assert "## Refusals, vacuous comparisons and discards" in md and "N <= 65536" in md
    assert "rows of 70000" in html_page.page(data)


def test_statistical_checks_add_up_to_a_union_bound_per_run():
    registry.load()
    examples = {"dropout_residual_layer_norm-triton-float16-keep_fraction_binomial": 25,
                "dropout_residual_layer_norm-triton-float16-seed_reproducible": 10,
                "softmax-triton-float16-matches_reference": 40}
    invalid = {"dropout_residual_layer_norm-triton-float16-keep_fraction_binomial": 5}
    figures = assemble.statistical(examples, invalid)
    keep = figures["tests"]["dropout_residual_layer_norm-triton-float16-keep_fraction_binomial"]
    assert keep["examples"] == 20 and keep["bound"] == pytest.approx(20 * keep["rate"])
    assert "softmax-triton-float16-matches_reference" not in figures["tests"]  # exact checks carry no rate
    assert figures["run_bound"] == pytest.approx(sum(t["bound"] for t in figures["tests"].values()))
    line = markdown.statistical_line({"statistical": figures})
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
    assert assemble.vacuous_where(rows) == [{"regime": "dy normal x1000, x near_max", "elements": 9, "examples": 2}]


# ------------------------------------------------ the summary, finite figures, diff, merge

def _recorded_report(folder, comparisons, verdicts, parities=None, case=CASE):
    """A report from hand-made comparisons of the padded_lanes_zero softmax target, one
    example each (with PyTorch's error beside it where ``parities`` gives one)."""
    from tritoncheck.parity import Parity
    collector = report.Collector()
    target = _failing_target()
    sink = collector.sink(target, case)
    for i, c in enumerate(comparisons):
        baseline = (parities or [None] * len(comparisons))[i]
        sink(c, parity=None if baseline is None else Parity(baseline, c.max_abs))
        collector.count(target, case=case)
    collector.dump(folder / "parts", "main")
    return report.build(folder, [], {"backend": "interpret", "profile": "ci"}, verdicts=verdicts)


def _numbers(text):
    import re
    return [float(x) for x in re.findall(r"(?<![\w.])[-+]?\d+\.?\d*(?:e[-+]?\d+)?", text)]


def test_tables_show_finite_ulps_at_the_output_scale_and_name_extremes_in_a_note(tmp_path):
    import math

    import numpy as np
    import torch

    from tritoncheck.oracle import compare
    from tritoncheck.tolerance import ulp
    # an output whose elementwise relative and ULP errors are astronomical (expected 1e-30
    # next to 1.0, got 0.5 there) but which passes: its allowance is absolute, set by the inputs
    expected = np.array([1.0, 1e-30])
    near_zero = compare("y", torch.tensor([1.0, 0.5]), expected, np.array([1e-7, 1.0]))
    assert near_zero.ok and near_zero.max_ulp > 1e20  # the raw elementwise figure the old table printed
    exact = compare("y", torch.tensor([1.0, 2.0]), np.array([1.0, 2.0]), np.array([1e-7, 1e-7]))
    data = _recorded_report(tmp_path, [near_zero, exact], {"softmax-padded_lanes_zero-float32-matches_reference":
                                                            "passed"}, parities=[0.0, 1e-70])
    (o,) = data["outputs"]
    one_ulp = float(ulp(np.array([1.0]), torch.float32)[0])
    assert o["max_ulp_at_scale"] == pytest.approx(0.5 / one_ulp)  # per tensor, at the scale 1.0: 4.2e6
    # the 1e-30 element is below the output's rounding at its scale: no relative error is defined
    # there, and the one counted element (1.0) is exact
    assert o["max_rel_counted"] == 0.0 and o["rel_defined_examples"] == 2
    assert o["torch_exact_examples"] == 2 and o["max_parity_ratio_finite"] is None  # 1e-70: no error at scale 1
    text = markdown.table(data) + markdown.markdown(data) + report_summary_text(data)
    import re
    assert not re.search(r"\b(inf|nan)\b", text.lower()), text
    assert all(math.isfinite(v) for v in _numbers(markdown.table(data)))
    assert "torch exact" in report_summary_text(data) and "exact" in markdown.table(data)
    assert any("ulp of the output's scale" in n and "matches_reference on x normal" in n for n in o["notes"])
    assert "[1] softmax/padded_lanes_zero/float32/y" in markdown.table(data)  # the note, under the table
    # ... and why, on the output's own row: 4.2e6 ulps where the allowance (1) reaches the output's scale
    (row,) = [line for line in markdown.table(data).splitlines() if line.startswith("softmax ")]
    assert row.endswith("[1] expected ~0 (within its allowance of 0): its ulps measure nothing, 1 ex.")
    assert o["note_tags"] == [row.partition("[1] ")[2]]


def report_summary_text(data):
    from tritoncheck.report.summary import summary_text
    return summary_text(data)


def test_the_relative_error_is_over_the_elements_where_it_is_defined():
    import numpy as np
    import torch

    from tritoncheck.oracle import compare
    # the 1e-30 element is below the output's own rounding (u * scale): not counted, so the
    # relative error is 1e-6 / 1 from the element that is, not 1e-3 / 1e-30
    c = compare("y", torch.tensor([1.0 + 1e-6, 1e-3], dtype=torch.float64), np.array([1.0, 1e-30]),
                np.array([1e-5, 1e-2]), dtype=torch.float32)
    assert c.max_rel_counted == pytest.approx(1e-6, rel=1e-6)
    nothing = compare("y", torch.tensor([0.0]), np.array([0.0]), np.array([1e-7]))
    assert nothing.max_rel_counted is None  # defined nowhere: the table shows '-'


def test_summary_line_per_op_impl_dtype_with_verdicts_coverage_and_the_unexercised(tmp_path):
    import numpy as np
    import torch

    from tritoncheck.oracle import compare
    c = compare("y", torch.tensor([1.0, 2.0]), np.array([1.0, 2.0]), np.array([1e-7, 1e-7]))
    verdicts = {"softmax-padded_lanes_zero-float32-matches_reference": "passed",
                "softmax-padded_lanes_zero-float32-rows_sum_to_one": "failed",
                "softmax-padded_lanes_zero-float32-deterministic": "skipped"}
    data = _recorded_report(tmp_path, [c], verdicts)
    (line,) = data["summary"]
    assert (line["passed"], line["failed"], line["skipped"]) == (1, 1, 1)
    assert line["failed_checks"] == ["rows_sum_to_one"] and line["worst_at"] == "matches_reference/y"
    assert line["typical_ulp"] == 0.0 and line["vacuous_share"] == 0.0
    # CASE draws one contiguous normal 2x5 tensor: the rest was not exercised, and says so
    assert line["not_exercised"].startswith("largest x 2x5, at most 2 rows of <= 5")
    assert "near_max" in line["not_exercised"] and "permuted/strided/offset layout" in line["not_exercised"]
    # an output with no error anywhere reads as "exact or not exercised", with the largest input
    (o,) = data["outputs"]
    assert o["notes"] == ["softmax/padded_lanes_zero/float32/y: 0 error in all 1 examples: exact there, or not "
                          "exercised (largest x 2x5, at most 2 rows of <= 5)"]
    md = markdown.markdown(data)
    assert md.index("## Summary") < md.index("## Outputs") and "1/1/1 failed: rows_sum_to_one" in md
    assert ("| `softmax-padded_lanes_zero-float32-matches_reference` | 1 | largest x 2x5, at most 2 rows of <= 5 | "
            "contiguous | float32 | normal |") in md
    cov = data["coverage_per_test"]["softmax-padded_lanes_zero-float32-matches_reference"]
    assert cov["tensors"]["x"]["max_rows"] == 2 and cov["layouts"] == ["contiguous"] and cov["families"] == ["normal"]


def test_coverage_counts_only_examples_that_ran_to_the_end():
    from tritoncheck import coverage
    from tritoncheck.strategies import Layout
    collector = report.Collector()
    target = _failing_target()
    wide = CASE.replace(tensors={"x": TensorSpec((3, 70000), "float32", "near_max", 1.0, 0, Layout((1, 0), 1, 2, 5))})
    collector.count(target, invalid=True, case=wide)
    collector.count(target, refused=True, case=wide)
    collector.count(target, case=CASE)
    tally = collector.coverage[target.id]
    assert tally["examples"] == 1 and tally["tensors"]["x"]["max_row_length"] == 5
    collector.count(target, case=wide)
    assert coverage.largest_line(collector.coverage[target.id]) == "largest x 3x70000, at most 3 rows of <= 70000"
    assert collector.coverage[target.id]["layouts"] == ["contiguous", "offset", "permuted", "strided"]


def _diff_pair(tmp_path, headroom_b, verdict_b, refusal_b=None):
    """report.json files A (headroom 1e-3, passed) and B (``headroom_b``, ``verdict_b``)."""
    import numpy as np
    import torch

    from tritoncheck.oracle import compare
    out = []
    for name, headroom, verdict, refusal in (("a", 1e-3, "passed", None), ("b", headroom_b, verdict_b, refusal_b)):
        folder = tmp_path / name
        c = compare("y", torch.tensor([1.5]), np.array([1.0]), np.array([0.5 / headroom]))  # |error| 0.5
        data = _recorded_report(folder, [c], {"softmax-padded_lanes_zero-float32-matches_reference": verdict})
        if refusal:
            data["refusals_per_test"] = {"softmax-padded_lanes_zero-float32-matches_reference": {refusal: 2}}
        (folder / "report.json").write_text(json.dumps(data))
        out.append(folder / "report.json")
    return out


def test_report_diff_lists_grown_headroom_changed_verdicts_and_new_refusals_and_fails_the_step(tmp_path):
    a, b = _diff_pair(tmp_path, headroom_b=0.5, verdict_b="failed", refusal_b="Refusal: rows of 70000 elements")
    done = subprocess.run([sys.executable, "-m", "tritoncheck", "report", "diff", str(a), str(b)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "**Regression**" in out and "| `softmax-padded_lanes_zero-float32-matches_reference` | passed | **failed** |" in out
    assert "| softmax/padded_lanes_zero/float32/y | matches_reference | 0.001 | 0.5 | 500x |" in out
    assert "Refusal: rows of 70000 elements | 2 |" in out


def test_report_diff_of_equal_reports_passes_and_a_non_report_is_a_usage_error(tmp_path):
    from tritoncheck import cli
    a, b = _diff_pair(tmp_path, headroom_b=1e-3 * 1.1, verdict_b="passed")  # 10% more: below the 1.25x factor
    assert cli.main(["report", "diff", str(a), str(b)]) == 0
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert cli.main(["report", "diff", str(a), str(tmp_path / "junk.json")]) == 2


def test_shards_are_a_stable_partition_by_test_id():
    ids = [f"tests/test_checks.py::test_check[softmax-triton-float32-check{i}]" for i in range(300)]
    shards = [report_shards.shard_of(i, 3) for i in ids]
    assert set(shards) == {1, 2, 3} and min(shards.count(k) for k in (1, 2, 3)) > 60
    # a value fixed by SHA-256: no hash seed, no machine, no collection order changes it
    assert report_shards.shard_of("tests/test_checks.py::test_check[softmax-triton-float32-matches_reference]",
                                  3) == report_shards.shard_of(ids[0].replace("check0", "matches_reference"), 3)
    assert [report_shards.shard_of(i, 3) for i in reversed(ids)] == shards[::-1]
    for bad in ("3", "0/3", "4/3", "a/b"):
        with pytest.raises(ValueError, match="--shard"):
            report_shards.parse(bad)


SHARD_RUN = ["tests/test_checks.py", "-p", "no:randomly", "-q", "--op", "softmax", "--dtype", "float32",
             "--max-examples", "3", "-k", "matches_reference or rows_sum_to_one or shift_invariant or "
             "deterministic or values_in_unit_interval or temperature_equivalent"]
SAME_RUN_KEYS = ("outputs", "summary", "verdicts", "coverage_per_test", "examples_per_test", "invalid_per_test",
                 "refusals_per_test", "vacuous_per_test", "statistical", "skipped", "rows")


# slow: four runs of the suite in child processes, about 45 CPU-seconds; on every commit
# test_shards_are_a_stable_partition_by_test_id checks the split
@pytest.mark.slow
def test_three_shards_merged_equal_the_whole_run(tmp_path):
    """The same seed (the ci profile is derandomized), one small op, a few checks and
    examples: the whole run, then --shard 1/3, 2/3, 3/3, merged with `report merge`."""
    def run(folder, *extra):
        done = subprocess.run([sys.executable, "-m", "pytest", *SHARD_RUN, "--report-dir", str(folder), *extra],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]  # 5: an empty shard
        return json.loads((folder / "report.json").read_text())

    whole = run(tmp_path / "whole")
    shards = [run(tmp_path / f"shard{k}", "--shard", f"{k}/3") for k in (1, 2, 3)]
    assert [s["meta"]["shard"] for s in shards] == ["1/3", "2/3", "3/3"]
    ran = [set(s["verdicts"]) for s in shards]
    assert sum(map(len, ran)) == len(whole["verdicts"]) == 6 and set().union(*ran) == set(whole["verdicts"])
    from tritoncheck import cli
    assert cli.main(["report", "merge", "-o", str(tmp_path / "merged"),
                     *(str(tmp_path / f"shard{k}" / "report.json") for k in (1, 2, 3))]) == 0
    merged = json.loads((tmp_path / "merged" / "report.json").read_text())
    assert merged["rows"], "no comparison recorded: the equality below would be vacuous"
    for key in SAME_RUN_KEYS:
        assert merged[key] == whole[key], key
    with pytest.raises(ValueError, match="two shards|same shard"):
        report_shards.merge([shards[0], shards[0]])


WRONG_SOFTMAX = '''
import torch
def softmax(x, temperature=1.0):
    return (torch.softmax(x.float() / temperature, dim=-1) * 1.01).to(x.dtype)  # 1% too large
softmax.uses_triton = False
softmax.supports_backward = False
'''


def test_junit_failure_message_names_the_check_its_replay_and_the_worst_element(tmp_path):
    import os
    import xml.etree.ElementTree as ET
    (tmp_path / "wrong_softmax.py").write_text(WRONG_SOFTMAX)
    junit = tmp_path / "junit.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_checks.py", "-p", "no:randomly", "-q",
                           "--impl", "softmax=wrong_softmax:softmax", "--dtype", "float32", "--max-examples", "3",
                           "-k", "matches_reference", "--report-dir", str(tmp_path / "r"), f"--junitxml={junit}"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (failure,) = [f for case in ET.parse(junit).iter("testcase") for f in case if f.tag == "failure"]
    message = failure.get("message")  # what CI test views show: pytest keeps its first 500 characters
    assert "softmax-softmax-float32-matches_reference failed; replay: python -m tritoncheck.replay" in message
    assert "worst at index" in message and "x the tolerance" in message, message
    # the terminal's summary line says the same
    assert "0/1/0 failed: matches_reference" in done.stdout


def test_report_diff_pairs_the_project_kernel_with_a_library_one_of_another_name(tmp_path):
    a, b = (json.loads(p.read_text()) for p in _diff_pair(tmp_path, headroom_b=0.5, verdict_b="failed"))
    b["outputs"] = [dict(o, impl="liger") for o in b["outputs"]]
    b["verdicts"] = {t.replace("padded_lanes_zero", "liger"): v for t, v in b["verdicts"].items()}
    found = diff.diff(a, b)
    assert found["paired"] == ["softmax: padded_lanes_zero (A) ~ liger (B)"] and found["regression"]
    assert [c["test"] for c in found["changed"]] == ["softmax-padded_lanes_zero-float32-matches_reference"]
    assert [g["output"] for g in found["grew"]] == ["softmax/padded_lanes_zero/float32/y"]
