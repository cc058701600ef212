"""Planted bugs in ``tritoncheck.kernels.attention``: each is the project kernel with one source patch.

Block sizes matter for the triggers: BLOCK_N is 16 under the Triton interpreter and
32 or 64 on the GPU (see ``tritoncheck.kernels.attention._fwd_config``), so "Nk not a multiple of
BLOCK_N" means e.g. Nk = 10 or 40 on both backends.

``kills`` lists only checks that fail on some input for that bug; the comments say why
the checks that look related do not.
"""
from __future__ import annotations

import tritoncheck.kernels.attention as _kernel
from tritoncheck.mutation import mutant

# Keys past Nk in the last block are loaded as k = 0, v = 0 and scored 0 instead of
# -inf, so each adds exp(0 - m) to the denominator and nothing to the numerator.
# Not killed: key_permutation_invariant (the padding count does not depend on the key
# order), causal checks (with Nq == Nk every padded key is also a future key, masked
# by the causal mask anyway), batch_heads_independent.
# Killed by uniform_values_preserved because the padded v lanes load as 0, not 1:
# with v all ones, o = sum_valid p / (sum_valid p + n_pad e^{-m}) < 1.
padded_keys_scored_zero = mutant(
    "attention", _kernel,
    [('s = tl.where(n_valid[None, :], s, float("-inf"))',
      's = tl.where(n_valid[None, :], s, 0.0)')],
    name="padded_keys_scored_zero",
    bug="Out-of-range keys in the last key block get score 0 instead of -inf (the "
        "lab seed's bug: masked lanes given the wrong identity for the max/sum). "
        "Triggers when causal=False and Nk is not a multiple of BLOCK_N (e.g. Nk = 10): "
        "o shrinks toward 0 and lse grows by log(1 + n_pad e^{-max}).",
    kills=("matches_reference", "gradients_match_reference", "online_lse_matches_full",
           "uniform_values_preserved", "split_kv_merge"),
)

# acc is not multiplied by alpha = exp(m_old - m_new) when the running max grows, while
# l is: old blocks stay weighted by a stale max. lse is still right, so
# online_lse_matches_full does not kill it; causal_mask_respected neither (future keys
# still get weight 0).
accumulator_not_rescaled = mutant(
    "attention", _kernel,
    [("acc = acc * alpha[:, None] + _mma(p, v, FP16_DOT, DOT_PRECISION)",
      "acc = acc + _mma(p, v, FP16_DOT, DOT_PRECISION)")],
    name="accumulator_not_rescaled",
    bug="Online-softmax rescale of the output accumulator forgotten (a classic "
        "FlashAttention port bug). Triggers when Nk > BLOCK_N and a later key block "
        "holds a larger score than all earlier ones (e.g. Nk = 40 with the largest key "
        "last). The dq/dk gradients go wrong through delta = rowsum(dO * O).",
    kills=("matches_reference", "gradients_match_reference", "uniform_values_preserved",
           "key_permutation_invariant", "split_kv_merge"),
)

# The shared band-mask helper drops the band's upper edge, for causal calls the diagonal:
# key j = i + Nk - Nq is masked too. Causal row 0 with Nq == Nk has no key left (o = 0,
# lse = -inf, an empty row); other rows lose their own key. Future keys stay
# masked, so causal_mask_respected / causal_gradient_respected / batch_heads_independent
# fail only through row 0 (now empty, o = 0), which is not listed as a kill. Nor is
# online_lse_matches_full now that it compares the implementation's block-wise lse with its
# own full one: the blocks drop the same diagonal, so the two agree (it survived all three
# dtypes in the CI run of 2026-11-23).
causal_off_by_one = mutant(
    "attention", _kernel,
    [("(offs_n[None, :] <= offs_m[:, None] + BAND_HI)",
      "(offs_n[None, :] < offs_m[:, None] + BAND_HI)")],
    name="causal_off_by_one",
    bug="Causal mask j >= i instead of j > i (diagonal excluded; an off-by-one in the "
        "mask comparison). Triggers on every causal input: row 0 becomes empty, the "
        "other rows ignore their own key. Applies to forward and backward.",
    kills=("matches_reference", "gradients_match_reference"),
)

