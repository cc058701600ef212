"""The verdict on inputs an implementation raised on (tritoncheck/unrunnable.py) and what
sets them apart (tritoncheck/case_contrast.py), in process on hand-made cases: true to what
was seen (how many of how many, the property that splits them from the accepted ones, the
declaration that says so), never "a missing dependency?" for an error that is not an
import's, and nothing carried from one test to another. End to end through the suite:
tests/test_refusals.py (partial domains) and tests/test_quick_profile.py (every input)."""
from __future__ import annotations

import re

import pytest

from tritoncheck import registry, unrunnable
from tritoncheck.case_contrast import contrast
from tritoncheck.strategies import Case, TensorSpec


@pytest.fixture(autouse=True)
def _fresh():
    registry.load()
    unrunnable.reset()
    yield
    unrunnable.reset()


def _attention_case(seed: int, causal: bool, n: int = 16) -> Case:
    t = TensorSpec((1, 2, n, 8), "float16", seed=seed)
    return Case("linear_attention", "float16", ("q", "k", "v", "causal"), {"q": t, "k": t, "v": t},
                {"causal": causal, "eps": 1e-6})


def _softmax_case(seed: int, n: int) -> Case:
    return Case("softmax", "float32", ("x", "temperature"), {"x": TensorSpec((3, n), "float32", seed=seed)},
                {"temperature": 1.0})


def _record(test_id="linear_attention-f-float16-matches_reference", backend="cuda", dtype="float16", key=None):
    return unrunnable.record_of(test_id, impl="f", impl_key=key or test_id.rpartition("-")[0].rpartition("-")[0],
                                dtype=dtype, backend=backend)


def _raise(exc):
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 - a traceback to record
        return caught


def test_a_causal_only_implementation_is_told_where_it_raised_and_what_to_declare():
    record = _record()
    for seed in range(6):
        record.add(_attention_case(seed, False), _raise(NotImplementedError("causal=False is not implemented")),
                   "r.json" if seed == 0 else None)
    for seed in range(6, 14):
        record.accept(_attention_case(seed, True))
    assert not record.every_input()
    verdict = record.verdict(registry.OPS["linear_attention"], judged="each passed the check")
    text = verdict.text
    assert "raised NotImplementedError: causal=False is not implemented on 6 of the 14 inputs" in text, text
    assert "on every input with causal=False (6 of 6 such inputs); the 8 input(s) with causal=True were accepted " \
           "(each passed the check)" in text, text
    assert "f.limits = {'values': {'causal': (True,)}}" in text and 'f.refuses = r"causal=False is not implemented"' in text
    assert "missing dependency" not in text and "replay: python -m tritoncheck.replay r.json" in text
    assert "its traceback:\nTraceback" in text and not verdict.skip
    assert [e.where for e in verdict.entries] == ["on inputs with causal=False"]


def test_a_row_limit_is_a_size_threshold_and_one_error_up_to_its_numbers():
    record = _record("softmax-f-float32-rows_sum_to_one", dtype="float32")
    for seed, n in enumerate((65, 100, 2049)):
        record.add(_softmax_case(seed, n), _raise(RuntimeError(f"rows of {n} elements; at most 64")), None)
    for seed, n in enumerate((1, 17, 64), start=10):
        record.accept(_softmax_case(seed, n))
    assert len(record.raised) == 1
    text = record.verdict(registry.OPS["softmax"]).text
    assert "on every input with N >= 65 (3 of 3 such inputs); the 3 input(s) with N <= 64 were accepted" in text, text
    pattern = re.search(r"f\.refuses = \(RuntimeError, (r\".*?\")\)", text).group(1)
    assert re.search(eval(pattern), "rows of 4096 elements; at most 64"), pattern  # noqa: S307 - our own literal
    assert "f.limits = {'max_size': {'N': 64}}" in text


def test_the_dtype_of_a_table_against_x_splits_and_messages_differing_in_dtype_names_are_one_error():
    ops = registry.OPS

    def rope(seed, table):
        x, t = TensorSpec((1, 2, 8, 16), "float16", seed=seed), TensorSpec((8, 8), table, seed=seed + 1)
        return Case("rope", "float16", ("x", "cos", "sin"), {"x": x, "cos": t, "sin": t}, {})

    record = _record("rope-f-float16-matches_reference")
    for seed, table in enumerate(("float32", "bfloat16", "float32")):
        record.add(rope(seed, table), _raise(RuntimeError(f"cos has dtype {table} but x has dtype float16")), None)
    record.accept(rope(10, "float16"))
    assert len(record.raised) == 1
    text = record.verdict(ops["rope"]).text
    assert "on every input with cos in another dtype than x (3 of 3 such inputs); the 1 input(s) with cos in x's " \
           "dtype were accepted" in text, text
    assert "f.limits = {'same_dtype': ('cos', 'sin')}" in text


