"""Planted bugs in the gated delta rule (patches of ``kernels/gated_delta_rule.py``).

Each mutant is one exact source patch of the project kernel (``tritoncheck/mutation.py``).
Triggers refer to its chunk sizes (16, 32, 64; default 64): a bug at chunk boundaries
needs T past the chunk in use. The int32 offset bug is in ``mutants/offsets.py`` (the
large-index check kills it, no fuzzed case is large enough).
"""
from __future__ import annotations

from tritoncheck.kernels import gated_delta_rule as _k
from tritoncheck.mutation import mutant

state_carried_without_decay = mutant(
    "gated_delta_rule", _k,
    [("        state = gamma_last * state + tl.dot(tl.trans(k * to_end[:, None]), u, input_precision=DOT_PRECISION)",
      "        state = state + tl.dot(tl.trans(k * to_end[:, None]), u, input_precision=DOT_PRECISION)")],
    name="state_carried_without_decay",
    bug=(
        "The forward carries the state past a chunk without its decay over the chunk, "
        "exp(G_last) (the tokens' writes are decayed to the chunk's end, the old state is not): "
        "the 'forgot the gate on the carried state' bug of chunked gated scans. Trigger: g != 0 "
        "with an initial state, or T past the chunk."
    ),
    kills=("matches_reference", "chunk_size_invariant", "beta_zero_decays_initial_state"),
)

chunk_last_token_dropped = mutant(
    "gated_delta_rule", _k,
    [("    to_end = tl.where(t_ok, tl.exp(last - cum), 0.0)",
      "    to_end = tl.where(t_ok & (rows < tl.max(rows, axis=0)), tl.exp(last - cum), 0.0)")],
    name="chunk_last_token_dropped",
    bug=(
        "The write of each chunk's last token never reaches the carried state (an off-by-one "
        "in the chunk's row mask, rows < C - 1): outputs inside the chunk are right, every "
        "later chunk and the final state miss that token. Trigger: T >= the chunk size (16 "
        "with chunk_size=16)."
    ),
    kills=("matches_reference", "chunk_size_invariant"),
)

exclusive_intra_chunk_mask = mutant(
    "gated_delta_rule", _k,
    [("        qk = tl.where(lower, tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * ratio, 0.0)",
      "        qk = tl.where(rows[None, :] < rows[:, None], tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)"
      " * ratio, 0.0)")],
    name="exclusive_intra_chunk_mask",
    bug=(
        "The output's intra-chunk scores use j < i (the solve's strictly lower mask) instead of "
        "j <= i: o_t reads the state before its own token's write (an inclusive/exclusive mix-up "
        "between the two masks of a chunked delta rule). The carried state is right. Trigger: "
        "any token with beta_t != 0."
    ),
    kills=("matches_reference", "g_zero_is_ungated"),
)

initial_state_ignored = mutant(
    "gated_delta_rule", _k,
    [("        state = tl.load(H0 + nh * DK * DV + state_offs, mask=de_ok, other=0.0)",
      "        state = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)")],
    name="initial_state_ignored",
    bug=(
        "The forward starts every sequence from a zero state whatever initial_state holds (a "
        "prefill kernel reused for chunked prefill or decoding). Trigger: a nonzero initial state."
    ),
    kills=("matches_reference", "beta_zero_decays_initial_state", "split_in_two_carries_state",
           "token_by_token_equals_chunked"),
)

first_sequence_state_for_all = mutant(
    "gated_delta_rule", _k,
    [("        state = tl.load(H0 + nh * DK * DV + state_offs, mask=de_ok, other=0.0)",
      "        state = tl.load(H0 + h * DK * DV + state_offs, mask=de_ok, other=0.0)")],
    name="first_sequence_state_for_all",
    bug=(
        "Every sequence starts from the first sequence's initial state (the state indexed by "
        "head only, not by sequence and head): a packed or batched call mixes its sequences' "
        "states. Trigger: two or more sequences with different initial states."
    ),
    kills=("matches_reference", "packed_equals_separate_calls"),
)

beta_on_wrong_side = mutant(
    "gated_delta_rule", _k,
    [("    a = tl.where(rows[None, :] < rows[:, None], beta[:, None] * kk * ratio, 0.0)",
      "    a = tl.where(rows[None, :] < rows[:, None], beta[None, :] * kk * ratio, 0.0)")],
    name="beta_on_wrong_side",
    bug=(
        "A_ij = beta_j (k_i . k_j) R_ij instead of beta_i (k_i . k_j) R_ij: beta applied to the "
        "earlier key's side of k k^T (diag(beta) K K^T transposed), so the erase of token i "
        "uses the other tokens' betas. One-token chunks are right. Trigger: two tokens in a "
        "chunk with different betas and overlapping keys."
    ),
    kills=("matches_reference", "chunk_size_invariant", "token_by_token_equals_chunked"),
)

