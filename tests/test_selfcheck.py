"""The suite against planted bugs and correct controls (tritoncheck/selfcheck.py).

Every mutant must fail every check it claims to be killed by; every control must
pass every check in every dtype, except the checks its ``expected_failures`` names
with a reason (reported as xfail when the hunt does hit them). The kill rate is printed at the end of the run.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tritoncheck import backend, registry, selfcheck

MUTANTS = selfcheck.mutants()
CONTROLS = selfcheck.controls()
OPS = registry.load()
SMOKE_MUTANT = ("softmax", "padded_lanes_zero")  # the planted bug docs/reports.md shows failing


def _kill_tier(mutant, check) -> list:
    """Every commit hunts each op's first planted bug (by name) with the first check it claims,
    a representative subset whose kill rate .ci/run prints; the other kills are ``slow``
    (tests/conftest.py: the nightly CPU run and the GPU run hunt them all)."""
    if (mutant.op, mutant.name) == SMOKE_MUTANT:
        return [pytest.mark.smoke]
    first = next(m for m in MUTANTS if m.op == mutant.op)
    return [] if mutant is first and check == mutant.kills[0] else [pytest.mark.slow]


def _control_tier(control, dtype, check) -> list:
    """Every check of a control runs on every commit in one dtype, the dtypes taken in turn
    along the op's checks as for the project's kernels (tests/conftest.py); the others are ``slow``."""
    op = OPS[control.op]
    return [] if op.dtypes[op.checks.index(check) % len(op.dtypes)] == dtype else [pytest.mark.slow]


@pytest.mark.tritoncheck_mutant
@pytest.mark.parametrize("mutant,check", [
    pytest.param(m, c, id=f"{m.op}.{m.name}-{c}", marks=_kill_tier(m, c)) for m in MUTANTS for c in m.kills])
def test_mutant_killed(mutant, check):
    absent = mutant.absent_on(backend.current()) or selfcheck.not_runnable_here(mutant, check)
    if absent:
        pytest.skip(absent)
    verdict = selfcheck.kill(mutant, check)
    assert verdict.killed, f"mutant {mutant.op}.{mutant.name} ({mutant.bug}) {verdict.describe()}: {verdict.text}"
    print(f"\n{mutant.op}.{mutant.name} killed by {check} in {verdict.dtype} ({verdict.exception}):\n{verdict.text}")


@pytest.mark.parametrize("control,dtype,check", [
    pytest.param(c, d, k, id=f"{c.op}.{c.name}-{str(d).replace('torch.', '')}-{k.name}", marks=_control_tier(c, d, k))
    for c in CONTROLS for d in OPS[c.op].dtypes for k in OPS[c.op].checks])
def test_control_passes(control, dtype, check):
    op = OPS[control.op]
    reason = selfcheck.runnable(op, control, check, dtype)
    if reason:
        pytest.skip(reason)
    verdict = selfcheck.hunt(op, control, check, dtype, selfcheck.CONTROL_EXAMPLES)
    expected = control.expected_failure(check.name, dtype)
    if expected and verdict.failed:
        pytest.xfail(f"expected failure (registry data): {expected.reason}")
    assert not verdict.failed, f"control {control.name} fails {check.name}: {verdict.text}"


def _matmul_verdict() -> selfcheck.Verdict:
    a = torch.ones(512, 512, dtype=torch.float64)
    return selfcheck.Verdict(False, None, str(float((a @ a).sum())))


@pytest.mark.skipif(backend.current() == "cuda", reason="a forked child's hazard: on CUDA children are spawned")
def test_isolated_child_runs_torch_after_the_parent_used_its_thread_pool(monkeypatch):
    # the CI hang this guards against: a forked child waiting forever on OpenMP's futex
    monkeypatch.setattr(selfcheck, "ISOLATED_TIMEOUT_S", 30)
    torch.set_num_threads(2)
    a = torch.ones(512, 512, dtype=torch.float64)
    assert float((a @ a).sum()) == 512.0**3
    verdict = selfcheck.isolated(_matmul_verdict)
    assert (verdict.failed, verdict.text) == (False, str(512.0**3))


@pytest.mark.skipif(backend.current() == "cuda",
                    reason="same timeout code on both backends; a spawned child takes longer than 1 s to start")
def test_isolated_turns_a_hang_into_a_failed_verdict(monkeypatch):
    monkeypatch.setattr(selfcheck, "ISOLATED_TIMEOUT_S", 1)
    verdict = selfcheck.isolated(time.sleep, 60)
    assert verdict.failed and "hung" in verdict.text
    assert verdict.ending == selfcheck.HANG and not verdict.killed


def test_isolated_turns_a_crash_into_a_failed_verdict_naming_the_signal():
    verdict = selfcheck.isolated(signal.raise_signal, signal.SIGSEGV)
    assert verdict.failed and "SIGSEGV" in verdict.text
    assert verdict.ending == selfcheck.DIED and not verdict.killed


def test_a_crash_verdict_names_its_case():
    crashed = []

    def crashes_on_a_long_row(x, temperature=1.0):
        if x.numel() > 8:
            crashed.append(list(x.shape))
            raise RuntimeError("boom")
        return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)

    op = OPS["softmax"]
    impl = registry.Implementation.of("softmax", crashes_on_a_long_row, kind="user")
    check = next(c for c in op.checks if c.name == "rows_sum_to_one")
    verdict = selfcheck.hunt(op, impl, check, torch.float32, 20)
    assert verdict.failed and verdict.text.startswith("RuntimeError: boom\non:\nsoftmax(x, temperature) in float32")
    assert f"x: shape {crashed[0]} float32" in verdict.text, verdict.text
    assert (verdict.ending, verdict.exception, verdict.killed) == (selfcheck.CRASH, "RuntimeError", False)


def test_a_check_failure_is_a_kill_and_names_its_exception():
    from tritoncheck.mutants.softmax import padded_lanes_zero
    verdict = selfcheck.kill(padded_lanes_zero, "rows_sum_to_one")
    assert verdict.killed and (verdict.ending, verdict.exception) == (selfcheck.ASSERTION, "AssertionError"), \
        verdict.text


@pytest.mark.parametrize("name,exception", [("wrapper_index_error", "IndexError"), ("wrapper_assert", "AssertionError")])
def test_a_mutant_that_merely_crashes_is_not_killed(name, exception):
    """Every call of these mutants raises before any check compares anything (an
    IndexError; an assert in the wrapper, an AssertionError that is not the check's): the
    old self-test counted either as a kill by the check it names."""
    import crashing_mutants
    verdict = selfcheck.kill(getattr(crashing_mutants, name), "rows_sum_to_one")
    assert verdict.failed and not verdict.killed, verdict.text
    assert (verdict.ending, verdict.exception) == (selfcheck.CRASH, exception), verdict
    assert verdict.text.startswith("survived rows_sum_to_one in ['float32', 'float16', 'bfloat16']"), verdict.text
    assert f"crashed ({exception}) in float32, which is no kill" in verdict.text, verdict.text


def test_an_invalid_allowance_is_a_suite_bug_not_a_kill():
    from tritoncheck.oracle import assert_close

    def nan_allowance(case, impl):
        assert_close("y", torch.ones(2), np.ones(2), np.array([0.1, np.nan]), rule="a broken rule")

    op = OPS["softmax"]
    impl = registry.Implementation.of("softmax", lambda x, temperature=1.0: x, kind="user")
    verdict = selfcheck.hunt(op, impl, registry.Check("broken", nan_allowance), torch.float32, 5)
    assert verdict.failed and verdict.suite_bug and "a broken rule" in verdict.text and not verdict.killed


@triton.jit
def _read_far_outside(x_ptr):
    # 2**40 elements past a one-element tensor: an illegal address, a sticky CUDA error
    tl.store(x_ptr, tl.load(x_ptr + (1 << 40)))


def _break_the_cuda_context() -> selfcheck.Verdict:
    x = torch.zeros(1, device="cuda")
    _read_far_outside[(1,)](x)
    torch.cuda.synchronize()
    return selfcheck.Verdict(False, None, "the wild read went unnoticed")


needs_cuda = pytest.mark.skipif(backend.current() != "cuda", reason="a CUDA context to break")


@needs_cuda
def test_isolated_keeps_a_broken_cuda_context_out_of_this_process():
    # in-process, one crash (torch's SDPA on a misaligned input) broke the context and
    # 53 later GPU self-tests in the same xdist workers failed with its "misaligned address"
    verdict = selfcheck.isolated(_break_the_cuda_context)
    assert verdict.failed and "CUDA error" in verdict.text, verdict.text
    assert torch.ones(3, device="cuda").sum().item() == 3.0


@needs_cuda
def test_one_resident_child_serves_the_hunts_until_a_job_breaks_its_cuda_context():
    first, second = selfcheck.isolated(os.getpid), selfcheck.isolated(os.getpid)
    assert first == second != os.getpid()  # no spawn, import and CUDA start per hunt
    assert selfcheck.isolated(_break_the_cuda_context).failed
    assert selfcheck.isolated(os.getpid) not in (first, os.getpid())  # a fresh child after the broken one


@needs_cuda
def test_tests_after_a_broken_cuda_context_name_the_test_that_broke_it(tmp_path):
    (tmp_path / "test_breaks.py").write_text(textwrap.dedent('''
        import torch
        from test_selfcheck import _break_the_cuda_context

        def test_breaks():
            _break_the_cuda_context()

        def test_after():
            assert torch.ones(1, device="cuda").item() == 1.0
    '''))
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tritoncheck.plugin", "-p", "no:randomly", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "--report-dir", str(tmp_path / "r"), str(tmp_path / "test_breaks.py")],
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env={**os.environ, "PYTHONPATH": f"{root}:{root / 'tests'}"})
    out = done.stdout
    assert "1 failed" in out and "1 error" in out, out[-3000:]
    assert "not run: the CUDA context of this process was broken by" in out and "test_breaks" in out, out[-3000:]