# The mask lets key j = i + 1 through (in forward and backward, one shared helper).
# Row i at the last position of a query block never sees key i + 1 (the loop stops at
# the diagonal block), every other row does, e.g. row 0 sees key 1.
causal_future_key_visible = mutant(
    "attention", _kernel,
    [("(offs_n[None, :] <= offs_m[:, None] + BAND_HI)",
      "(offs_n[None, :] <= offs_m[:, None] + BAND_HI + 1)")],
    name="causal_future_key_visible",
    bug="Causal mask j > i + 1 instead of j > i: each query sees one future key "
        "(an off-by-one shifting the diagonal). Triggers on any causal input with "
        "N >= 2; forward and backward both use the shifted mask.",
    kills=("matches_reference", "gradients_match_reference", "causal_mask_respected",
           "causal_gradient_respected", "online_lse_matches_full"),
)

# lse stored in log2 units (m + log2 l) instead of natural log. o is unaffected, so
# uniform_values_preserved passes; the backward reads lse as natural log, so P and
# every gradient are wrong.
lse_in_log2_units = mutant(
    "attention", _kernel,
    [("(m_i + tl.log2(l_i)) * _LN2)  # natural log",
      "m_i + tl.log2(l_i))")],
    name="lse_in_log2_units",
    bug="The log2-domain running statistics are stored without converting back to "
        "natural log (lse is log2(e) times too large; the exp2 trick leaking out). "
        "Triggers on every input whose lse is not 0.",
    kills=("matches_reference", "gradients_match_reference", "online_lse_matches_full",
           "split_kv_merge"),
)

# The wrapper passes strides computed from the shape as if q, k, v were contiguous.
# Contiguous inputs are unaffected; the reads stay inside the input's storage for any
# non-overlapping view, so this never reads out of bounds.
strides_assumed_contiguous = mutant(
    "attention", _kernel,
    [("return tuple(t.stride())",
      'return tuple(torch.empty(t.shape, device="meta").stride())')],
    name="strides_assumed_contiguous",
    bug="q/k/v strides computed from the shape as if the tensors were contiguous "
        "instead of taken from the tensor (the wrapper forgot .contiguous() or "
        ".stride()). Triggers on non-contiguous q, k or v, e.g. a [B, N, H, D] tensor "
        "transposed to [B, H, N, D] with H > 1 and N > 1, or a step-sliced head dim.",
    kills=("matches_reference", "gradients_match_reference"),
)

# lse written at (head * Nq + row) instead of ((batch * H + head) * Nq + row): every
# batch writes over batch 0 and the other batches' lse are never written. Not a kill of
# online_lse_matches_full: the full call and the block calls leave the same batches
# unwritten, and with fresh allocations filled with NaN both read NaN there (it survived all
# three dtypes in the CI run of 2026-11-23; garbage used to differ between the calls by luck).
lse_ignores_batch_index = mutant(
    "attention", _kernel,
    [("tl.store(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=m_valid)",
      "tl.store(LSE + off_h.to(tl.int64) * N_Q + offs_m, lse, mask=m_valid)")],
    name="lse_ignores_batch_index",
    bug="The lse output pointer is offset by the head index only, not batch * H + head "
        "(a flattened-index bug). Triggers when B > 1: batch 0 gets the last batch's "
        "lse, the others keep uninitialised memory, and the backward uses them.",
    kills=("matches_reference", "gradients_match_reference", "batch_heads_independent"),
)

# Backward: dk not multiplied by sm_scale (ds / dk = sm_scale q). Forward untouched.
dk_missing_scale = mutant(
    "attention", _kernel,
    [("dk = dk * sm_scale  # d s / d k = sm_scale * q", "dk = dk")],
    name="dk_missing_scale",
    bug="Backward: the softmax scale is dropped from dk (chain rule through "
        "s = sm_scale q k^T forgotten for one operand). Triggers whenever "
        "sm_scale != 1 (the default 1/sqrt(D) for D > 1).",
    kills=("gradients_match_reference",),
)

# Backward: the dk/dv kernel forgets the causal mask, so rows i < j send gradient to
# key j. The forward and dq are right.
dkdv_causal_mask_missing = mutant(
    "attention", _kernel,
    [("keep = keep & _band_keep(offs_m, offs_n, BAND_LO, BAND_HI)", "keep = keep")],
    name="dkdv_causal_mask_missing",
    bug="Backward: the dk/dv kernel recomputes P without the causal mask (a mask "
        "applied in the forward but not repeated in the backward). Triggers on causal "
        "inputs with N >= 2: future keys get gradient from earlier queries.",
    kills=("gradients_match_reference", "causal_gradient_respected"),
)

