"""Planted bugs in ``tritoncheck.kernels.context_parallel`` (ring attention over ranks): each is the project's
implementation with one source patch. The self-test (tests/test_context_parallel.py) runs
each on 2 gloo ranks on CPU (NCCL ranks on GPUs) and asserts that the checks in ``kills``
fail on it.

With 2 ranks a ring passes each chunk one step, rank 0 -> 1 and 1 -> 0: sending the
chunks the other way round gives the same schedule, so ring-direction bugs need 3 ranks;
the mutants below are ones that 2 ranks expose.
"""
from __future__ import annotations

import tritoncheck.kernels.context_parallel as _ring
from tritoncheck.mutation import mutant

# The schedule is one step ahead of the data: at step t the rank holds the chunk of rank
# r - t but masks and merges it as the chunk of rank r - t - 1. Non-causal every block is
# whole, so order does not matter and nothing changes; causal, rank 0 skips its own
# diagonal block (taken for rank W - 1's, all in its future) and later runs the causal
# diagonal call on another rank's keys, and rank r > 0 scores its own chunk as a whole
# earlier block (future keys visible).
blocks_merged_in_wrong_order = mutant(
    "cp_attention", _ring,
    [("source = (rank - step) % world  # whose chunk this rank holds at this step",
      "source = (rank - step - 1) % world  # whose chunk this rank holds at this step")],
    name="blocks_merged_in_wrong_order",
    bug="Each rank masks and merges the k/v chunks in the wrong order: the block it holds "
        "at ring step t is taken for the chunk of rank r - t - 1 instead of r - t (a "
        "communication schedule out of step with the compute loop, e.g. receiving before "
        "computing). Triggers with causal=True on any split: rank 0 drops its diagonal "
        "block, rank 1 sees its future keys. Harmless without causal masking.",
    attr="cp_attention",
    kills=("matches_reference", "causal_rows_unchanged"),
)

# The merge forgets to rescale the accumulator by e^{lse_acc - lse_new} when a new block
# comes in: the old blocks keep their full weight while the new one gets its share. Not
# killed by causal_rows_unchanged: each row still reads only the keys it may see.
merge_accumulator_not_rescaled = mutant(
    "cp_attention", _ring,
    [("o_acc = o_acc * torch.exp(lse_acc - lse_new)[..., None] \\",
      "o_acc = o_acc \\")],
    name="merge_accumulator_not_rescaled",
    bug="The log-sum-exp merge of a new block does not rescale the accumulated output "
        "by e^{lse_acc - lse_new} (the ring-attention analogue of FlashAttention's "
        "missing alpha). Triggers whenever a row merges two blocks with weight: "
        "causal=False on any split, or causal rows of rank 1 and up; lse stays right, "
        "o is too large.",
    attr="cp_attention",
    kills=("matches_reference",),
)

# Positions counted from the start of each chunk instead of the start of the sequence:
# every pair of chunks looks like the diagonal block, so with causal masking each earlier
# rank's keys are masked as if they were the rank's own (half of them hidden) and each
# later rank's keys are half visible. With chunks of different lengths the "diagonal" is
# not square and the implementation refuses (ValueError), a failure too.
causal_mask_local_positions = mutant(
    "cp_attention", _ring,
    [("q_start, k_start = starts[rank], starts[source]", "q_start, k_start = 0, 0")],
    name="causal_mask_local_positions",
    bug="The causal mask compares positions within each rank's chunk, not global "
        "positions: query i of rank r and key j of rank s are compared as i and j. "
        "Triggers with causal=True on 2 or more ranks: earlier ranks' keys are partly "
        "masked, later ranks' keys partly visible.",
    attr="cp_attention",
    kills=("matches_reference", "causal_rows_unchanged"),
)

MUTANTS = (blocks_merged_in_wrong_order, merge_accumulator_not_rescaled, causal_mask_local_positions)
