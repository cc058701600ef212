"""Planted bugs in ``tritoncheck.kernels.paged_decode_attention``: each is the project kernel
with one source patch (``tritoncheck/mutation.py``). The key block is 16 positions under the
interpreter, 64 on the GPU; page sizes are drawn from properties/paged_decode_attention.py's
PAGE_SIZES (16, 1, 5, 8, 3, 32), query tokens T from 1 to 8, num_splits from NUM_SPLITS
(None, 1, 3) and, for split_k_equals_unsplit, SPLITS (2, 3, 4, 7, 16).
"""
from __future__ import annotations

import tritoncheck.kernels.paged_decode_attention as _kernel
from tritoncheck.mutation import mutant

slot_by_power_of_two_mask = mutant(
    "paged_decode_attention", _kernel,
    [("        slot = pos % PAGE_SIZE\n", "        slot = pos & (PAGE_SIZE - 1)\n")],
    name="slot_by_power_of_two_mask",
    bug="The slot within a page is pos & (page_size - 1): right for page sizes that are powers of two "
        "(vLLM's 16), wrong for any other. Trigger: page size 3 or 5 and a sequence past one slot.",
    kills=("matches_reference", "page_size_invariant"),
)

contiguous_pages_assumed = mutant(
    "paged_decode_attention", _kernel,
    [("        page = tl.load(TABLE + b.to(tl.int64) * stride_tb + (pos // PAGE_SIZE) * stride_tp, mask=valid, other=0)\n",
      "        page = tl.load(TABLE + b.to(tl.int64) * stride_tb + 0 * pos, mask=valid, other=0) + pos // PAGE_SIZE\n")],
    name="contiguous_pages_assumed",
    bug="Only a sequence's first table entry is read; its later pages are taken to follow it in "
        "memory. Right while pages are allocated in order, wrong once the allocator hands out freed "
        "pages. Trigger: a sequence of two pages or more whose pages are not consecutive.",
    kills=("matches_reference", "page_permutation_invariant"),
)

whole_last_page_read = mutant(
    "paged_decode_attention", _kernel,
    [("        valid = pos < hi\n", "        valid = pos < (hi + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE\n")],
    name="whole_last_page_read",
    bug="A sequence's last page is read whole: the slots past its length (stale tokens of an earlier "
        "request, or garbage) join the softmax. Trigger: a length that is not a multiple of the page size.",
    kills=("matches_reference", "free_pages_never_read"),
)

current_token_dropped = mutant(
    "paged_decode_attention", _kernel,
    [("    visible = n - QUERIES + 1 + t\n", "    visible = n - QUERIES + t\n")],
    name="current_token_dropped",
    bug="The newest token (the query's own key, appended to the cache this step) is left out: "
        "decode attends to seq_lens - 1 keys. Class: the cache write and the attention call disagree "
        "on whether the length counts the new token. Trigger: any sequence of two keys or more.",
    kills=("matches_reference", "decode_is_last_rows_of_dense_causal"),
)

empty_sequence_nan = mutant(
    "paged_decode_attention", _kernel,
    [("    o = acc / tl.where(l_i == 0.0, 1.0, l_i)\n", "    o = acc / l_i\n")],
    name="empty_sequence_nan",
    bug="A sequence with no cached token (seq_lens 0: a padded batch slot) divides 0 by 0: o = NaN. "
        "Trigger: seq_lens[b] = 0.",
    kills=("matches_reference",),
)

output_written_into_q = mutant(
    "paged_decode_attention", _kernel,
    [("    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)\n",
      "    o = q if q.is_contiguous() else torch.empty(q.shape, dtype=q.dtype, device=q.device)\n")],
    name="output_written_into_q",
    bug="o is written over q when q is contiguous (each query row is read before its o is stored). "
        "Class: an in-place shortcut; the contract never modifies inputs. Trigger: a contiguous q.",
    kills=("inputs_unchanged",),
)

key_block_alternates = mutant(
    "paged_decode_attention", _kernel,
    [("    block_n = 16 if _interpreting() else 64\n",
      "    block_n = 16 if _interpreting() else 64\n"
      "    paged_decode_attention.calls = getattr(paged_decode_attention, 'calls', 0) + 1\n"
      "    block_n = block_n * (1 + paged_decode_attention.calls % 2)\n")],
    name="key_block_alternates",
    bug="Every other call walks the keys in blocks twice as wide, so the sums round in another order. "
        "Class: a tuner or cache that picks a config per call. Trigger: more keys than one block.",
    kills=("deterministic",),
)

output_buffer_shared = mutant(
    "paged_decode_attention", _kernel,
    [("    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)\n",
      "    o = paged_decode_attention.__dict__.setdefault((tuple(q.shape), q.dtype, q.device), "
      "torch.empty(q.shape, dtype=q.dtype, device=q.device))\n")],
    name="output_buffer_shared",
    bug="o is written into one buffer per shape, kept across calls (a decode workspace reused between "
        "steps): a later call overwrites the o an earlier caller holds. Trigger: two calls of one shape.",
    kills=("calls_independent",),
)

draft_token_sees_the_next = mutant(
    "paged_decode_attention", _kernel,
    [("    visible = n - QUERIES + 1 + t\n", "    visible = tl.minimum(n - QUERIES + 2 + t, n)\n")],
    name="draft_token_sees_the_next",
    bug="The causal offset among the query tokens is off by one: query t also sees token t + 1 "
        "(the last query still sees exactly the sequence). Right for one query token per sequence, "
        "wrong for speculative decoding's T > 1. Trigger: T >= 2 and a sequence of two tokens or more.",
    kills=("matches_reference", "decode_is_last_rows_of_dense_causal"),
)

chunk_remainder_dropped = mutant(
    "paged_decode_attention", _kernel,
    [("    chunk = (n + NUM_SPLITS - 1) // NUM_SPLITS\n", "    chunk = n // NUM_SPLITS\n")],
    name="chunk_remainder_dropped",
    bug="Split-K chunks are n // S keys long, so the n % S keys past S chunks fall in no chunk (a "
        "sequence shorter than S loses every key). Right when S divides the length. Trigger: "
        "num_splits > 1 and a length that it does not divide.",
    kills=("matches_reference", "split_k_equals_unsplit"),
)

merge_weights_without_max = mutant(
    "paged_decode_attention", _kernel,
    [("        w = tl.exp2(tl.load(PART_LSE + first + split) - m)  # a chunk without a key: exp2(-inf) = 0\n",
      "        w = tl.exp2(tl.load(PART_LSE + first + split))\n")],
    name="merge_weights_without_max",
    bug="The split-K merge weighs chunk c by exp2(lse_c), not exp2(lse_c - max lse): the same "
        "ratios in exact arithmetic, but a chunk of lse past 128 (log2 units) overflows fp32 "
        "(inf / inf = NaN) and rows whose every lse is below -149 underflow to 0 / 0 (o = 0). "
        "Trigger: num_splits > 1 and scores of a few hundred or more (or below minus that).",
    kills=("split_k_equals_unsplit",),
)
