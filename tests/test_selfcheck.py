"""The suite against planted bugs and correct controls (properties/selfcheck.py).

Every mutant must fail every check it claims to be killed by; every control must
pass every check in every dtype, except the checks its ``expected_failures`` names
with a reason (reported as xfail when the hunt does hit them). The kill rate is printed at the end of the run.
"""
import time

import pytest
import torch

from properties import backend, registry, selfcheck

MUTANTS = selfcheck.mutants()
CONTROLS = selfcheck.controls()
OPS = registry.load()


@pytest.mark.parametrize("mutant,check", [
    pytest.param(m, c, id=f"{m.op}.{m.name}-{c}") for m in MUTANTS for c in m.kills])
def test_mutant_killed(mutant, check):
    verdict = selfcheck.kill(mutant, check)
    assert verdict.failed, f"mutant {mutant.op}.{mutant.name} ({mutant.bug}) {verdict.text}"
    print(f"\n{mutant.op}.{mutant.name} killed by {check} in {verdict.dtype}:\n{verdict.text}")


@pytest.mark.parametrize("control,dtype,check", [
    pytest.param(c, d, k, id=f"{c.op}.{c.name}-{str(d).replace('torch.', '')}-{k.name}")
    for c in CONTROLS for d in OPS[c.op].dtypes for k in OPS[c.op].checks])
def test_control_passes(control, dtype, check):
    op = OPS[control.op]
    reason = selfcheck.runnable(op, control, check, dtype)
    if reason:
        pytest.skip(reason)
    verdict = selfcheck.hunt(op, control, check, dtype, selfcheck.CONTROL_EXAMPLES)
    expected = control.expected_failures.get(check.name)
    if expected and verdict.failed:
        pytest.xfail(f"expected failure (registry data): {expected}")
    assert not verdict.failed, f"control {control.name} fails {check.name}: {verdict.text}"


def _matmul_verdict() -> selfcheck.Verdict:
    a = torch.ones(512, 512, dtype=torch.float64)
    return selfcheck.Verdict(False, None, str(float((a @ a).sum())))


@pytest.mark.skipif(backend.current() == "cuda", reason="hunts run in-process on CUDA (no fork)")
def test_isolated_child_runs_torch_after_the_parent_used_its_thread_pool(monkeypatch):
    # the CI hang this guards against: a forked child waiting forever on OpenMP's futex
    monkeypatch.setattr(selfcheck, "ISOLATED_TIMEOUT_S", 30)
    torch.set_num_threads(2)
    a = torch.ones(512, 512, dtype=torch.float64)
    assert float((a @ a).sum()) == 512.0**3
    verdict = selfcheck.isolated(_matmul_verdict)
    assert (verdict.failed, verdict.text) == (False, str(512.0**3))


@pytest.mark.skipif(backend.current() == "cuda", reason="hunts run in-process on CUDA (no fork)")
def test_isolated_turns_a_hang_into_a_failed_verdict(monkeypatch):
    monkeypatch.setattr(selfcheck, "ISOLATED_TIMEOUT_S", 1)
    verdict = selfcheck.isolated(time.sleep, 60)
    assert verdict.failed and "hung" in verdict.text
