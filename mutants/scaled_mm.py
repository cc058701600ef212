"""Planted bugs in the block-scaled low-precision GEMM (patches of ``kernels/scaled_mm.py``,
and wrappers around it for the bugs that live outside a kernel).

Each patch is one exact source edit of the project kernel; see ``tritoncheck/mutation.py``.
Triggers are for the kernel's tiles under the interpreter (32 x 32, K in steps of 32) and on
a GPU (128 x 128, K in steps of 128); the quantisation block is the contract's 128. The
32-bit offset overflow is in ``mutants/offsets.py`` (the large-index check kills it).
"""
from __future__ import annotations

import torch

from tritoncheck.kernels import scaled_mm as _k
from tritoncheck.mutation import Mutant, mutant
from tritoncheck.references.quantisation import expand
from tritoncheck.references.scaled_mm import a_groups, b_groups

k_tail_dropped = mutant(
    "scaled_mm", _k,
    [("        a, b, a_scale, b_scale, bias if bias is not None else c, c, m, n, k,\n",
      "        a, b, a_scale, b_scale, bias if bias is not None else c, c, m, n, k // SCALE_BLOCK * SCALE_BLOCK,\n")],
    name="k_tail_dropped",
    bug=(
        "The kernel walks K in whole quantisation blocks only: the last K % 128 columns of a (rows of b) are "
        "never read, as in a kernel written for K a multiple of 128 (DeepSeek-V3's shapes) and run on one "
        "that is not. Trigger: K not a multiple of 128 (K < 128 gives c = bias)."
    ),
    kills=("matches_reference",),
)

tail_block_scale_from_previous = mutant(
    "scaled_mm", _k,
    [("            kb = k0 // SCALE_BLOCK\n",
      "            kb = tl.maximum(tl.minimum(k0 // SCALE_BLOCK, K // SCALE_BLOCK - 1), 0)\n")],
    name="tail_block_scale_from_previous",
    bug=(
        "The number of scale blocks along K is taken as K // 128 (floor, not ceil): the short last block's "
        "values are scaled by the block before's scales (a scale block off by one). Trigger: K past 128 and "
        "not a multiple of it, with a block scale on a or b whose last two blocks differ."
    ),
    kills=("matches_reference", "scale_block_invariant"),
)

accumulate_in_bf16 = mutant(
    "scaled_mm", _k,
    [("            acc += part * (sa[:, None] * sb[None, :])\n",
      "            acc = (acc + part * (sa[:, None] * sb[None, :])).to(tl.bfloat16).to(tl.float32)\n"),
     ("            acc_k = _dot(a, b, acc_k, IS_INT, IMPRECISE, UPCAST)\n",
      "            acc_k = _dot(a, b, acc_k, IS_INT, IMPRECISE, UPCAST).to(tl.bfloat16).to(acc_k.dtype)\n")],
    name="accumulate_in_bf16",
    bug=(
        "The running sum over K is kept in bfloat16 (rounded after every K step): 8 significant bits where the "
        "contract asks fp32, the error growing with the number of steps. Trigger: K past one step (32 under the "
        "interpreter, 128 on a GPU)."
    ),
    kills=("matches_reference",),
)

a_scale_per_column = mutant(
    "scaled_mm", _k,
    [("        acc = acc_k.to(tl.float32) * (sa[:, None] * sb[None, :])\n",
      "        acc = acc_k.to(tl.float32) * (sa[None, :] * sb[None, :])\n")],
    name="a_scale_per_column",
    bug=(
        "a's per-row scales are broadcast along the wrong axis: column j of a tile gets the scale of the "
        "tile's row j (a transposed broadcast, as when per-token and per-channel scales are swapped). Trigger: "
        "a per-row a_scale whose rows differ, with scales constant along K."
    ),
    kills=("matches_reference",),
)

a_scale_of_tile_first_row = mutant(
    "scaled_mm", _k,
    [("    sa_ptrs = A_SCALE + rows * stride_sam\n",
      "    sa_ptrs = A_SCALE + (rows * 0 + tl.program_id(0).to(tl.int64) * BLOCK_M) * stride_sam\n")],
    name="a_scale_of_tile_first_row",
    bug=(
        "Every row of a tile reads the a_scale of the tile's first row (a scale loaded once per tile, as for a "
        "per-tensor scale). Trigger: a per-row or per-block a_scale with M >= 2."
    ),
    kills=("matches_reference", "rows_independent"),
)

