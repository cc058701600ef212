"""Planted bugs in the norms family (patches of ``kernels/norms.py``).

Each mutant is one exact source patch of the project kernel; see ``tritoncheck/mutation.py``.
Triggers below are for the block / group caps of ``tritoncheck.kernels.norms`` (``BLOCK_N`` is
capped at 64 under the interpreter and 4096 on a GPU; backward uses at most 4 row
groups under the interpreter and 256 on a GPU).
"""
from __future__ import annotations

from tritoncheck.kernels import norms as _k
from tritoncheck.mutation import mutant

# ----------------------------------------------------------------- layer_norm

one_pass_variance = mutant(
    "layer_norm", _k,
    [
        ("        xc = tl.where(mask, x - mean, 0.0)\n        dev_acc += xc\n        sq_acc += xc * xc\n",
         "        sq_acc += x * x\n"),
        ("    dev = tl.sum(dev_acc, axis=0) / N\n"
         "    var = tl.maximum(tl.sum(sq_acc, axis=0) / N - dev * dev, 0.0)\n"
         "    mean = mean + dev\n",
         "    var = tl.sum(sq_acc, axis=0) / N - mean * mean\n"),
    ],
    name="one_pass_variance",
    bug=(
        "Variance as E[x^2] - mean^2 in fp32 (the textbook one-pass formula) instead of the "
        "mean of squared deviations. Catastrophic cancellation: with mean 1e4 and std 1, "
        "x^2 ~ 1e8 carries an fp32 ulp of 8, so the variance is noise (even negative: NaN). "
        "Trigger: a row with a large common offset (|mean| >> std), e.g. mean 1e4, std 1; "
        "for constant rows, values whose fp32 mean is inexact, e.g. a row of 10000.1 "
        "with N = 37 or of 10000.3 with N = 3 (rstd blows up or is NaN)."
    ),
    kills=("matches_reference", "gradients_match_reference", "normalised_moments",
           "shift_scale_invariant", "constant_row_gives_bias"),
)

padded_lanes_in_variance = mutant(
    "layer_norm", _k,
    [("        xc = tl.where(mask, x - mean, 0.0)\n", "        xc = x - mean\n")],
    name="padded_lanes_in_variance",
    bug=(
        "Masked lanes of the last column block load 0 and are not re-masked after "
        "subtracting the mean, so each padded lane adds mean^2 to the variance sum (the "
        "classic 'other=0 is the identity of the sum, but not of x - mean' slip); the "
        "padded lanes also enter the mean refinement sum(x - mean), shifting the mean. "
        "Trigger: N not a multiple of BLOCK_N (N not a power of two for N <= the cap) "
        "and a row mean far from 0 (e.g. x ~ N(3, 2) or a constant row of 1.0, N = 37)."
    ),
    kills=("matches_reference", "gradients_match_reference", "normalised_moments",
           "shift_scale_invariant", "constant_row_gives_bias"),
)

eps_outside_sqrt = mutant(
    "layer_norm", _k,
    [("rstd = 1.0 / tl.sqrt(var + eps)\n", "rstd = 1.0 / (tl.sqrt(var) + eps)\n")],
    name="eps_outside_sqrt",
    bug=(
        "rstd = 1 / (sqrt(var) + eps) instead of 1 / sqrt(var + eps) (eps placed as in "
        "some 'std + eps' implementations). Invisible at unit variance (relative change "
        "~eps/2), large when var is comparable to eps. Trigger: rows with a small spread, "
        "e.g. std 1e-3 (var 1e-6 < eps = 1e-5)."
    ),
    kills=("matches_reference", "gradients_match_reference", "normalised_moments"),
)

backward_missing_xhat_term = mutant(
    "layer_norm", _k,
    [("dx = (wdy - (xhat * c1 + c2)) * rstd\n", "dx = (wdy - c2) * rstd\n")],
    name="backward_missing_xhat_term",
    bug=(
        "dx drops the -x_hat * mean(w*dy*x_hat) term (the gradient through the variance), "
        "keeping only the gradient through the mean. Forward is untouched. Trigger: any "
        "backward with N >= 2 and dy not orthogonal to w*x_hat (any random dy)."
    ),
    kills=("gradients_match_reference",),
)

dweight_partial_rows = mutant(
    "layer_norm", _k,
    [("tl.store(dw_row + cols, dw_part + dy * xhat, mask=mask)",
      "tl.store(dw_row + cols, dy * xhat, mask=mask)")],
    name="dweight_partial_rows",
    bug=(
        "The per-group dweight partial is overwritten instead of accumulated, so each "
        "group contributes only its last row to dweight (dbias and dx are right). "
        "Trigger: a row group holding more than one row, i.e. more rows than the group "
        "cap: M > 4 under the interpreter, M > 256 on a GPU (x [..., N] with >= 5 rows)."
    ),
    kills=("gradients_match_reference",),
)

dweight_skips_last_group = mutant(
    "layer_norm", _k,
    [("    for g in range(0, G):\n", "    for g in range(0, G - 1):\n")],
    name="dweight_skips_last_group",
    bug=(
        "Off-by-one in the bound of the fixed-order reduction of the dweight partials: "
        "the last row group is never added (with a single group dweight is 0). dbias and "
        "dx are right. Trigger: any backward whose last group has a nonzero "
        "sum(dy * x_hat), e.g. x [2, 8] with random dy."
    ),
    kills=("gradients_match_reference",),
)

