"""Planted bugs in the cross-entropy kernel (``kernels/losses.py``), one source patch each."""
from __future__ import annotations

from tritoncheck.kernels import losses as _kernel
from tritoncheck.mutation import mutant

__all__ = ["padded_logits_zero", "ignore_index_not_zeroed", "no_max_subtraction", "grad_missing_onehot"]

padded_logits_zero = mutant(
    "cross_entropy",
    _kernel,
    [(
        'z = tl.load(x_row + cols * stride_lv, mask=cols < V, other=float("-inf")).to(tl.float32)',
        'z = tl.load(x_row + cols * stride_lv, mask=cols < V, other=0.0).to(tl.float32)',
    )],
    name="padded_logits_zero",
    bug=(
        "The forward loads the padded lanes of the last column block as 0 instead of -inf, "
        "so each padded lane adds exp(0 - max) to the softmax denominator (the wrong masking "
        "identity: 0 is the identity of a sum, not of a max/logsumexp). Triggered when V is "
        "not a multiple of BLOCK_V (e.g. V = 300, BLOCK_V = 128 under the interpreter, or any "
        "V that is not a power of two below the block cap); the loss is too large and the "
        "backward, which uses the saved lse, gives too small probabilities."
    ),
    kills=("matches_reference", "gradients_match_reference", "shift_invariant"),
)

ignore_index_not_zeroed = mutant(
    "cross_entropy",
    _kernel,
    [("loss = tl.where(ignored, 0.0, lse - x_t)", "loss = lse - x_t")],
    name="ignore_index_not_zeroed",
    bug=(
        "Rows whose target equals ignore_index are not zeroed: the forward stores "
        "lse - logits[i, 0] (the clamped index it reads) instead of 0. Models the padding-token "
        "bug (ignore_index honoured in the mean/backward but not in the per-row loss). "
        "Triggered by any row with target == ignore_index."
    ),
    kills=("matches_reference", "ignored_rows_zero"),
)

no_max_subtraction = mutant(
    "cross_entropy",
    _kernel,
    [
        (
            "s_lane = s_lane * tl.exp(m_lane - m_ref) + tl.exp(z - m_ref)",
            "s_lane = s_lane + tl.exp(z)",
        ),
        (
            "s = tl.sum(s_lane * tl.exp(m_lane - m_fin), axis=0)\n    lse = m + tl.log(s)",
            "s = tl.sum(s_lane, axis=0)\n    lse = tl.log(s)",
        ),
    ],
    name="no_max_subtraction",
    bug=(
        "The naive logsumexp log(sum(exp(x))) without subtracting the row max: exp overflows "
        "to inf for a logit above ~88.7 (fp32 arithmetic), giving loss = inf (or NaN), and "
        "underflows to 0 when every logit of the row is below ~-103, giving lse = -inf and a "
        "loss of -inf. The backward, which uses the saved lse, is wrong on the same rows. "
        "Triggered by large logits or a large common offset (e.g. logits + 100 or - 200)."
    ),
    kills=("matches_reference", "gradients_match_reference", "shift_invariant", "loss_at_least_zero"),
)

grad_missing_onehot = mutant(
    "cross_entropy",
    _kernel,
    [("g = p - tl.where(cols == tgt, 1.0, 0.0)", "g = p")],
    name="grad_missing_onehot",
    bug=(
        "The backward returns dloss * softmax(logits) and forgets the -1 at the target column "
        "(the gradient of the logsumexp alone). The forward is right. Triggered by any "
        "non-ignored row when gradients are checked."
    ),
    kills=("gradients_match_reference",),
)
