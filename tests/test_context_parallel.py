"""Context-parallel attention across ranks (properties/context_parallel.py): the implementation
under test (the project's ring attention, or ``--impl cp_attention=module:function``) against
the fp64 reference on W spawned ranks (gloo on CPU, NCCL on GPUs; ``--cp-world-size``,
default 2), the planted bugs killed, the plain PyTorch control passing.
"""
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from tritoncheck import backend, rank_pool
from tritoncheck.kernels import context_parallel as ring
from tritoncheck.mutants import context_parallel as cp_mutants
from tritoncheck.properties import context_parallel as cp
from tritoncheck.properties.context_parallel import SETTINGS

DTYPES = [pytest.param(d, id=str(d).replace("torch.", "")) for d in cp.DTYPES]


def _skip_if_not_runnable(target, dtype):
    reason = cp.skip_reason(target, dtype)
    if reason:
        pytest.skip(reason)


@pytest.mark.tritoncheck_cp_check
@pytest.mark.parametrize("impl", [pytest.param(t, id=n) for n, t in cp.implementations()])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("check", sorted(cp.CHECKS))
def test_cp_check(impl, dtype, check):
    """The check on the run's examples (the Hypothesis profile's count), recorded in the
    tolerance report; then the suite's vacuity policy on what was recorded."""
    _skip_if_not_runnable(impl, dtype)
    report_as = cp.report_target(impl, dtype, check)

    @given(data=st.data())
    def examples(data):
        run, fixed = cp.CHECKS[check]
        case = data.draw(cp.cp_cases(dtype, SETTINGS.world_size, **fixed), label="case")
        try:
            with cp.reported(report_as, case):
                run(case, impl, SETTINGS.world_size)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n\n{check} failed for {impl} on {SETTINGS.world_size} ranks on:\n"
                                 f"{case.describe()}") from None

    examples()
    problem = cp.vacuity_failure(report_as)
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.mark.tritoncheck_mutant  # counted in the run's kill rate and time to kill
@pytest.mark.parametrize("mutant,check", [pytest.param(m, c, id=f"{cp.OP}.{m.name}-{c}")
                                          for m in cp_mutants.MUTANTS for c in m.kills])
def test_mutant_killed(mutant, check):
    """Killed by the numbers, hunted on chunks of equal length: with chunks of different
    lengths two of the mutants run a causal diagonal call on a block that is not square,
    which the project kernel refuses; that fails the check too, but not through the bug's
    own effect (on the drawn splits those two die of the refusal within a few examples)."""
    if SETTINGS.world_size < 2:
        pytest.skip("--cp-world-size 1: one rank has one block, nothing to merge or order; the mutants "
                    "compute what the implementation does")
    tried, reasons = [], []
    for dtype in cp.DTYPES:
        reason = cp.skip_reason(mutant.target, dtype)
        if reason:
            reasons.append(reason)
            continue
        tried.append(dtype)
        failure = cp.hunt(mutant.target, check, dtype, cp.HUNT_EXAMPLES, SETTINGS.world_size, equal_only=True)
        if failure is not None:
            print(f"\n{mutant.name} killed by {check} in {dtype}:\n{failure}")
            assert failure.startswith("AssertionError: "), failure  # wrong outputs, not a rank's error
            return
    if not tried:  # one GPU: NCCL ranks need a GPU each (a failure here said "survived in []")
        pytest.skip(f"no dtype runnable here: {'; '.join(sorted(set(reasons)))}")
    pytest.fail(f"mutant {mutant.name} ({mutant.bug}) survived {check} in {tried}")


@pytest.mark.parametrize("control", cp.CONTROLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("check", sorted(cp.CHECKS))
def test_cp_control_passes(control, dtype, check):
    _skip_if_not_runnable(control, dtype)
    failure = cp.hunt(control, check, dtype, cp.CONTROL_EXAMPLES, SETTINGS.world_size)
    assert failure is None, f"control {control} fails {check}: {failure}"


@pytest.mark.parametrize("n, world, chunks", [(7, 2, (4, 3)), (8, 2, (4, 4)), (3, 3, (1, 1, 1)), (10, 4, (3, 3, 2, 2))])
def test_even_chunks_differ_by_at_most_one_row(n, world, chunks):
    assert cp.even_chunks(n, world) == chunks


@given(data=st.data())
def test_drawn_splits_give_every_rank_a_contiguous_chunk(data):
    world = data.draw(st.integers(1, 4))
    case = data.draw(cp.cp_cases(torch.float32, world))
    chunks = case.params["chunks"]
    assert len(chunks) == world and min(chunks) >= 1 and sum(chunks) == case.tensors["q"].shape[2]
    assert case.tensors["q"].shape[2] == case.tensors["k"].shape[2]


@pytest.mark.parametrize("q_start, n_q, k_start, n_k, seen", [
    (5, 3, 0, 5, ring.ALL), (5, 3, 0, 6, ring.ALL), (5, 3, 4, 3, None), (5, 3, 8, 2, ring.NONE),
    (5, 3, 5, 3, ring.DIAGONAL), (0, 1, 0, 1, ring.ALL), (4, 4, 0, 4, ring.ALL), (0, 4, 4, 4, ring.NONE),
])
def test_block_visibility_by_global_position(q_start, n_q, k_start, n_k, seen):
    if seen is None:  # keys straddle the queries off the diagonal: chunks not in rank order
        with pytest.raises(ValueError, match="q_local"):
            ring._visibility(q_start, n_q, k_start, n_k)
    else:
        assert ring._visibility(q_start, n_q, k_start, n_k) == seen


@pytest.mark.parametrize("args, kwargs, error, name", [
    (("q", torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4)), {}, TypeError, "q_local"),
    ((torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)), {}, ValueError, "q_local"),
    ((torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 2, 4)), {}, ValueError, "k_local"),
    ((torch.zeros(1, 1, 2, 4),) * 3, {"causal": 1}, TypeError, "causal"),
    ((torch.zeros(1, 1, 2, 4),) * 3, {}, ValueError, "group"),
])
def test_bad_input_names_the_argument(args, kwargs, error, name):
    assert not dist.is_initialized()  # the checks run on spawned ranks, never in the pytest process
    with pytest.raises(error, match=name):
        ring.cp_attention(*args, **kwargs)


@pytest.mark.skipif(backend.current() == "cuda" and torch.cuda.device_count() < 2,
                    reason="cuda: 2 NCCL ranks need 2 GPUs")
def test_rank_pool_reports_a_failed_rank_and_starts_afresh():
    pool = rank_pool.RankPool(2, backend.current())
    args = [((torch.full((2,), float(r)),), {}) for r in range(2)]
    try:
        with pytest.raises(rank_pool.RankFailure, match="rank 1 of 2 raised RuntimeError: planted failure on rank 1"):
            pool.call("tests.rank_helpers:raises_on_rank_1", args)
        assert not pool.started  # torn down: the group's state after a failure is unknown
        outs = pool.call("tests.rank_helpers:summed_over_ranks", args)
        assert [out[0].tolist() for out in outs] == [[1.0, 1.0], [1.0, 1.0]]
        with pytest.raises(rank_pool.RankFailure, match=r"rank\(s\) \[0\] of 2 did not answer in 2 s"):
            pool.call("tests.rank_helpers:hangs_on_rank_0", args, timeout=2)
        assert not pool.started
    finally:
        pool.close()

