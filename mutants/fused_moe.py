"""Planted bugs in the fused mixture-of-experts layer (patches of ``kernels/fused_moe.py``, and
wrappers around it for the bugs that live outside it).

Each patch is one exact source edit of the project kernel; see ``tritoncheck/mutation.py``.
Triggers are for the kernel's blocks under the interpreter (32 rows a block, 128 columns, 128
of K a step) and on a GPU (64, 64, 64). The 32-bit pair offsets are in ``mutants/offsets.py``
(the large-index check kills them).
"""
from __future__ import annotations

import torch

from tritoncheck.kernels import fused_moe as _k
from tritoncheck.mutation import Mutant, mutant

expert_offset_unpadded = mutant(
    "fused_moe", _k,
    [("    slot = block_start[expert_of] * block_m + rank\n",
      "    slot = first[expert_of] + rank\n")],
    name="expert_offset_unpadded",
    bug=(
        "Each expert's rows are placed at its offset in the unpadded sorted order (the cumulative token counts) "
        "while its blocks start at the padded offsets: the wrong expert offset, so an expert's tokens land in "
        "the blocks of the expert before it and are multiplied by its weights. Trigger: an expert, not the last "
        "one used, whose token count is not a multiple of the block (32 rows here, 64 on a GPU)."
    ),
    kills=("matches_reference", "grouped_equals_separate_experts"),
)

empty_expert_renumbered = mutant(
    "fused_moe", _k,
    [("    block_expert = torch.repeat_interleave(torch.arange(experts, device=device), blocks).to(torch.int32)\n",
      "    block_expert = torch.repeat_interleave(torch.arange(int((blocks > 0).sum()), device=device),\n"
      "                                           blocks[blocks > 0]).to(torch.int32)\n")],
    name="empty_expert_renumbered",
    bug=(
        "The experts that received tokens are numbered densely (an empty expert skipped in the numbering as it is "
        "in the launch): every expert after an empty one reads the weights of the expert before it, the empty "
        "one's among them. Trigger: an expert with no token before one with tokens."
    ),
    kills=("matches_reference", "unused_experts_never_read"),
)

padding_rows_into_pair_0 = mutant(
    "fused_moe", _k,
    [("    sorted_pairs = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)\n",
      "    sorted_pairs = torch.full((num_blocks * block_m,), 0, dtype=torch.int32, device=device)\n")],
    name="padding_rows_into_pair_0",
    bug=(
        "A block's padding rows hold pair 0 instead of a sentinel past the last pair (a zero-initialised "
        "sorted-ids buffer): they pass the row mask, compute token 0 with the block's expert and write it over "
        "token 0's first slot. Trigger: an expert whose token count is not a multiple of the block."
    ),
    kills=("matches_reference",),
)

accumulate_in_bf16 = mutant(
    "fused_moe", _k,
    [("            acc_g = tl.dot(a, bg, acc_g, input_precision=PRECISION)\n"
      "            acc_u = tl.dot(a, bu, acc_u, input_precision=PRECISION)\n",
      "            acc_g = tl.dot(a, bg, acc_g, input_precision=PRECISION).to(tl.bfloat16).to(tl.float32)\n"
      "            acc_u = tl.dot(a, bu, acc_u, input_precision=PRECISION).to(tl.bfloat16).to(tl.float32)\n")],
    name="accumulate_in_bf16",
    bug=(
        "The gate and up projections keep their running sums over H in bfloat16 (rounded after every step of "
        "K): 8 significant bits where the contract accumulates in fp32. Trigger: H past one step (128 here, 64 on "
        "a GPU), weights in x's dtype."
    ),
    kills=("matches_reference",),
)

weights_not_renormalised = mutant(
    "fused_moe", _k,
    [("    if renormalize:\n        weights = weights / weights.sum(dim=-1, keepdim=True)\n", "")],
    name="weights_not_renormalised",
    bug=(
        "With router logits and renormalize=True the top-k probabilities are used as they are, not divided by "
        "their sum: each token's output is scaled by the probability mass its k experts hold. Trigger: router "
        "logits, renormalize=True, k < E."
    ),
    kills=("matches_reference",),
)

tile_first_row_weight = mutant(
    "fused_moe", _k,
    [("    weight = tl.load(WEIGHTS + (pairs // TOP_K) * stride_wt + (pairs % TOP_K) * stride_wj, mask=row_ok, "
      "other=0.0)\n",
      "    first = tl.load(SORTED_PAIRS + block * BLOCK_M).to(tl.int64)\n"
      "    weight = tl.load(WEIGHTS + (first // TOP_K) * stride_wt + (first % TOP_K) * stride_wj) + "
      "tl.zeros([BLOCK_M], dtype=tl.float32)\n")],
    name="tile_first_row_weight",
    bug=(
        "Every row of a block is weighted by the routing weight of the block's first row (a weight loaded once "
        "per block, as for a per-expert scale). Trigger: a block whose rows' weights differ."
    ),
    kills=("matches_reference", "token_permutation_equivariant"),
)

