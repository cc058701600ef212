"""tritoncheck.verify: a verdict for an agent loop, within its budget, whatever the kernel does.

Each call spawns one child (torch, Triton and the suite imported there): these tests
narrow the targets to one dtype and a few checks to keep each call to seconds.
"""
import json
import time
from pathlib import Path

import pytest

import tritoncheck
from tritoncheck import backend, verifier

CONTROL = "tritoncheck.controls.softmax:torch_softmax"
CHEAT = "tritoncheck.mutants.cheats:shape_keyed_cache"
# generous: the child's imports take 3-5 s on an idle core, several times that on a loaded CI machine
BUDGET_S = 240.0


def _verify(fn, tmp_path, **kwargs):
    kwargs = {"budget_s": BUDGET_S, "seed": 5, "max_examples": 3, "dtypes": ("float32",), **kwargs}
    return tritoncheck.verify("softmax", fn, report_dir=tmp_path, quiet=True, **kwargs)


def test_a_misspelt_op_dtype_or_check_is_a_usage_error_before_anything_runs(tmp_path):
    for kwargs, words in (({}, r"unknown op 'sofmax' \(did you mean 'softmax'\?\); known ops: .*softmax"),
                          ({"checks": ("rows_sum_to_on",)}, r"unknown check 'rows_sum_to_on' \(did you mean "
                                                            r"'rows_sum_to_one'\?\)"),
                          ({"dtypes": ("float64",)}, r"unknown dtype 'float64'.*float32, float16, bfloat16")):
        with pytest.raises(ValueError, match=words):
            tritoncheck.verify("softmax" if kwargs else "sofmax", CONTROL, report_dir=tmp_path, quiet=True, **kwargs)
    assert not any(tmp_path.iterdir())  # no child started, no verdict written


def test_a_correct_control_passes_within_the_budget(tmp_path):
    checks = ("matches_reference", "inputs_unchanged", "calls_independent", "deterministic", "rows_sum_to_one")
    verdict = _verify(CONTROL, tmp_path, checks=checks)
    assert verdict.passed and verdict.failure is None, verdict.summary()
    assert verdict.checks_run == tuple(f"float32/{c}" for c in checks)
    assert verdict.elapsed_s < BUDGET_S
    report = json.loads(Path(verdict.report).read_text())
    assert report["passed"] is True and report["seed"] == 5 and report["checks_run"] == list(verdict.checks_run)


def test_a_cheat_fails_with_the_check_its_case_and_a_replay_and_the_same_seed_finds_the_same_case(tmp_path):
    checks = ("matches_reference", "calls_independent")
    first = _verify(CHEAT, tmp_path / "a", checks=checks)
    assert not first.passed and first.failure.target == "float32/calls_independent", first.summary()
    assert first.failure.ending == verifier.ASSERTION
    assert "keeps state across calls" in first.failure.message
    assert first.failure.case.startswith("softmax(x, temperature) in float32")
    replay = first.failure.replay.split()[-1]
    assert Path(replay).is_file() and first.checks_run == ("float32/matches_reference", "float32/calls_independent")
    again = _verify(CHEAT, tmp_path / "b", checks=checks)
    assert (again.failure.target, again.failure.case) == (first.failure.target, first.failure.case)


def test_a_segfault_is_a_failed_verdict_naming_the_signal_and_the_case(tmp_path):
    verdict = _verify("crashing_kernels:segfaulting_softmax", tmp_path, checks=("matches_reference",))
    f = verdict.failure
    assert not verdict.passed and f.ending == verifier.DIED and "SIGSEGV" in f.message, verdict.summary()
    assert f.target == "float32/matches_reference" and f.case.startswith("softmax(x, temperature) in float32")
    saved = json.loads(Path(f.replay.split()[-1]).read_text())
    assert saved["check"] == "matches_reference" and saved["impl"] == "crashing_kernels:segfaulting_softmax"


def test_an_out_of_bounds_store_that_corrupts_the_heap_is_a_failed_verdict(tmp_path):
    """Under the interpreter the store runs through the host heap and kills the child (a
    signal); on a GPU it is an illegal address that CUDA reports as an error of the call
    (the context is lost, the child lives): either way a failed verdict naming it, with the
    case's replay."""
    verdict = _verify("crashing_kernels:oob_writing_softmax", tmp_path, checks=("matches_reference",))
    if backend.current() == "cuda":
        assert not verdict.passed and verdict.failure.ending == verifier.ERROR, verdict.summary()
        assert "CUDA error" in verdict.failure.message and verdict.failure.replay
    else:
        assert not verdict.passed and verdict.failure.ending == verifier.DIED, verdict.summary()
        assert "SIG" in verdict.failure.message and verdict.failure.replay


def test_a_hang_is_a_failed_verdict_after_the_example_timeout(tmp_path):
    start = time.monotonic()
    verdict = _verify("crashing_kernels:hanging_softmax", tmp_path, checks=("matches_reference",),
                      example_timeout_s=3.0)
    assert not verdict.passed and verdict.failure.ending == verifier.HANG, verdict.summary()
    assert "hung" in verdict.failure.message and verdict.failure.case and verdict.failure.replay
    assert time.monotonic() - start < BUDGET_S


