"""Planted bugs in the SSD scan (patches of ``kernels/ssd_scan.py``).

Each mutant is one exact source patch of the project kernel (``tritoncheck/mutation.py``).
Triggers refer to its chunk sizes (16, 32, 64; default 64): a bug at chunk boundaries
needs T past the chunk in use. The int32 offset bug is in ``mutants/offsets.py`` (the
large-index check kills it, no fuzzed case is large enough).
"""
from __future__ import annotations

from tritoncheck.kernels import ssd_scan as _k
from tritoncheck.mutation import mutant

state_carried_without_decay = mutant(
    "ssd_scan", _k,
    [("        state = tl.exp(last) * state + tl.dot(tl.trans(x * (to_end * d)[:, None]), b, "
      "input_precision=DOT_PRECISION)",
      "        state = state + tl.dot(tl.trans(x * (to_end * d)[:, None]), b, input_precision=DOT_PRECISION)")],
    name="state_carried_without_decay",
    bug=(
        "The forward carries the state past a chunk without its decay over the chunk, exp(sum d A) "
        "(the tokens' writes are decayed to the chunk's end, the old state is not): the 'forgot the "
        "decay on the carried state' bug of chunked scans. Trigger: A d != 0 and T past the chunk."
    ),
    kills=("matches_reference", "chunk_size_invariant"),
)

chunk_last_token_dropped = mutant(
    "ssd_scan", _k,
    [("    to_end = tl.where(t_ok, tl.exp(last - cum), 0.0)",
      "    to_end = tl.where(t_ok & (rows < tl.max(rows, axis=0)), tl.exp(last - cum), 0.0)")],
    name="chunk_last_token_dropped",
    bug=(
        "The write of each chunk's last token never reaches the carried state (an off-by-one in "
        "the chunk's row mask, rows < C - 1): outputs inside the chunk are right, every later chunk "
        "and the final state miss that token. Trigger: T >= the chunk size (16 with chunk_size=16)."
    ),
    kills=("matches_reference", "chunk_size_invariant"),
)

exclusive_intra_chunk_mask = mutant(
    "ssd_scan", _k,
    [("        scores = tl.where(lower, tl.dot(c, tl.trans(b), input_precision=DOT_PRECISION) * ratio * d[None, :], "
      "0.0)",
      "        scores = tl.where(rows[None, :] < rows[:, None], tl.dot(c, tl.trans(b), "
      "input_precision=DOT_PRECISION) * ratio * d[None, :], 0.0)")],
    name="exclusive_intra_chunk_mask",
    bug=(
        "The forward's intra-chunk scores use j < i instead of j <= i: y_t reads the state before "
        "its own token's write (the inclusive/exclusive mix-up between a scan's output and its "
        "state). The carried state is right. Trigger: any token with d_t x_t (C_t . B_t) != 0."
    ),
    # not token_by_token_equals_chunked: a one-token call leaves out the token's own write as the
    # whole call does, and the carried state is right, so the two agree
    kills=("matches_reference",),
)

initial_state_ignored = mutant(
    "ssd_scan", _k,
    [("        state = tl.load(H0 + nh * DP * DN + state_offs, mask=pn_ok, other=0.0)",
      "        state = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)")],
    name="initial_state_ignored",
    bug=(
        "The forward starts every sequence from a zero state whatever initial_state holds (a "
        "prefill kernel reused for chunked prefill or decoding). Trigger: a nonzero initial state."
    ),
    kills=("matches_reference", "zero_input_decays_initial_state", "split_in_two_carries_state",
           "token_by_token_equals_chunked", "zero_step_holds_state"),
)

softplus_skipped = mutant(
    "ssd_scan", _k,
    [("    if DT_SOFTPLUS:\n        v = _softplus(v)\n", "")],
    name="softplus_skipped",
    bug=(
        "The step never goes through softplus (dt + dt_bias clamped as it is, dt_softplus ignored): "
        "a flag dropped between a module and its kernel. Trigger: dt_softplus=True."
    ),
    kills=("matches_reference",),
)

skip_term_dropped = mutant(
    "ssd_scan", _k,
    [("\n            + tl.dot(scores, x, input_precision=DOT_PRECISION) + d_skip * x\n",
      "\n            + tl.dot(scores, x, input_precision=DOT_PRECISION)\n")],
    name="skip_term_dropped",
    bug=(
        "The forward leaves out the skip connection D x_t (D loaded, never added). Trigger: D "
        "given and nonzero."
    ),
    kills=("matches_reference", "zero_step_holds_state"),
)

groups_interleaved = mutant(
    "ssd_scan", _k,
    [("    grp = h // HEADS_PER_GROUP  # the group whose B and C this head reads",
      "    grp = h % (H // HEADS_PER_GROUP)")],
    name="groups_interleaved",
    bug=(
        "Head h reads group h mod G instead of h // (H / G) (repeat where mamba_ssm's layout means "
        "repeat_interleave): with G = 1 or G = H right, otherwise B and C of another group. "
        "Trigger: 1 < G < H."
    ),
    kills=("matches_reference",),
)