# GQA: query head h reads KV head h % Hkv instead of h // (H / Hkv) (forward and dq; the
# dk/dv kernel walks each KV head's own group). Heads interleaved instead of grouped: the
# layout confusion between repeat and repeat_interleave. With Hkv = 1 (MQA) or Hkv = H
# both maps agree, so only 1 < Hkv < H triggers it (e.g. H = 4, Hkv = 2: head 1 reads KV
# head 1, not 0). Not key_permutation_invariant or batch_heads_independent: both compare
# the kernel with itself, which reads the same wrong head twice. Not claimed for
# gradients_match_reference: its cases draw H = 4 with Hkv = 2 too rarely (it survived
# all three dtypes in the first self-test run); gqa_equals_repeated_kv draws it always.
kv_head_interleaved = mutant(
    "attention", _kernel,
    [("return off_h // GROUP", "return off_h % (H // GROUP)")],
    name="kv_head_interleaved",
    bug="GQA: query head h reads KV head h % Hkv instead of h // (H / Hkv) (groups of "
        "query heads interleaved instead of consecutive). Triggers when 1 < Hkv < H, e.g. "
        "H = 4, Hkv = 2: every head reads another head's keys and values.",
    kills=("matches_reference", "gqa_equals_repeated_kv"),
)

# The band's diagonal is aligned to the top left (row i's diagonal key is i) instead of the
# bottom right (i + Nk - Nq): flash-attention < 2.1's causal convention. Identical when
# Nq == Nk; with Nq < Nk each row misses its last Nk - Nq keys, with Nq > Nk no row is empty.
causal_top_left = mutant(
    "attention", _kernel,
    [("diag = n_k - n_q", "diag = 0")],
    name="causal_top_left",
    bug="Causal mask aligned to the top left (j <= i) instead of the bottom right "
        "(j <= i + Nk - Nq), the convention flash-attention changed in 2.1. Triggers on "
        "causal calls with Nq != Nk (KV cache decoding, chunked prefill).",
    kills=("matches_reference", "gradients_match_reference", "bottom_right_causal_is_last_rows",
           "empty_rows_zero"),
)

# The band's lower edge one key too far left: row i also sees key i + Nk - Nq - left - 1
# (a `>=` written against the wrong bound, or left counted exclusive). Only windows with a
# left bound trigger it (causal alone has none). Forward and backward (one shared helper).
window_left_edge_off_by_one = mutant(
    "attention", _kernel,
    [("(offs_n[None, :] >= offs_m[:, None] + BAND_LO)", "(offs_n[None, :] >= offs_m[:, None] + BAND_LO - 1)")],
    name="window_left_edge_off_by_one",
    bug="Sliding window: the band's left edge is off by one, each row sees one key more than "
        "window[0] to its left. Triggers on windowed calls with left >= 0 and a key past the "
        "edge (e.g. window (3, -1), Nq = Nk = 8: row 4 sees key 0).",
    kills=("matches_reference", "gradients_match_reference", "window_outside_keys_ignored"),
)

# A window side of 0 read as unbounded (an API where 0 means "no window"): window (Nk, 0)
# becomes no mask at all, and so does causal (folded into the band as right = 0).
window_zero_as_unbounded = mutant(
    "attention", _kernel,
    [("band_hi = diag + (right if right >= 0 else n_q)", "band_hi = diag + (right if right > 0 else n_q)")],
    name="window_zero_as_unbounded",
    bug="A window side of 0 is taken as unbounded (-1) instead of 'no key on that side': "
        "window (left, 0) sees every later key, and causal (right = 0 in the band) masks "
        "nothing. Triggers on causal calls and windows with a side of 0.",
    kills=("matches_reference", "gradients_match_reference", "causal_mask_respected"),
)

# The bound standing in for an unbounded left side is sized from the queries (Nq) instead
# of the keys (Nk): row i keeps j >= i + Nk - 2 Nq, so with Nk > 2 Nq (a KV cache longer
# than twice the new queries) the first rows lose their earliest keys, causal calls included,
# while an explicit window (Nk, 0) stays right. Not window_zero_as_unbounded's kill of
# window_equivalences: that one breaks causal and (Nk, 0) alike, so they still agree.
unbounded_left_sized_by_queries = mutant(
    "attention", _kernel,
    [("band_lo = diag - (left if left >= 0 else n_k)", "band_lo = diag - (left if left >= 0 else n_q)")],
    name="unbounded_left_sized_by_queries",
    bug="The stand-in bound of an unbounded window side is sized from Nq instead of Nk (a "
        "sentinel sized from the wrong dim): causal row i loses keys j < i + Nk - 2 Nq. "
        "Triggers on causal or right-bounded calls with Nk > 2 Nq.",
    kills=("matches_reference", "window_equivalences"),
)

