"""tritoncheck/poisoning.py: fresh allocations hold NaN while a check runs, and only then."""
import torch

from tritoncheck import backend
from tritoncheck.mutants.elementwise import last_row_block_unwritten
from tritoncheck.poisoning import poisoned_allocations

DEVICE = backend.device()


def test_fresh_allocations_are_nan_inside_and_the_global_state_is_restored_after():
    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    with poisoned_allocations():
        assert torch.isnan(torch.empty(5, device=DEVICE)).all()
        assert torch.isnan(torch.empty_like(torch.ones(3, dtype=torch.bfloat16, device=DEVICE))).all()
        assert (torch.empty(2, dtype=torch.int64, device=DEVICE) == torch.iinfo(torch.int64).max).all()
    assert (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory) == before


def test_an_unwritten_block_is_nan_every_time_even_after_a_correct_call_left_the_answer_behind():
    # 3 rows: never a multiple of a row block, so the mutant leaves the last block unwritten.
    x = torch.randn(1, 1, 3, 8, device=DEVICE)
    cos, sin = torch.randn(3, 4, device=DEVICE), torch.randn(3, 4, device=DEVICE)
    from tritoncheck.kernels.elementwise import rope
    for _ in range(3):
        right = rope(x, cos, sin)
        del right  # its block goes back to the allocator holding the right answer
        with poisoned_allocations():
            got = last_row_block_unwritten(x, cos, sin)
        assert torch.isnan(got[0, 0, -1]).all()