def test_no_split_is_said_as_such_and_the_count_is_of_distinct_inputs():
    record = _record("softmax-f-float32-matches_reference", dtype="float32")
    case = _softmax_case(1, 30)
    for _ in range(3):
        record.add(case, _raise(RuntimeError("flaky launch")), None)  # one input, raised on three times
    record.accept(_softmax_case(2, 30))
    assert record.raised_count() == 1
    assert "no single property of the drawn cases sets them apart from the 1 accepted" in \
        record.verdict(registry.OPS["softmax"]).text


def test_every_input_ends_the_test_after_ten_and_only_an_import_error_is_a_missing_dependency():
    record = _record("softmax-f-float32-matches_reference", dtype="float32")
    for seed in range(unrunnable.EVERY_INPUT_AFTER - 1):
        record.add(_softmax_case(seed, 8), _raise(ModuleNotFoundError("No module named 'fast_ops'")), None)
        assert not record.every_input()
    record.add(_softmax_case(99, 8), _raise(ModuleNotFoundError("No module named 'fast_ops'")), None)
    assert record.every_input()
    text = record.verdict(registry.OPS["softmax"]).text
    assert "on every input tried (10 of 10; the test ended there)" in text and "A missing dependency?" in text
    other = _record("softmax-f-float32-rows_sum_to_one", dtype="float32")
    other.add(_softmax_case(0, 8), _raise(RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")), None)
    assert "missing dependency" not in other.verdict(registry.OPS["softmax"]).text.lower()


def test_nothing_is_carried_from_one_test_to_another_and_the_traceback_prints_once():
    first = _record("softmax-f-float16-matches_reference", dtype="float16", key="softmax-f")
    first.add(_softmax_case(0, 8), _raise(ModuleNotFoundError("No module named 'x'")), None)
    later = _record("softmax-f-bfloat16-matches_reference", dtype="bfloat16", key="softmax-f")
    assert later.raised == {} and not later.every_input()  # its own inputs decide
    later.add(_softmax_case(0, 8), _raise(ModuleNotFoundError("No module named 'x'")), None)
    assert "its traceback:\nTraceback" in first.verdict(registry.OPS["softmax"]).text
    assert "its traceback: as in softmax-f-float16-matches_reference" in later.verdict(registry.OPS["softmax"]).text


def test_the_summary_joins_dtypes_and_interpreter_errors_make_a_skip():
    entries = [unrunnable.Entry("softmax-f", d, "E: x", "on every input tried") for d in ("float16", "float16", "bfloat16")]
    entries.append(unrunnable.Entry("softmax-f", "float32", "E: x", "on inputs with N >= 65"))
    assert unrunnable.summary_lines(entries) == [
        "softmax-f raised E: x on every input tried, in 3 tests: bfloat16 (1), float16 (2)",
        "softmax-f raised E: x on inputs with N >= 65, in 1 test of float32"]
    from triton.runtime.errors import InterpreterError
    record = _record("softmax-f-float32-matches_reference", backend="interpret", dtype="float32")
    record.add(_softmax_case(0, 8), _raise(InterpreterError("AttributeError(\"'float' object has no attribute 'to'\")")),
               None)
    verdict = record.verdict(registry.OPS["softmax"])
    assert verdict.skip and "does not run under the Triton interpreter" in verdict.text


def test_contrast_needs_accepted_inputs_and_prefers_one_value():
    raised = [_attention_case(s, False, n=16 + s) for s in range(4)]
    assert contrast(registry.OPS["linear_attention"], raised, []) == []
    splits = contrast(registry.OPS["linear_attention"], raised, [_attention_case(9, True, n=17)])
    assert splits[0].inside == "causal=False" and splits[0].holds(raised[0])


def test_a_compilation_error_names_the_source_line_and_the_error_it_wraps():
    """Triton's CompilationError reads "at 52:20:" on its first line, then the source and a
    caret; the error inside (a bare AssertionError in tl.dot, seen on an H200) is its cause.
    The verdict's line shows the pointed-at source line and the cause."""
    class CompilationError(Exception):
        pass

    try:
        try:
            raise AssertionError()
        except AssertionError as inner:
            raise CompilationError("at 52:20:\n    k_ok = ks < K\n    acc_k = _dot(a, b, acc_k)\n"
                                   "            ^\n") from inner
    except CompilationError as exc:
        assert unrunnable.one_line(exc) == "CompilationError: at 52:20: acc_k = _dot(a, b, acc_k) (AssertionError)"
    assert unrunnable.one_line(ValueError("x: rows of 5\nsecond line")) == "ValueError: x: rows of 5"