def test_the_budget_is_honoured(tmp_path):
    start = time.monotonic()
    verdict = _verify(CONTROL, tmp_path, budget_s=1.0)
    assert time.monotonic() - start < 1.0 + 10.0  # the child is killed at the budget; joining it takes little
    assert not verdict.passed and verdict.failure.ending == verifier.BUDGET, verdict.summary()


def test_a_fresh_seed_per_call_unless_fixed(tmp_path, monkeypatch):
    drawn = iter([11, 12])
    monkeypatch.setattr(verifier.secrets, "randbelow", lambda n: next(drawn))
    monkeypatch.setattr(verifier, "_supervise", lambda job, *a: ([], {}, None))
    seeds = [tritoncheck.verify("softmax", CONTROL, report_dir=tmp_path, quiet=True).seed for _ in range(2)]
    fixed = tritoncheck.verify("softmax", CONTROL, seed=7, report_dir=tmp_path, quiet=True).seed
    assert (seeds, fixed) == ([11, 12], 7)


def test_a_function_no_child_can_import_is_a_type_error():
    with pytest.raises(TypeError, match="lambda or a nested function"):
        tritoncheck.verify("softmax", lambda x, temperature=1.0: x, quiet=True)


def test_an_implementation_that_does_not_load_is_a_failed_verdict_with_its_error(tmp_path):
    verdict = _verify("tritoncheck.controls.softmax:no_such_function", tmp_path)
    assert not verdict.passed and verdict.failure.ending == verifier.ERROR, verdict.summary()
    assert "no_such_function" in verdict.failure.message and verdict.checks_run == ()


DRAFT = '''
import torch


def drafted_softmax(x, temperature=1.0):
    return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)


drafted_softmax.uses_triton = False
'''


def _draft(filename: str, namespace: dict | None = None):
    namespace = {"__name__": "__main__"} if namespace is None else namespace
    exec(compile(DRAFT, filename, "exec"), namespace)
    return namespace["drafted_softmax"]


def test_a_function_from_exec_d_source_is_verified_from_the_source_given(tmp_path):
    """A kernel-generation loop holds its draft as a string and execs it: the function has
    no module; its source is passed and written to a module the child imports."""
    fn = _draft("<string>", {})
    with pytest.raises(TypeError, match=r"source=code"):
        tritoncheck.verify("softmax", fn, quiet=True, report_dir=tmp_path / "refused")
    verdict = _verify(fn, tmp_path, source=DRAFT, checks=("matches_reference",))
    assert verdict.passed and verdict.checks_run == ("float32/matches_reference",), verdict.summary()
    assert verdict.implementation == "drafted_softmax"


def test_a_function_typed_into_a_repl_or_read_from_stdin_is_refused_at_the_call(tmp_path, monkeypatch):
    """issue 36: defined in a script read from stdin, the function was sent by reference to
    a child that could not run '<stdin>' again and died outside any example. Now: a
    TypeError at the call saying what to pass; with its source it runs (the child no longer
    tries to open '<stdin>')."""
    import sys
    fn = _draft("<stdin>")
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__file__", "<stdin>", raising=False)  # an xdist worker's __main__ has none
    monkeypatch.setattr(main, "drafted_softmax", fn, raising=False)
    with pytest.raises(TypeError, match=r"<stdin> .*source=code"):
        tritoncheck.verify("softmax", fn, quiet=True, report_dir=tmp_path / "refused")
    verdict = _verify(fn, tmp_path, source=DRAFT, checks=("matches_reference",))
    assert verdict.passed, verdict.summary()


CELL_HELPERS = '''
import torch
SCALE = 1.0


def _shifted(x):
    return x - x.amax(dim=-1, keepdim=True)
'''
CELL_KERNEL = '''
def notebook_softmax(x, temperature=1.0):
    e = torch.exp(_shifted(x.float() / temperature) * SCALE)
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


notebook_softmax.uses_triton = False
raise RuntimeError("the rest of this cell (a training loop) must not run in the verifier's child")
'''


def test_a_function_from_a_notebook_cell_is_rebuilt_from_the_cells_linecache_keeps(tmp_path):
    """IPython keeps every cell's source in linecache under a pseudo-file name: the
    function, the helper and constants it uses from another cell, and its declarations are
    sliced from there into a module; the rest of the cells (here a statement that raises)
    is not."""
    import linecache
    namespace = {"__name__": "__main__"}
    for i, cell in enumerate((CELL_HELPERS, CELL_KERNEL)):
        filename = f"/tmp/ipykernel_4242/{i}.py"
        linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)
        try:
            exec(compile(cell, filename, "exec"), namespace)
        except RuntimeError:
            pass
    fn = namespace["notebook_softmax"]
    verdict = _verify(fn, tmp_path, checks=("matches_reference",))
    assert verdict.passed and verdict.checks_run == ("float32/matches_reference",), verdict.summary()
    written = next(tmp_path.glob("tritoncheck_verify_notebook_softmax_*.py")).read_text()
    assert "def _shifted" in written and "SCALE = 1.0" in written and "notebook_softmax.uses_triton = False" in written
    assert "RuntimeError" not in written
