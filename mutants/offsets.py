"""Planted 32-bit offset overflows, for the large-index check (tests/test_large_index.py,
GPU only) rather than the self-test: no fuzzed case is large enough to trigger them.
This module is not a family module, so the self-test does not hunt it."""
from __future__ import annotations

from tritoncheck.kernels import fused_moe as _fused_moe_kernel
from tritoncheck.kernels import gated_delta_rule as _gdr_kernel
from tritoncheck.kernels import linear_cross_entropy as _lce_kernel
from tritoncheck.kernels import losses as _kernel
from tritoncheck.kernels import scaled_mm as _scaled_mm_kernel
from tritoncheck.kernels import ssd_scan as _ssd_kernel
from tritoncheck.mutation import mutant

__all__ = ["row_offset_int32", "linear_cross_entropy_rows_int32", "scaled_mm_rows_int32", "gated_delta_rule_rows_int32",
           "fused_moe_pairs_int32", "ssd_scan_rows_int32"]

row_offset_int32 = mutant(
    "cross_entropy",
    _kernel,
    [("row = tl.program_id(0).to(tl.int64)\n    x_row = LOGITS + row * stride_lm\n    offs = tl.arange(0, BLOCK_V)\n\n"
      "    # Online logsumexp",
      "row = tl.program_id(0)\n    x_row = LOGITS + row * stride_lm\n    offs = tl.arange(0, BLOCK_V)\n\n"
      "    # Online logsumexp")],
    name="row_offset_int32",
    bug=(
        "The forward computes the row's offset row * stride in int32 (program_id without the "
        "cast to int64), which wraps once M * V passes 2**31 - 1: cross-entropy over batch x "
        "vocabulary (16k tokens x a 128k vocabulary) reads another row, or outside the tensor. "
        "Triggered only by logits past 2**31 elements."
    ),
    kills=("large_index",),  # not a registry check: tests/test_large_index.py must fail it
)

linear_cross_entropy_rows_int32 = mutant(
    "linear_cross_entropy",
    _lce_kernel,
    [("    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)\n    row_ok = rows < N\n"
      "    tgt = tl.load(TARGET + rows * stride_t, mask=row_ok, other=ignore_index)\n    m = ",
      "    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)\n    row_ok = rows < N\n"
      "    tgt = tl.load(TARGET + rows * stride_t, mask=row_ok, other=ignore_index)\n    m = ")],
    name="linear_cross_entropy_rows_int32",
    bug=(
        "The fused linear cross-entropy forward keeps its row indices in int32 (program_id "
        "without the cast to int64), so x's offset row * stride wraps once N * H passes "
        "2**31 - 1: the loss of every row past it is computed from another row's x. Triggered "
        "only by x past 2**31 elements."
    ),
    kills=("large_index",),
)

scaled_mm_rows_int32 = mutant(
    "scaled_mm",
    _scaled_mm_kernel,
    [("    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)\n",
      "    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n")],
    name="scaled_mm_rows_int32",
    bug=(
        "The GEMM keeps its row indices in int32 (program_id without the cast to int64), so a's offset "
        "row * stride and c's row * N wrap once M * K or M * N passes 2**31 - 1 (a 16k-token prefill against "
        "a 128k-vocabulary head): rows past it read another row of a and write over another row of c. "
        "Triggered only by a or c past 2**31 elements."
    ),
    kills=("large_index",),
)

gated_delta_rule_rows_int32 = mutant(
    "gated_delta_rule",
    _gdr_kernel,
    [("    row = tl.load(SEQ + n * 4)  # int64: row * stride passes 2**31 in a large batch",
      "    row = tl.load(SEQ + n * 4).to(tl.int32)")],
    name="gated_delta_rule_rows_int32",
    bug=(
        "The forward holds each sequence's batch row in int32, so the offset row * stride of q, k, "
        "v, g, beta and o wraps once B x T x H x K passes 2**31 - 1 (fla#1080's corruption): the "
        "rows past it read and write another row, or outside the tensor. Triggered only by "
        "inputs past 2**31 elements."
    ),
    kills=("large_index",),
)

fused_moe_pairs_int32 = mutant(
    "fused_moe",
    _fused_moe_kernel,
    [("    pairs = tl.load(SORTED_PAIRS + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)\n"
      "    row_ok = pairs < NUM_PAIRS\n    tokens = pairs // TOP_K\n",
      "    pairs = tl.load(SORTED_PAIRS + block * BLOCK_M + tl.arange(0, BLOCK_M))\n"
      "    row_ok = pairs < NUM_PAIRS\n    tokens = pairs // TOP_K\n")],
    name="fused_moe_pairs_int32",
    bug=(
        "The gate/up GEMM keeps its sorted (token, slot) pair numbers in int32 as loaded, so the intermediate's "
        "row offset pair * I (and x's token * stride) wraps once T k I (T H) passes 2**31 - 1: at every expert "
        "whose sorted rows start past it, the intermediate is written over another pair's row (megablocks' "
        "expert-offset overflow). Triggered only by T k I past 2**31 elements."
    ),
    kills=("large_index",),
)

ssd_scan_rows_int32 = mutant(
    "ssd_scan",
    _ssd_kernel,
    [("    row = tl.load(SEQ + n * 4)  # int64: row * stride passes 2**31 in a large batch",
      "    row = tl.load(SEQ + n * 4).to(tl.int32)")],
    name="ssd_scan_rows_int32",
    bug=(
        "The forward holds each sequence's batch row in int32, so the offset row * stride of x, dt, "
        "B, C, z and y wraps once B x T x H x P passes 2**31 - 1: the rows past it read and write "
        "another row, or outside the tensor. Triggered only by inputs past 2**31 elements."
    ),
    kills=("large_index",),
)
