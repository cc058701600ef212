"""Planted bugs in the linear_attention family (patches of ``kernels/linear_attention.py``).

Each mutant is one exact source patch of the project kernel; see ``tritoncheck/mutation.py``.
Triggers refer to the kernel's chunk sizes ``(16, 32, 64)`` (default 64): a causal bug
that lives at chunk boundaries needs N larger than the chunk in use.
"""
from __future__ import annotations

from tritoncheck.kernels import linear_attention as _k
from tritoncheck.mutation import mutant

# ------------------------------------------------------------ linear_attention

state_not_carried = mutant(
    "linear_attention", _k,
    [(
        "        s_acc += tl.where(de_mask, tl.dot(tl.trans(k), v, input_precision=DOT_PRECISION), 0.0)\n"
        "        z_acc += tl.sum(k, axis=0)\n",
        "        s_acc = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)\n"
        "        z_acc = tl.zeros([BLOCK_D], dtype=tl.float32)\n",
    )],
    name="state_not_carried",
    bug=(
        "The causal kernel resets its fp32 state (S, z) at every chunk instead of adding "
        "K_c^T V_c and sum K_c to it, so each chunk attends only to itself (the 'forgot "
        "to carry the recurrent state between blocks' bug of chunked scans). Exact when "
        "N <= chunk size. Trigger: causal, N > chunk size (default 64; > 16 with chunk_size=16)."
    ),
    kills=("matches_reference", "chunk_size_invariant", "last_causal_equals_bidirectional"),
)

exclusive_causal_sum = mutant(
    "linear_attention", _k,
    [("causal = rows[None, :] <= rows[:, None]", "causal = rows[None, :] < rows[:, None]")],
    name="exclusive_causal_sum",
    bug=(
        "The intra-chunk causal mask is j < i instead of j <= i, so each token does not "
        "attend to itself: an exclusive prefix sum where the contract's is inclusive (the "
        "off-by-one of strict vs non-strict masks). Consistent across chunks (a token is "
        "never in an earlier chunk), so chunk-size invariance still holds. "
        "Trigger: causal, any N >= 1 with k_i v_i^T != 0 (o_0 becomes 0)."
    ),
    kills=("matches_reference", "last_causal_equals_bidirectional"),
)

eps_as_max = mutant(
    "linear_attention", _k,
    [
        ("den_full = den_full + eps", "den_full = tl.maximum(den_full, eps)"),
        ("den = den + eps", "den = tl.maximum(den, eps)"),
    ],
    name="eps_as_max",
    bug=(
        "The normaliser is max(q.z, eps) instead of q.z + eps in both the bidirectional "
        "and the causal kernel (the 'clamp instead of add' variant of eps handling; the "
        "lab seed has it). Identical when q.z >> eps, wrong by a factor up to "
        "(q.z + eps) / max(q.z, eps) <= 2 when q.z is comparable to eps. "
        "Trigger: tiny features, e.g. q, k ~ 1e-4 (q.z ~ D * 1e-8 ~ 1e-6); not q = 0 "
        "(both give 0)."
    ),
    kills=("matches_reference",),
)

state_updated_before_query = mutant(
    "linear_attention", _k,
    [
        ("num = tl.dot(q, s_acc, input_precision=DOT_PRECISION) + intra",
         "num = tl.dot(q, s_acc + tl.dot(tl.trans(k), v, input_precision=DOT_PRECISION), "
         "input_precision=DOT_PRECISION) + intra"),
        ("tl.sum(q * z_acc[None, :], axis=1)",
         "tl.sum(q * (z_acc + tl.sum(k, axis=0))[None, :], axis=1)"),
    ],
    name="state_updated_before_query",
    bug=(
        "The causal kernel queries a state that already holds the current chunk "
        "(update-then-read ordering), so every token sees all keys of its own chunk, "
        "future ones included, and the past ones twice (once through the state, once "
        "through the masked intra-chunk scores). Trigger: causal, any N >= 1."
    ),
    kills=("matches_reference", "chunk_size_invariant", "causal_mask_respected",
           "last_causal_equals_bidirectional"),
)

# ------------------------------------------------------------- elu_feature_map

relu_plus_one_feature_map = mutant(
    "elu_feature_map", _k,
    [("y = tl.where(x > 0, x + 1.0, tl.exp(x))", "y = tl.where(x > 0, x + 1.0, 1.0)")],
    name="relu_plus_one_feature_map",
    bug=(
        "Forward computes max(x, 0) + 1 (relu + 1, another common positive feature map) "
        "instead of elu(x) + 1 = max(x, 0) + exp(min(x, 0)). The Triton backward is left "
        "correct for elu + 1, so gradients still match the reference. Output stays "
        "positive and finite. Trigger: any x < 0 (|error| = 1 - exp(x))."
    ),
    kills=("matches_reference",),
)

elu_grad_exp_everywhere = mutant(
    "elu_feature_map", _k,
    [("dydx = tl.where(x > 0, 1.0, tl.exp(x))", "dydx = tl.exp(x)")],
    name="elu_grad_exp_everywhere",
    bug=(
        "Backward uses the negative branch's derivative exp(x) for every x (a dropped "
        "branch in a piecewise derivative); forward is correct. Trigger: any x > 0 with a "
        "non-zero upstream gradient (x = 1 gives e instead of 1; large x gives inf)."
    ),
    kills=("gradients_match_reference",),
)

elu_plus_one_cancellation = mutant(
    "elu_feature_map", _k,
    [("y = tl.where(x > 0, x + 1.0, tl.exp(x))", "y = tl.where(x > 0, x, tl.exp(x) - 1.0) + 1.0")],
    name="elu_plus_one_cancellation",
    bug=(
        "Forward computes elu(x) = exp(x) - 1 and then adds 1, the textbook formula that "
        "F.elu(x) + 1 also uses: (exp(x) - 1) + 1 cancels to exactly 0 in fp32 once "
        "exp(x) < u(fp32) = 2**-24, so every x below about -17 maps to 0 and the feature "
        "map is no longer positive (a later division by q.z can then be 0/0). Absolute "
        "error stays below 2**-24, so matching the reference alone does not catch it. "
        "Trigger: any x < -17.4 whose fp64 image is representable in the output dtype."
    ),
    kills=("feature_map_positive_finite",),
)

MUTANTS = (
    state_not_carried,
    exclusive_causal_sum,
    eps_as_max,
    state_updated_before_query,
    relu_plus_one_feature_map,
    elu_grad_exp_everywhere,
    elu_plus_one_cancellation,
)
