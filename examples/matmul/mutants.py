"""Planted bugs in kernels.py: each a one-snippet source patch (tritoncheck.mutation.mutant),
with the real bug it models and the checks that must catch it.

``int32_row_offsets`` is caught only by the large-index check (inputs past 2**31 elements,
on a GPU: ``python -m pytest tests/test_large_index.py -m large``); the others by the
generic checks on CPU and GPU alike.
"""
import tritoncheck.mutation as mutation
from matmul import (
    kernels,
    ops,  # noqa: F401 - registers the op the mutants belong to
)

k_tail_dropped = mutation.mutant(
    "matmul", kernels,
    [("for kb in range(pid_k, tl.cdiv(K, BLOCK_K), SPLIT_K):", "for kb in range(pid_k, K // BLOCK_K, SPLIT_K):")],
    name="k_tail_dropped", attr="matmul",
    bug="The K loop runs K // BLOCK_K times instead of cdiv(K, BLOCK_K): the last K % BLOCK_K columns of a "
        "and rows of b are never summed (for K < BLOCK_K nothing is). Right whenever K is a multiple of "
        "BLOCK_K (32), as in most benchmarks.",
    kills=("matches_reference",),
)

fp16_accumulator = mutation.mutant(
    "matmul", kernels,
    [("acc += tl.dot(a, b)", "acc = (acc + tl.dot(a, b)).to(tl.float16).to(tl.float32)")],
    name="fp16_accumulator", attr="matmul",
    bug="The running sum is held in fp16 between K blocks (an accumulator declared in the input dtype): "
        "each of the K / BLOCK_K additions rounds to fp16, so a long K errs by about sqrt(K / 32) u(fp16) "
        "|c| where an fp32 sum errs by u(fp16) |c|; fp32 and bf16 inputs lose range and digits at once.",
    kills=("matches_reference",),
)

split_lost = mutation.mutant(
    "matmul", kernels,
    [("for _split in range(0, SPLIT_K):", "for _split in range(0, SPLIT_K - 1):")],
    name="split_lost", attr="matmul_split_k",
    bug="The split-K reduction stops one split short: the last split's partial sum (K blocks SPLIT_K - 1, "
        "2 SPLIT_K - 1, ...) never reaches c. With one split (K <= BLOCK_K) c is all zeros.",
    kills=("matches_reference",),
)

int32_row_offsets = mutation.mutant(
    "matmul", kernels,
    [("    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)\n",
      "    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\n")],
    name="int32_row_offsets", attr="matmul",
    bug="Row offsets in int32 (the Triton tutorial's pid_m * BLOCK_M + arange without a cast): m * stride_am "
        "wraps once a passes 2**31 elements (a [2**27, 16]), so rows past it read and write elsewhere. "
        "Invisible below 2**31 elements: only the large-index check (GPU) reaches it.",
    kills=("large_index",),
)