fp8_tail_scale_from_previous = mutant(
    "fused_moe", _k,
    [("            kb = k0 // SCALE_BLOCK\n",
      "            kb = tl.maximum(tl.minimum(k0 // SCALE_BLOCK, HIDDEN // SCALE_BLOCK - 1), 0)\n")],
    name="fp8_tail_scale_from_previous",
    bug=(
        "The number of w1's scale blocks along H is taken as H // 128 (floor, not ceil): the short last block "
        "of H is dequantised with the scales of the block before it. Trigger: fp8 weights with 128 x 128 block "
        "scales, H past 128 and not a multiple of it."
    ),
    kills=("matches_reference",),
)

alignment_cached_by_shape = mutant(
    "fused_moe", _k,
    [("def _align(ids: torch.Tensor", "_ALIGNED: dict = {}\n\n\ndef _align(ids: torch.Tensor"),
     ("    sorted_pairs, block_expert = _align(topk_ids, experts, block_m)\n",
      "    sorted_pairs, block_expert = _ALIGNED.setdefault((tuple(topk_ids.shape), experts, str(x.device)),\n"
      "                                                     _align(topk_ids, experts, block_m))\n")],
    name="alignment_cached_by_shape",
    bug=(
        "The tokens' sorting by expert is computed once per shape and reused (as a CUDA graph captured on the "
        "first batch freezes it): a later call with other routing multiplies its tokens by the first call's "
        "experts. Killed by calls_independent (and by any check whose second call routes otherwise)."
    ),
    kills=("calls_independent",),
)

slots_summed_by_turns = mutant(
    "fused_moe", _k,
    [("    return out.view(tokens, top, hidden).sum(dim=1).to(x.dtype)\n",
      "    _TURN[0] += 1\n"
      "    slots = out.view(tokens, top, hidden)\n"
      "    slots = slots.flip(1) if _TURN[0] % 2 else slots\n"
      "    y = slots[:, 0].clone()\n"
      "    for j in range(1, top):\n"
      "        y += slots[:, j]\n"
      "    return y.to(x.dtype)\n"),
     ("def _align(ids: torch.Tensor", "_TURN = [0]\n\n\ndef _align(ids: torch.Tensor")],
    name="slots_summed_by_turns",
    bug=(
        "Every other call sums a token's k slots in the reverse order (as atomic adds in whatever order the "
        "blocks finish): each result within the rule, two calls on the same inputs differing in their last "
        "bits. Trigger: k >= 3. Killed by deterministic."
    ),
    kills=("deterministic",),
)


# --- bugs outside the kernel: wrappers -----------------------------------------------------

def _wrapper(fn, *, bug: str, kills: tuple[str, ...]) -> Mutant:
    fn.dtypes = _k.fused_moe.dtypes
    fn.supports_backward = False
    return Mutant(name=fn.__name__, op="fused_moe", fn=fn, bug=bug, kills=kills, module=__name__)


def routing_sorted_in_place(x, w1, w2, topk_weights=None, topk_ids=None, router_logits=None, top_k=None,
                            renormalize=True, w1_scale=None, w2_scale=None):
    if topk_ids is not None:
        order = torch.argsort(topk_ids, dim=1, stable=True)
        topk_ids.copy_(torch.gather(topk_ids, 1, order))
        topk_weights.copy_(torch.gather(topk_weights, 1, order))
    return _k.fused_moe(x, w1, w2, topk_weights, topk_ids, router_logits, top_k, renormalize, w1_scale, w2_scale)


routing_sorted_in_place = _wrapper(
    routing_sorted_in_place,
    bug="Each token's slots sorted by expert id in the caller's topk_ids and topk_weights (to make the alignment "
        "cheaper): y is right, the caller's routing tensors are not in the order it wrote them, and whatever it "
        "pairs with them (a shared-expert gate, the next layer's auxiliary loss) no longer lines up. Trigger: "
        "precomputed routing, k >= 2, a row not already sorted. Killed by inputs_unchanged.",
    kills=("inputs_unchanged",))


def duplicate_slots_overwritten(x, w1, w2, topk_weights=None, topk_ids=None, router_logits=None, top_k=None,
                                renormalize=True, w1_scale=None, w2_scale=None):
    if topk_ids is not None:
        dense = torch.zeros((topk_ids.shape[0], w1.shape[0]), dtype=torch.float32, device=x.device)
        dense.scatter_(1, topk_ids.long(), topk_weights)  # a token's [T, E] routing row: one write per expert wins
        topk_weights = torch.gather(dense, 1, topk_ids.long())
    return _k.fused_moe(x, w1, w2, topk_weights, topk_ids, router_logits, top_k, renormalize, w1_scale, w2_scale)


duplicate_slots_overwritten = _wrapper(
    duplicate_slots_overwritten,
    bug="The routing goes through a dense [T, E] weight matrix written with scatter (a mask-based MoE): a token "
        "that names one expert in two slots keeps one of the two weights, in both slots, instead of their sum. "
        "Trigger: a row of topk_ids naming an expert twice with unequal weights.",
    kills=("duplicate_ids_add", "matches_reference"))