b_scale_of_tile_first_column = mutant(
    "scaled_mm", _k,
    [("    sb_ptrs = B_SCALE + (cols // B_N_GROUP) * stride_sbn\n",
      "    sb_ptrs = B_SCALE + ((cols * 0 + tl.program_id(1).to(tl.int64) * BLOCK_N) // B_N_GROUP) * stride_sbn\n")],
    name="b_scale_of_tile_first_column",
    bug=(
        "Every column of a tile reads the b_scale of the tile's first column: right for 128 x 128 blocks with "
        "128-wide tiles, wrong per column. Trigger: a per-column b_scale with N >= 2."
    ),
    kills=("matches_reference", "columns_independent"),
)


# --- bugs outside the kernel: wrappers -----------------------------------------------------

def _wrapper(fn, *, bug: str, kills: tuple[str, ...]) -> Mutant:
    fn.dtypes = _k.scaled_mm.dtypes
    fn.supports_backward = False
    return Mutant(name=fn.__name__, op="scaled_mm", fn=fn, bug=bug, kills=kills, module=__name__)


def dequantised_in_bf16(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
    sa = expand(a_scale, a.shape, a_groups(a_scale.shape, a.shape))
    sb = expand(b_scale, b.shape, b_groups(b_scale.shape, b.shape))
    c = (a.float() * sa).bfloat16().float() @ (b.float() * sb).bfloat16().float()
    return (c if bias is None else c + bias.float()).to(out_dtype)


dequantised_in_bf16 = _wrapper(
    dequantised_in_bf16,
    bug="Trick: the fp8 GEMM dressed up as a bf16 one: both operands dequantised into bfloat16 (a * a_scale "
        "rounded to 8 significant bits) and multiplied; every product errs by ~2^-9, which a bf16 output's own "
        "rounding hides on most inputs (KernelBench-Hard's fp8 solutions until its check was tightened). "
        "Killed by computes_in_input_format.",
    kills=("computes_in_input_format",))


def scales_folded_in_place(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
    if a_scale.numel() == 1 and b_scale.numel() == 1:
        a_scale.mul_(b_scale.reshape(a_scale.shape))  # "one scale instead of two", in the caller's tensor
        b_scale = torch.ones_like(b_scale)
    return _k.scaled_mm(a, b, a_scale, b_scale, bias, out_dtype)


scales_folded_in_place = _wrapper(
    scales_folded_in_place,
    bug="Two per-tensor scales folded into one in place (a_scale *= b_scale): the result is right, the caller's "
        "a_scale is not, and the next call (the next layer, the next step) multiplies by b_scale twice. Trigger: "
        "per-tensor a_scale and b_scale. Killed by inputs_unchanged.",
    kills=("inputs_unchanged",))

_buffers: dict[tuple, torch.Tensor] = {}


def shared_output_buffer(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
    c = _k.scaled_mm(a, b, a_scale, b_scale, bias, out_dtype)
    key = (tuple(c.shape), c.dtype, c.device)
    out = _buffers.setdefault(key, torch.empty_like(c))
    return out.copy_(c)


shared_output_buffer = _wrapper(
    shared_output_buffer,
    bug="The output is written into one preallocated buffer per shape and dtype (a workspace cache): every call "
        "returns the same tensor, so a later call overwrites what an earlier one returned. Killed by "
        "calls_independent.",
    kills=("calls_independent",))

_calls = [0]


def split_k_by_turns(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
    _calls[0] += 1
    k = a.shape[1]
    half = _k.SCALE_BLOCK if k > _k.SCALE_BLOCK else 0  # the first scale block, then the rest
    if _calls[0] % 2 or half == 0:
        return _k.scaled_mm(a, b, a_scale, b_scale, bias, out_dtype)
    # two parts at a scale-block boundary, each in fp32, summed: right, but rounded otherwise
    cut_a = a_scale[:, : half // _k.SCALE_BLOCK] if a_scale.shape[1] > 1 else a_scale
    rest_a = a_scale[:, half // _k.SCALE_BLOCK:] if a_scale.shape[1] > 1 else a_scale
    cut_b = b_scale[: half // _k.SCALE_BLOCK] if b_scale.shape[0] > 1 else b_scale
    rest_b = b_scale[half // _k.SCALE_BLOCK:] if b_scale.shape[0] > 1 else b_scale
    first = _k.scaled_mm(a[:, :half], b[:half], cut_a, cut_b, None, torch.float32)
    second = _k.scaled_mm(a[:, half:], b[half:], rest_a, rest_b, None, torch.float32)
    c = first + second
    return (c if bias is None else c + bias.float()).to(out_dtype)


split_k_by_turns = _wrapper(
    split_k_by_turns,
    bug="Every other call splits K in two at a scale-block boundary and adds the parts (a split-K "
        "configuration an autotuner or a heuristic picks by turns): each result is within the rule, but two "
        "calls on the same inputs differ in their last bits. Trigger: K past 128. Killed by deterministic.",
    kills=("deterministic",))