# ALiBi's bias added instead of subtracted: far keys gain weight (a sign convention mixed
# up between a bias and a penalty).
alibi_sign_flipped = mutant(
    "attention", _kernel,
    [("s = s - slope * dist", "s = s + slope * dist")],
    name="alibi_sign_flipped",
    bug="ALiBi: s += slope |i + Nk - Nq - j| instead of -= (bias sign flipped). Triggers on "
        "any call with nonzero slopes and Nk >= 2.",
    kills=("matches_reference", "gradients_match_reference", "alibi_shift_invariant"),
)

# ALiBi's distance measured from the top-left diagonal (|i - j|) instead of the row's own
# bottom-right one (|i + Nk - Nq - j|): the same when Nq == Nk.
alibi_distance_top_left = mutant(
    "attention", _kernel,
    [("tl.abs(offs_m[:, None] + DIAG - offs_n[None, :])", "tl.abs(offs_m[:, None] - offs_n[None, :])")],
    name="alibi_distance_top_left",
    bug="ALiBi distance |i - j| instead of |i + Nk - Nq - j| (the origin of the distance is "
        "the top-left diagonal while the causal mask is bottom-right). Triggers on ALiBi "
        "calls with Nq != Nk (decoding with a KV cache).",
    kills=("matches_reference", "gradients_match_reference", "alibi_shift_invariant"),
)

# Softcap applied to the raw dot product, scaled afterwards: sm_scale c tanh(q.k / c)
# instead of c tanh(sm_scale q.k / c) (the cap then bounds scores at sm_scale c).
softcap_before_scale = mutant(
    "attention", _kernel,
    [("t = _tanh(s / softcap)", "t = _tanh(qk / softcap)"),
     ("s = softcap * t", "s = sm_scale * softcap * t")],
    name="softcap_before_scale",
    bug="Softcap applied before the softmax scale: sm_scale c tanh(q.k / c) instead of "
        "c tanh(sm_scale q.k / c) (the order of scale and cap swapped). Triggers on "
        "softcapped calls whose scores reach the cap's curved part, with sm_scale != 1.",
    kills=("matches_reference", "gradients_match_reference"),
)

# The scores path taken with a softcap or ALiBi drops sm_scale (the plain path folds it
# into qk_scale, so plain calls stay right).
scale_dropped_with_modifiers = mutant(
    "attention", _kernel,
    [("        s = qk * sm_scale\n        t = s", "        s = qk\n        t = s")],
    name="scale_dropped_with_modifiers",
    bug="With a softcap or ALiBi the kernel's separate score path forgets sm_scale (a "
        "second code path not kept in step with the first). Triggers on any call with "
        "ALiBi slopes or softcap > 0 and sm_scale != 1.",
    kills=("matches_reference", "gradients_match_reference", "alibi_zero_slopes_plain", "softcap_large_cap_plain"),
)

# ------------------------------------------------------------------------- dropout
# The mask is drawn by one helper (_dropout_keep) that the forward, both backward kernels and
# the keep kernel behind return_keep call: a bug there is consistent between o and the returned
# mask, so only the mask's own checks (dropout_keep_iid, dropout_seed_reproducible) see it;
# a bug in one caller shows against the returned mask (dropout_matches_reference,
# dropout_gradient_uses_keep).

# The kept weights are not scaled by 1 / (1 - p): o shrinks by the keep fraction in expectation
# (an inverted-dropout rescale forgotten, or applied at eval time instead).
dropout_not_rescaled = mutant(
    "attention", _kernel,
    [("o = acc * (drop_scale / l_i)[:, None]", "o = acc * (1.0 / l_i)[:, None]")],
    name="dropout_not_rescaled",
    bug="Dropout without the 1 / (1 - p) rescale of the kept weights (the forward's scale folded "
        "into 1 / l forgotten). Triggers on every call with dropout_p > 0 whose o is not 0: o is "
        "(1 - p) times the reference given the returned mask.",
    kills=("dropout_matches_reference",),
)