final_state_into_initial_state = mutant(
    "gated_delta_rule", _k,
    [("    tl.store(HT + nh * DK * DV + state_offs, state, mask=de_ok)\n\n\n@triton.jit",
      "    tl.store(HT + nh * DK * DV + state_offs, state, mask=de_ok)\n"
      "    if HAS_H0:\n"
      "        tl.store(H0 + nh * DK * DV + state_offs, state, mask=de_ok)\n\n\n@triton.jit")],
    name="final_state_into_initial_state",
    bug=(
        "The forward also writes the final state over initial_state (the in-place state update "
        "of a decoding cache, where the contract returns a new tensor): the caller's initial "
        "state is gone. Trigger: a contiguous float32 initial state."
    ),
    kills=("inputs_unchanged",),
)

final_state_workspace_reused = mutant(
    "gated_delta_rule", _k,
    [("    final = torch.empty((N, H, DK, DV), dtype=torch.float32, device=q.device)",
      "    final = _WORKSPACE.setdefault((N, H, DK, DV, q.device),\n"
      "                                  torch.empty((N, H, DK, DV), dtype=torch.float32, device=q.device))"),
     ("_V_TILE = 32", "_WORKSPACE = {}\n_V_TILE = 32")],
    name="final_state_workspace_reused",
    bug=(
        "The final state is written to a workspace cached per shape and returned as it is (a "
        "preallocated state buffer): the next call with the same shapes overwrites the state "
        "the previous caller holds. Trigger: two calls of one shape."
    ),
    kills=("calls_independent",),
)

chunk_alternates_per_call = mutant(
    "gated_delta_rule", _k,
    [("    chunk = _DEFAULT_CHUNK if chunk_size is None else int(chunk_size)",
      "    gated_delta_rule.calls = getattr(gated_delta_rule, 'calls', 0) + 1\n"
      "    chunk = (_DEFAULT_CHUNK if gated_delta_rule.calls % 2 else 16) if chunk_size is None else int(chunk_size)")],
    name="chunk_alternates_per_call",
    bug=(
        "Every other call runs 16-token chunks instead of the default (a tuner or cache that "
        "picks per call): the sums round in another grouping and two calls on the same inputs "
        "differ. Trigger: T past 16."
    ),
    kills=("deterministic",),
)

dg_without_chunk_end = mutant(
    "gated_delta_rule", _k,
    [("        dg = tl.sum(tl.where(rows[None, :] >= rows[:, None], d_cum[None, :], 0.0), axis=1) + d_last",
      "        dg = tl.sum(tl.where(rows[None, :] >= rows[:, None], d_cum[None, :], 0.0), axis=1)")],
    name="dg_without_chunk_end",
    bug=(
        "The backward leaves out dG_last from dg: the gradient through the chunk's decay of the "
        "carried state and of the writes to the chunk's end (exp(G_last) and exp(G_last - G_j)) "
        "is lost. The forward is right. Trigger: an initial state or a gradient of the final state."
    ),
    kills=("gradients_match_reference",),
)

checkpoints_overwritten_in_backward = mutant(
    "gated_delta_rule", _k,
    [("        tl.store(DV_OUT + flat[:, None] * DV + offs_e[None, :], beta[:, None] * dy, mask=tv_ok)",
      "        tl.store(DV_OUT + flat[:, None] * DV + offs_e[None, :], beta[:, None] * dy, mask=tv_ok)\n"
      "        tl.store(CKPT + ((first_chunk + c0 // CHUNK) * H + h) * DK * DV + state_offs, adj, mask=de_ok)")],
    name="checkpoints_overwritten_in_backward",
    bug=(
        "The backward reuses the forward's saved chunk states as its workspace, writing the "
        "adjoint over each after reading it: the first backward is right, a second one through "
        "the same graph reads adjoints where it expects states. Trigger: a second backward."
    ),
    kills=("backward_repeatable",),
)

MUTANTS = (
    state_carried_without_decay, chunk_last_token_dropped, exclusive_intra_chunk_mask, initial_state_ignored,
    first_sequence_state_for_all, beta_on_wrong_side, final_state_into_initial_state, final_state_workspace_reused,
    chunk_alternates_per_call, dg_without_chunk_end, checkpoints_overwritten_in_backward,
)
