"""Planted bugs in the RMSNorm family (patches of ``kernels/rms_norm.py``).

Each mutant is one exact source patch of the project kernel; see ``tritoncheck/mutation.py``.
Triggers are for the kernel's caps: ``BLOCK_N`` at most 64 under the interpreter and
4096 on a GPU; the backward's row groups at most 4 under the interpreter, 256 on a GPU.
"""
from __future__ import annotations

from tritoncheck.kernels import rms_norm as _k
from tritoncheck.mutation import mutant

_NO_EPS = [("rstd = 1.0 / tl.sqrt(ms + eps)\n", "rstd = 1.0 / tl.sqrt(ms)\n")]
_N_MINUS_1 = [("ms = tl.sum(sq_acc, axis=0) / N\n", "ms = tl.sum(sq_acc, axis=0) / (N - 1)\n")]
_FIRST_GROUP = [("    for g in range(0, G):\n", "    for g in range(0, 1):\n")]
_CAST_BEFORE_WEIGHT = [("        y = h * rstd * w\n",
                        "        y = (h * rstd).to(Y.dtype.element_ty).to(tl.float32) * w\n")]
_EPS_OUTSIDE = [("rstd = 1.0 / tl.sqrt(ms + eps)\n", "rstd = 1.0 / (tl.sqrt(ms) + eps)\n")]
_WEIGHT_AT_BLOCK_OFFSET = [("        w = tl.load(W + cols * stride_w, mask=mask, other=0.0).to(tl.float32)\n"
                            "        y = h * rstd * w\n",
                            "        w = tl.load(W + offs * stride_w, mask=mask, other=0.0).to(tl.float32)\n"
                            "        y = h * rstd * w\n")]
# 16: the smallest column block (kernels/norms.py MIN_BLOCK_N)
_BATCH_DEPENDENT_BLOCK = [("        block_n = block_n_for(n, x2.device)\n        r = r2 if",
                           "        block_n = block_n_for(n, x2.device) if m >= 4 else 16\n        r = r2 if")]

# ----------------------------------------------------------------- rms_norm

rstd_without_eps = mutant(
    "rms_norm", _k, _NO_EPS, name="rstd_without_eps",
    bug=(
        "rstd = 1 / sqrt(mean(x^2)) without eps (eps forgotten, or applied only in a fallback). "
        "Invisible on rows of unit scale, wrong where mean(x^2) is comparable to eps and infinite "
        "(NaN y) on a zero row. Trigger: a row of small values, e.g. scale 1e-3 with eps = 1e-2, "
        "or the tiny family."
    ),
    kills=("matches_reference", "gradients_match_reference"),
)

mean_over_n_minus_1 = mutant(
    "rms_norm", _k, _N_MINUS_1, name="mean_over_n_minus_1",
    bug=(
        "The mean of squares divides by N - 1 (a variance's Bessel correction carried over), "
        "so rstd is sqrt((N - 1) / N) too small: 29 % at N = 2, infinite at N = 1. Trigger: "
        "short rows, e.g. N <= 8."
    ),
    kills=("matches_reference",),
)

dweight_first_group_only = mutant(
    "rms_norm", _k, _FIRST_GROUP, name="dweight_first_group_only",
    bug=(
        "The second reduction of the dweight partials stops after the first row group, so "
        "dweight sums only the first block of rows (dx is right). Trigger: more than one row "
        "group, i.e. M >= 2 rows (interpreter or GPU)."
    ),
    kills=("gradients_match_reference",),
)

cast_before_weight = mutant(
    "rms_norm", _k, _CAST_BEFORE_WEIGHT, name="cast_before_weight",
    bug=(
        "x * rstd is rounded to the input dtype before the weight multiply (Llama style) while "
        "the kernel declares rms_norm_cast = 'after_weight': a second rounding of y that the "
        "declared mode does not allow. Trigger: float16 or bfloat16, any row with weights != 1 "
        "(the two roundings often combine past half an ulp)."
    ),
    kills=("matches_reference",),
)