# The normaliser sums the kept weights only: softmax renormalised after dropout, lse of the
# dropped scores (dropout applied to the scores' exponentials before the row sum).
lse_after_dropout = mutant(
    "attention", _kernel,
    [("""        l_i = l_i * alpha + tl.sum(p, axis=1)  # the normaliser sums every weight: lse is dropout-free
        if HAS_DROPOUT:
            p = tl.where(_dropout_keep(seed, off_b, off_h, H, offs_m, offs_kn, N_Q, N_K, drop_p), p, 0.0)
""", """        if HAS_DROPOUT:
            p = tl.where(_dropout_keep(seed, off_b, off_h, H, offs_m, offs_kn, N_Q, N_K, drop_p), p, 0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)  # the normaliser sums every weight: lse is dropout-free
""")],
    name="lse_after_dropout",
    bug="The running sum l adds the weights after dropout, so lse is the logsumexp of the kept "
        "scores and o is renormalised over the kept keys (dropout placed before the softmax's "
        "normaliser instead of after it). Triggers on every call with dropout_p > 0 and a "
        "dropped visible key: lse is off by log(kept share of the row's weight).",
    kills=("dropout_matches_reference",),
)

# The counter leaves the head out: every head of a batch gets the same mask (and the batch's
# heads' dropout noise is correlated). o and the returned mask stay consistent.
heads_share_dropout_mask = mutant(
    "attention", _kernel,
    [("counter = ((off_b.to(tl.int64) * H + off_h) * N_Q", "counter = ((off_b.to(tl.int64) * H) * N_Q")],
    name="heads_share_dropout_mask",
    bug="The dropout mask's counter does not depend on the head (a flattened index that forgot "
        "a dim): all heads of a batch share one mask. Triggers on calls with H >= 2 and "
        "dropout_p > 0.",
    kills=("dropout_keep_iid",),
)

# The comparison keeps with probability p instead of 1 - p (keep probability and drop
# probability confused, as between keep_prob and p conventions).
keep_probability_inverted = mutant(
    "attention", _kernel,
    [("return tl.rand(seed, counter) >= drop_p", "return tl.rand(seed, counter) < drop_p")],
    name="keep_probability_inverted",
    bug="keep = uniform < p instead of >= p: elements are kept with probability p, not 1 - p "
        "(dropout probability read as keep probability). Triggers on dropout_p != 0.5; o stays "
        "consistent with the returned mask, so only the mask's law shows it.",
    kills=("dropout_keep_iid",),
)

# The dropout path is chosen by the seed's presence, not by dropout_p (an API where passing a
# seed or a generator turns dropout on): dropout_p = 0 with a seed draws a mask that keeps
# everything (uniform >= 0) and forms o as acc * (1 / l), a rounding apart from acc / l.
dropout_path_at_p_zero = mutant(
    "attention", _kernel,
    [("has_dropout = dropout_p > 0", "has_dropout = dropout_p > 0 or seed != 0")],
    name="dropout_path_at_p_zero",
    bug="dropout_p = 0 with a nonzero seed runs the dropout path (mask drawn, 1 / (1 - p) = 1 folded "
        "into 1 / l): an evaluation-mode call that passes its seed is not bitwise the plain call. "
        "Triggers on dropout_p = 0 with seed != 0, in the elements where acc * (1 / l) and acc / l "
        "round apart.",
    kills=("dropout_zero_is_plain",),
    only_on=(("interpret",), "on an H100 (Triton 3.6) it survived dropout_zero_is_plain in all three dtypes: "
                             "the GPU's fp32 division computes acc / l and acc * (1 / l) to the same bits, so "
                             "the dropout path at p = 0 is the plain call there"),
)

# dropout_p = 0 read as "not given" and replaced by a default rate (``p = dropout_p or
# default``): an evaluation-mode call drops part of P.
zero_dropout_means_default = mutant(
    "attention", _kernel,
    [("    has_dropout = dropout_p > 0\n", "    dropout_p = dropout_p or 0.1\n    has_dropout = dropout_p > 0\n")],
    name="zero_dropout_means_default",
    bug="dropout_p = 0 is taken for 'not given' and replaced by a default of 0.1 (the falsy-zero "
        "default, p = dropout_p or default): an evaluation call, or a model that sets p = 0, "
        "drops a tenth of P and rescales the rest. Triggers on dropout_p = 0, on any backend.",
    kills=("dropout_zero_is_plain",),
)

