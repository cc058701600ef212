"""Context-parallel attention's own parts: the split of a sequence over ranks, the ring's
block visibility, its wrapper's argument checks and the rank pool. Its checks run with
every op's (``cp_attention`` in tests/test_checks.py, on ``--cp-world-size`` ranks), its
planted bugs and control in the self-test (tests/test_selfcheck.py).
"""
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from tritoncheck import backend, rank_pool
from tritoncheck.kernels import context_parallel as ring
from tritoncheck.properties import context_parallel as cp


@pytest.mark.parametrize("n, world, chunks", [(7, 2, (4, 3)), (8, 2, (4, 4)), (3, 3, (1, 1, 1)), (10, 4, (3, 3, 2, 2))])
def test_even_chunks_differ_by_at_most_one_row(n, world, chunks):
    assert cp.even_chunks(n, world) == chunks


@given(data=st.data())
def test_drawn_splits_give_every_rank_a_contiguous_chunk(data):
    world = data.draw(st.integers(1, 4))
    case = data.draw(cp.cp_cases(torch.float32, world))
    chunks = case.params["chunks"]
    assert len(chunks) == world and min(chunks) >= 1 and sum(chunks) == case.tensors["q_local"].shape[2]
    assert case.tensors["q_local"].shape[2] == case.tensors["k_local"].shape[2]


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