eps_outside_sqrt = mutant(
    "rms_norm", _k, _EPS_OUTSIDE, name="eps_outside_sqrt",
    bug=(
        "rstd = 1 / (sqrt(mean(x^2)) + eps) instead of 1 / sqrt(mean(x^2) + eps) (the 'norm + eps' "
        "placement of some implementations). Scaling x by c no longer scales the denominator by "
        "|c| when eps is scaled by c^2. Trigger: rows whose RMS is comparable to eps, e.g. scale "
        "1e-3 with eps = 1e-2."
    ),
    kills=("matches_reference", "scale_equivariant"),
)

weight_at_block_offset = mutant(
    "rms_norm", _k, _WEIGHT_AT_BLOCK_OFFSET, name="weight_at_block_offset",
    bug=(
        "The forward loads the weight at the block-local offsets (W + offs) instead of the "
        "column (W + cols): every column block past the first reuses the first block's weights "
        "(a multi-block loop written from a single-block kernel). Permuting the hidden dim moves "
        "columns between blocks, so the weight each column gets changes. Trigger: N past one "
        "block: N > 64 under the interpreter, N > 4096 on a GPU."
    ),
    kills=("matches_reference", "permutation_equivariant"),
)

batch_dependent_block = mutant(
    "rms_norm", _k, _BATCH_DEPENDENT_BLOCK, name="batch_dependent_block",
    bug=(
        "The forward picks the column block from the batch: the smallest block for fewer than 4 "
        "rows (to spread a small batch), the row's block otherwise. The sum of squares then "
        "accumulates in another order, and a row's y depends on how many rows came with it "
        "(the batch-variance that breaks deterministic inference). Trigger: N > 16 and one call "
        "with fewer than 4 rows, another with more."
    ),
    kills=("batch_invariant",),
)

# ----------------------------------------------------------------- add_rms_norm

add_residual_returned_in_fp32 = mutant(
    "add_rms_norm", _k,
    [("    h = torch.empty((m, n), dtype=x2.dtype, device=x2.device) if r2",
      "    h = torch.empty((m, n), dtype=torch.float32, device=x2.device) if r2")],
    name="add_residual_returned_in_fp32", attr="add_rms_norm",
    bug=(
        "h is returned in fp32 (a 'residual_in_fp32' path left on) instead of the input dtype: "
        "the next layer's residual add then runs on other values than the unfused model's. y is "
        "unchanged. Trigger: float16 or bfloat16 input."
    ),
    kills=("matches_reference", "residual_sum_exact"),
)

add_dresidual_missing_dh = mutant(
    "add_rms_norm", _k,
    [("            if HAS_DH:\n                dx += ", "            if False:\n                dx += ")],
    name="add_dresidual_missing_dh", attr="add_rms_norm",
    bug=(
        "The backward drops the gradient that reaches h directly (dh, from the next residual "
        "add): dx and dresidual carry only the gradient through y. Trigger: any nonzero dh."
    ),
    kills=("gradients_match_reference",),
)

add_batch_dependent_block = mutant(
    "add_rms_norm", _k, _BATCH_DEPENDENT_BLOCK, name="add_batch_dependent_block", attr="add_rms_norm",
    bug="As rms_norm's batch_dependent_block, in the fused residual add: y depends on the batch size.",
    kills=("batch_invariant",),
)

add_dweight_first_group_only = mutant(
    "add_rms_norm", _k, _FIRST_GROUP, name="add_dweight_first_group_only", attr="add_rms_norm",
    bug="As rms_norm's dweight_first_group_only: dweight sums the first row group only. Trigger: M >= 2.",
    kills=("gradients_match_reference",),
)

ALL = (
    rstd_without_eps, mean_over_n_minus_1, dweight_first_group_only, cast_before_weight, eps_outside_sqrt,
    weight_at_block_offset, batch_dependent_block, add_residual_returned_in_fp32, add_dresidual_missing_dh,
    add_batch_dependent_block, add_dweight_first_group_only,
)
