"""calls_independent names state kept across calls only where a call shows it (issue 36):
a second call that is wrong because its inputs hit an input-dependent bug is a plain wrong
answer on those inputs; a cache keyed by shape, or a launch skipped on a seen shape, is state.
In process, on softmax cases built here, on the backend of this run."""
from __future__ import annotations

import pytest
import torch

from tritoncheck import registry
from tritoncheck.generic import _new_values, calls_independent
from tritoncheck.mutants import cheats
from tritoncheck.poisoning import poisoned_allocations_for
from tritoncheck.registry import Implementation
from tritoncheck.strategies import Case, TensorSpec


def _case(seed: int) -> Case:
    x = TensorSpec(shape=(3, 20), dtype="float32", seed=seed)
    return Case("softmax", "float32", ("x", "temperature"), {"x": x}, {"temperature": 1.0})


def _first_sum(case: Case) -> float:
    return float(case.tensors["x"].materialise("cpu")[0, 0])


def wrong_on_a_positive_first_element(x, temperature=1.0):
    """An input-dependent bug, no state: the first row is left unnormalised when x[0, 0] > 0."""
    y = torch.softmax(x.float() / temperature, dim=-1)
    if float(x.reshape(-1)[0]) > 0:
        y[..., 0, :] *= 2
    return y.to(x.dtype)


@pytest.fixture(scope="module", autouse=True)
def _ops():
    registry.load()


def _seed_where(first_ok: bool, second_ok: bool) -> Case:
    """A case whose first inputs are (not) hit by the bug, and its seed + 1 twin (not)."""
    for seed in range(200):
        case = _case(seed)
        if (_first_sum(case) <= 0) == first_ok and (_first_sum(_new_values(case)) <= 0) == second_ok:
            return case
    raise AssertionError("no such seed in 200")


def test_an_input_dependent_bug_on_the_second_inputs_is_not_called_state():
    impl = Implementation.of("softmax", wrong_on_a_positive_first_element)
    with pytest.raises(AssertionError) as found:
        calls_independent(_seed_where(first_ok=True, second_ok=False), impl)
    text = str(found.value)
    # both readings named, neither asserted: a fresh call cannot tell a shape-keyed cache from a plain bug
    assert "on fresh buffers as well: either" in text and "matches_reference on them" in text, text
    assert "the implementation keeps state across calls:" not in text and "seed + 1" in text


@pytest.mark.parametrize("cheat", ["shape_keyed_cache", "stale_memory"])
def test_state_kept_across_calls_is_named_as_such(cheat):
    impl = Implementation.of("softmax", getattr(cheats, cheat).fn, kind="mutant")
    with poisoned_allocations_for(impl.fn), pytest.raises(AssertionError) as found:  # as in a run: fresh memory NaN
        calls_independent(_case(1000 + len(cheat)), impl)
    assert "the implementation keeps state across calls" in str(found.value), str(found.value)


def test_a_correct_softmax_passes():
    from tritoncheck.controls.softmax import torch_softmax_fp32
    calls_independent(_case(7), Implementation.of("softmax", torch_softmax_fp32))