first_sequence_state_for_all = mutant(
    "ssd_scan", _k,
    [("        state = tl.load(H0 + nh * DP * DN + state_offs, mask=pn_ok, other=0.0)",
      "        state = tl.load(H0 + h * DP * DN + state_offs, mask=pn_ok, other=0.0)")],
    name="first_sequence_state_for_all",
    bug=(
        "Every sequence starts from the first sequence's initial state (indexed by head only, not "
        "by sequence and head; mamba_ssm's varlen call takes one initial state, for the first "
        "sequence). Trigger: two or more sequences with different initial states."
    ),
    kills=("matches_reference", "packed_equals_separate_calls"),
)

final_state_into_initial_state = mutant(
    "ssd_scan", _k,
    [("    tl.store(HT + nh * DP * DN + state_offs, state, mask=pn_ok)\n",
      "    tl.store(HT + nh * DP * DN + state_offs, state, mask=pn_ok)\n"
      "    if HAS_H0:\n"
      "        tl.store(H0 + nh * DP * DN + state_offs, state, mask=pn_ok)\n")],
    name="final_state_into_initial_state",
    bug=(
        "The forward also writes the final state over initial_state (a decoding cache's in-place "
        "update, where the contract returns a new tensor). Trigger: a contiguous float32 initial state."
    ),
    kills=("inputs_unchanged",),
)

final_state_workspace_reused = mutant(
    "ssd_scan", _k,
    [("    final = torch.empty((S, run.H, run.P, run.N), dtype=torch.float32, device=x.device)",
      "    final = _WORKSPACE.setdefault((S, run.H, run.P, run.N, x.device),\n"
      "                                  torch.empty((S, run.H, run.P, run.N), dtype=torch.float32, "
      "device=x.device))"),
     ("_P_TILE = 32", "_WORKSPACE = {}\n_P_TILE = 32")],
    name="final_state_workspace_reused",
    bug=(
        "The final state is written to a workspace cached per shape and returned as it is: the next "
        "call with the same shapes overwrites the state the previous caller holds. Trigger: two "
        "calls of one shape."
    ),
    kills=("calls_independent",),
)

chunk_alternates_per_call = mutant(
    "ssd_scan", _k,
    [("    chunk = _DEFAULT_CHUNK if chunk_size is None else int(chunk_size)",
      "    ssd_scan.calls = getattr(ssd_scan, 'calls', 0) + 1\n"
      "    chunk = (_DEFAULT_CHUNK if ssd_scan.calls % 2 else 16) if chunk_size is None else int(chunk_size)")],
    name="chunk_alternates_per_call",
    bug=(
        "Every other call runs 16-token chunks instead of the default (a tuner or cache that picks "
        "per call): the sums round in another grouping and two calls on the same inputs differ. "
        "Trigger: T past 16."
    ),
    kills=("deterministic",),
)

decay_gradient_without_chunk_start = mutant(
    "ssd_scan", _k,
    [("        d_last = tl.sum(e, axis=0) + tl.exp(last) * tl.sum(tl.sum(adj * state, axis=1), axis=0)",
      "        d_last = tl.sum(e, axis=0)")],
    name="decay_gradient_without_chunk_start",
    bug=(
        "The backward leaves out the gradient through the decay of the chunk's start state to its "
        "end (exp(G_last) h_0 against the carried adjoint): dt, dt_bias and A lose it. The forward "
        "is right. Trigger: an initial state or T past the chunk, with a gradient of the final state."
    ),
    kills=("gradients_match_reference",),
)

checkpoints_overwritten_in_backward = mutant(
    "ssd_scan", _k,
    [("        tl.store(DDP + part, d_step + a_h * da, mask=t_ok)\n",
      "        tl.store(DDP + part, d_step + a_h * da, mask=t_ok)\n"
      "        tl.store(CKPT + ((first_chunk + c0 // CHUNK) * H + h) * DP * DN + state_offs, adj, mask=pn_ok)\n")],
    name="checkpoints_overwritten_in_backward",
    bug=(
        "The backward reuses the forward's saved chunk states as its workspace, writing the adjoint "
        "over each after reading it: the first backward is right, a second one through the same "
        "graph reads adjoints where it expects states. Trigger: a second backward."
    ),
    kills=("backward_repeatable",),
)

MUTANTS = (
    state_carried_without_decay, chunk_last_token_dropped, exclusive_intra_chunk_mask, initial_state_ignored,
    softplus_skipped, skip_term_dropped, groups_interleaved, first_sequence_state_for_all,
    final_state_into_initial_state, final_state_workspace_reused, chunk_alternates_per_call,
    decay_gradient_without_chunk_start, checkpoints_overwritten_in_backward,
)