# The seed is cut to its low 32 bits on the way to the kernels (an int32 kernel argument):
# seeds that differ only above bit 31 give the same mask.
seed_truncated_to_32_bits = mutant(
    "attention", _kernel,
    [("return seed, float(dropout_p), 1.0 / (1.0 - float(dropout_p)), True",
      "return seed & 0xFFFFFFFF, float(dropout_p), 1.0 / (1.0 - float(dropout_p)), True")],
    name="seed_truncated_to_32_bits",
    bug="The seed reaches Philox cut to 32 bits (an int32 argument for a 64-bit seed): seeds that "
        "differ only in bits 32-62 draw the same mask. Triggers on two calls whose seeds differ "
        "above bit 31.",
    kills=("dropout_seed_reproducible",),
)

# The dk/dv kernel redraws the mask one key to the right: dv, and dS through dP', use another
# mask than the forward (a counter offset off by one in one of three places that form it).
backward_mask_shifted = mutant(
    "attention", _kernel,
    [("kept = _dropout_keep(seed, off_b, off_h, H, offs_m, offs_n, N_Q, N_K, drop_p)",
      "kept = _dropout_keep(seed, off_b, off_h, H, offs_m, offs_n + 1, N_Q, N_K, drop_p)")],
    name="backward_mask_shifted",
    bug="Backward: the dk/dv kernel recomputes the dropout mask with the key index off by one, "
        "so dv and dk use another mask than the forward's o. Triggers on every backward with "
        "dropout_p > 0: dropped keys get gradient.",
    kills=("dropout_gradient_uses_keep",),
)

# The wrapper drops nothing unless the mask is asked for: dropout_p is applied only on the
# return_keep=True path (a keep kernel written as the dropout's entry point, the training call
# left on the plain path). Every mask-based check that calls with return_keep=True sees correct
# dropout; the training call a model makes (return_keep=False) trains without it.
dropout_only_with_keep = mutant(
    "attention", _kernel,
    [("    dropout_p, seed = _check_dropout(dropout_p, seed, return_keep)\n",
      "    dropout_p, seed = _check_dropout(dropout_p, seed, return_keep)\n"
      "    dropout_p = dropout_p if return_keep else 0.0\n")],
    name="dropout_only_with_keep",
    bug="Dropout applied only when the keep mask is asked for (return_keep=True); the training call "
        "(return_keep=False) runs with no dropout. Triggers on every call with dropout_p > 0 and "
        "return_keep=False: o is the dropout-free output.",
    kills=("dropout_training_call_equals_keep_call",),
)

# The backward is written for o = (P * M) V, without the forward's 1 / (1 - p) (folded into
# 1 / l there, so easy to forget): dv and dP' lack the factor. dv is (1 - p) times the right
# one; dS = P (M dP - delta) with delta = rowsum(dO * O) from the scaled O, so dq and dk are
# wrong by more than a factor. The forward and the mask are right: only a comparison of the
# gradients under dropout with a reference sees it (dropout_gradient_uses_keep checks where
# dv is 0, not its size).
dropout_backward_unscaled = mutant(
    "attention", _kernel,
    [("dv = dv * drop_scale  # the kept weights' 1 / (1 - p)", "dv = dv"),
     ("dp = tl.where(kept, dp * drop_scale, 0.0)", "dp = tl.where(kept, dp, 0.0)"),
     ("dp = tl.where(kept_q, dp * drop_scale, 0.0)", "dp = tl.where(kept_q, dp, 0.0)")],
    name="dropout_backward_unscaled",
    bug="Backward under dropout without the kept weights' 1 / (1 - p): dv = (P * M)^T dO and "
        "dP' = M dO V^T (the forward's scale, folded into 1 / l, forgotten in the backward). "
        "Triggers on every backward with dropout_p > 0: dv is (1 - p) times the gradient, dq and dk off too.",
    kills=("dropout_gradients_match_reference",),
)

MUTANTS = (
    padded_keys_scored_zero,
    accumulator_not_rescaled,
    causal_off_by_one,
    causal_future_key_visible,
    lse_in_log2_units,
    strides_assumed_contiguous,
    lse_ignores_batch_index,
    dk_missing_scale,
    dkdv_causal_mask_missing,
    kv_head_interleaved,
    causal_top_left,
    window_left_edge_off_by_one,
    window_zero_as_unbounded,
    unbounded_left_sized_by_queries,
    alibi_sign_flipped,
    alibi_distance_top_left,
    softcap_before_scale,
    scale_dropped_with_modifiers,
    dropout_not_rescaled,
    lse_after_dropout,
    heads_share_dropout_mask,
    keep_probability_inverted,
    dropout_path_at_p_zero,
    zero_dropout_means_default,
    seed_truncated_to_32_bits,
    backward_mask_shifted,
    dropout_only_with_keep,
    dropout_backward_unscaled,
)