assumes_contiguous_rows = mutant(
    "layer_norm", _k,
    [("x2, weight, bias, y, mean, rstd,\n                x2.stride(0), x2.stride(1),",
      "x2, weight, bias, y, mean, rstd,\n                n, 1,")],
    name="assumes_contiguous_rows",
    bug=(
        "The forward launch passes row stride N and column stride 1 instead of the "
        "view's strides, i.e. assumes a contiguous input (the usual 'x.stride(0) was "
        "always N in my tests' bug). Trigger: a non-contiguous x, e.g. a transposed view "
        "x = t.transpose(0, 1) or a step-sliced x = t[:, ::2]."
    ),
    kills=("matches_reference", "gradients_match_reference"),
)

bf16_large_batch_param_grads_zeroed = mutant(
    "layer_norm", _k,
    [("            _layer_norm_bwd_dwdb_kernel[(triton.cdiv(n, block_n),)](\n"
      "                dw_part, db_part, dw, db, num_groups, n,\n"
      "                BLOCK_N=block_n,\n"
      "            )\n",
      "            if rows_per_group == 1 or x2.dtype != torch.bfloat16:\n"
      "                _layer_norm_bwd_dwdb_kernel[(triton.cdiv(n, block_n),)](\n"
      "                    dw_part, db_part, dw, db, num_groups, n,\n"
      "                    BLOCK_N=block_n,\n"
      "                )\n")],
    name="bf16_large_batch_param_grads_zeroed",
    bug=(
        "In bfloat16, once row groups hold more than one row (a large batch), the reduction of "
        "the dweight/dbias partials is never launched, so the zero-initialised dweight and dbias "
        "come back (dx is right). Class: a launch guarded by the wrong condition on a large-batch "
        "path. The old bf16 sum-over-rows rule accepted zeros from about 560 rows on (issue 16). "
        "Trigger: bf16 and more rows than the group cap: M > 4 under the interpreter, M > 256 on "
        "a GPU (where the old rule let it pass in part of the draws)."
    ),
    kills=("gradients_match_reference",),
)

# ----------------------------------------------------------------- dropout_residual_layer_norm

dropout_unscaled = mutant(
    "dropout_residual_layer_norm", _k,
    [("return tl.where(keep, x * scale, 0.0) + r\n", "return tl.where(keep, x, 0.0) + r\n")],
    name="dropout_unscaled",
    bug=(
        "Kept activations are not rescaled by 1/(1-p) (inverted dropout without the "
        "inversion), so h = where(keep, x, 0) + residual. Trigger: p > 0 with some kept "
        "x != 0, e.g. p = 0.5."
    ),
    kills=("matches_reference",),
)

dropout_padded_lanes_in_variance = mutant(
    "dropout_residual_layer_norm", _k,
    [("        hc = tl.where(mask, h - h_mean, 0.0)\n", "        hc = h - h_mean\n")],
    name="dropout_padded_lanes_in_variance",
    bug=(
        "The seed kernel's bug: the padded lanes of the last column block hold h = 0 and "
        "contribute (0 - mean)^2 each to the variance. Trigger: N not a multiple of "
        "BLOCK_N (N not a power of two for N <= the cap) and a row mean of h far from 0, "
        "e.g. residual with mean 3."
    ),
    kills=("matches_reference", "p_zero_is_layer_norm"),
)

dropout_keep_below_p = mutant(
    "dropout_residual_layer_norm", _k,
    [("return tl.rand(seed, offsets) >= p\n", "return tl.rand(seed, offsets) < p\n")],
    name="dropout_keep_below_p",
    bug=(
        "The comparison is inverted: an element is kept with probability p instead of "
        "1 - p (a 'drop mask' used as a 'keep mask'). y is still consistent with the "
        "returned mask, so matching the reference given keep cannot see it. Trigger: "
        "any p != 0.5 (p = 0 drops everything)."
    ),
    kills=("p_zero_is_layer_norm", "keep_fraction_binomial"),
)

dropout_same_mask_every_row = mutant(
    "dropout_residual_layer_norm", _k,
    [("        rng_base = row * N\n", "        rng_base = row * 0\n"),
     ("        rng_base = pid * N\n", "        rng_base = pid * 0\n")],
    name="dropout_same_mask_every_row",
    bug=(
        "The RNG offset is the column index only, so every row gets the same dropout "
        "mask (a per-row offset forgotten when porting a 1-D dropout kernel). Trigger: "
        "x with >= 2 rows and 0 < p."
    ),
    kills=("seed_reproducible",),
)

ALL = (
    one_pass_variance, padded_lanes_in_variance, eps_outside_sqrt,
    backward_missing_xhat_term, dweight_partial_rows, dweight_skips_last_group,
    assumes_contiguous_rows, bf16_large_batch_param_grads_zeroed, dropout_unscaled, dropout_padded_lanes_in_variance,
    dropout_keep_below_p, dropout_same_mask_every_row,
)
