"""Planted bugs in the rope and swiglu kernels (``kernels/elementwise.py``), one source patch each."""
from __future__ import annotations

from tritoncheck.kernels import elementwise as _kernel
from tritoncheck.mutation import mutant

__all__ = [
    "half_split_pairs", "sin_sign_flipped", "backward_same_rotation", "last_row_block_unwritten",
    "sigmoid_overflow", "dup_missing_sigmoid", "gradients_into_saved_inputs", "x_strides_assumed_contiguous",
    "gate_strides_assumed_contiguous", "autotune_without_reset_to_zero", "swiglu_truncating_store",
]

# ---------------------------------------------------------------------------- rope

half_split_pairs = mutant(
    "rope",
    _kernel,
    [("col_a = 2 * pairs\n    col_b = 2 * pairs + 1", "col_a = pairs\n    col_b = pairs + HALF")],
    name="half_split_pairs",
    bug=(
        "Rotates the pairs (i, i + D/2) instead of the interleaved pairs (2i, 2i+1): the "
        "GPT-NeoX 'rotate_half' layout used where the GPT-J/LLaMA interleaved layout is "
        "expected (a classic checkpoint-conversion bug). Forward and backward share the "
        "layout, so the gradient is the adjoint of the wrong map. Triggered by any D >= 4 "
        "(for D = 2 both layouts pair columns 0 and 1)."
    ),
    kills=("matches_reference", "gradients_match_reference", "pair_norms_preserved"),
)

sin_sign_flipped = mutant(
    "rope",
    _kernel,
    [("sn = sn * sin_sign", "sn = -sn * sin_sign")],
    name="sin_sign_flipped",
    bug=(
        "The sign of sin is flipped, i.e. the kernel rotates by -theta (the transposed "
        "rotation matrix, or sin(-theta) from a wrong angle table). In forward and backward. "
        "Still a rotation, so pair norms are preserved. Triggered by any sin != 0."
    ),
    kills=("matches_reference", "gradients_match_reference"),
)

backward_same_rotation = mutant(
    "rope",
    _kernel,
    [("dx = _rope_launch(dy, cos, sin, sin_sign=-1.0)", "dx = _rope_launch(dy, cos, sin, sin_sign=1.0)")],
    name="backward_same_rotation",
    bug=(
        "The backward rotates dy by +theta (reusing the forward) instead of by -theta (the "
        "transpose of the rotation). The forward is right. Triggered by any sin != 0 when "
        "gradients are checked."
    ),
    kills=("gradients_match_reference",),
)

last_row_block_unwritten = mutant(
    "rope",
    _kernel,
    [("grid = (triton.cdiv(rows, block_r), triton.cdiv(half, block_p))",
      "grid = (rows // block_r, triton.cdiv(half, block_p))")],
    name="last_row_block_unwritten",
    bug=(
        "The grid counts row blocks with floor division instead of a ceiling, so the last, "
        "partial block of rows is never written and the output keeps whatever torch.empty "
        "handed back (often the previous call's answer from the caching allocator, or zeros, "
        "which hides it). Forward and backward. Triggered by any B * H * S that is not a "
        "multiple of the kernel's row block; seen every time only because the suite fills "
        "fresh allocations with NaN."
    ),
    kills=("matches_reference", "gradients_match_reference"),
)

x_strides_assumed_contiguous = mutant(
    "rope",
    _kernel,
    [("x.stride(0), x.stride(1), x.stride(2), x.stride(3),", "h * s * d, s * d, d, 1,")],
    name="x_strides_assumed_contiguous",
    bug=(
        "The wrapper passes x's strides as if x were contiguous [B, H, S, D] (computed from "
        "the shape, not read from the tensor). Right for a contiguous x; a transposed view "
        "([B, S, H, D] memory seen as [B, H, S, D], as attention code passes), a sliced or "
        "offset x is read at the wrong addresses (its gaps hold NaN). Forward and backward "
        "(dy takes the same path). Triggered by any non-contiguous x."
    ),
    kills=("matches_reference", "layout_invariant"),
)

# ---------------------------------------------------------------------------- swiglu

sigmoid_overflow = mutant(
    "swiglu",
    _kernel,
    [(
        "e = tl.exp(-tl.abs(g))\n    return tl.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))",
        "e = tl.exp(g)\n    return e / (1.0 + e)",
    )],
    name="sigmoid_overflow",
    bug=(
        "sigmoid(g) computed as exp(g) / (1 + exp(g)): exp overflows to inf for g > ~88.7 "
        "(fp32 arithmetic) and inf / inf is NaN, so y and both gradients are NaN where the "
        "gate is large and positive (the unstable-logistic bug). Triggered by a gate above "
        "~89 (e.g. a 'near the dtype max' or outlier value in fp16/bf16, or 100.0 in fp32)."
    ),
    kills=("matches_reference", "gradients_match_reference"),
)

dup_missing_sigmoid = mutant(
    "swiglu",
    _kernel,
    [("dup = dy * g * s", "dup = dy * g")],
    name="dup_missing_sigmoid",
    bug=(
        "The backward gives dup = dy * gate instead of dy * gate * sigmoid(gate) (a dropped "
        "factor in a hand-written backward). The forward and dgate are right. Triggered by "
        "any gate != 0 when gradients are checked."
    ),
    kills=("gradients_match_reference",),
)

gate_strides_assumed_contiguous = mutant(
    "swiglu",
    _kernel,
    [("g2, u2, y,\n                g2.stride(0), g2.stride(1),", "g2, u2, y,\n                n, 1,")],
    name="gate_strides_assumed_contiguous",
    bug=(
        "The forward launch passes gate's row and column strides as (N, 1), as if the [M, N] "
        "view of gate were contiguous. Right for a contiguous gate; a transposed, sliced or "
        "offset gate is read at the wrong addresses. Triggered by any non-contiguous gate."
    ),
    kills=("matches_reference", "layout_invariant"),
)

gradients_into_saved_inputs = mutant(
    "swiglu",
    _kernel,
    [("dgate = torch.empty((m, n), dtype=g2.dtype, device=g2.device)\n"
      "        dup = torch.empty((m, n), dtype=u2.dtype, device=u2.device)",
      "dgate, dup = g2, u2")],
    name="gradients_into_saved_inputs",
    bug=(
        "The backward writes dgate and dup over the gate and up tensors it saved in forward "
        "(an in-place backward that saves memory; Liger-Kernel 0.8.5's SiLU-mul does this). "
        "Each element is read before it is overwritten, so the first backward is right; a "
        "second backward through the same graph (retain_graph=True) reads gradients where it "
        "expects activations. Triggered by any second backward."
    ),
    kills=("backward_repeatable",),
)

autotune_without_reset_to_zero = mutant(
    "swiglu",
    _kernel,
    [("@unspecialised_jit\ndef _swiglu_fwd_kernel(",
      '@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["NUMEL"])\n'
      "@unspecialised_jit\ndef _swiglu_fwd_kernel("),
     ("    y = g * s * u\n    tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=mask)",
      "    y = g * s * u\n    if BLOCK == 128:\n        y += tl.load(Y + idx, mask=mask, other=0.0).to(tl.float32)\n"
      "    tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=mask)"),
     ("        y = torch.empty((m, n), dtype=gate.dtype, device=gate.device)",
      "        y = torch.zeros((m, n), dtype=gate.dtype, device=gate.device)"),
     ("_swiglu_fwd_kernel[(triton.cdiv(numel, block),)](",
      '_swiglu_fwd_kernel[lambda meta: (triton.cdiv(numel, meta["BLOCK"]),)]('),
     ("                n, numel,\n                BLOCK=block,\n            )\n        ctx.save_for_backward(g2, u2)",
      "                n, numel,\n            )\n        ctx.save_for_backward(g2, u2)"),
     ("swiglu.supports_backward = True", "swiglu.supports_backward = True\nswiglu.autotuned = (_swiglu_fwd_kernel,)")],
    name="autotune_without_reset_to_zero",
    bug=(
        "An autotuned forward whose BLOCK=128 config adds its result into the output, which the "
        "wrapper zero-fills (a split-K style accumulation). Run once, as any pinned config runs, it "
        "is right; the autotuner times every config on the same buffer, and without "
        "reset_to_zero=['Y'] the timing runs' sums stay in it. Class: state the autotuner's timing "
        "leaves behind (triton#3004: each config alone works, both together do not). Trigger: any "
        "input, when BLOCK=128 is timed and chosen."
    ),
    kills=("autotune_configs_agree",),
)

swiglu_truncating_store = mutant(
    "swiglu",
    _kernel,
    [("    y = g * s * u\n    tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=mask)",
      '    y = g * s * u\n    tl.store(Y + idx, y.to(Y.dtype.element_ty, fp_downcast_rounding="rtz"), mask=mask)')],
    name="swiglu_truncating_store",
    bug=(
        "The forward stores its fp32 result in float16/bfloat16 rounding toward zero instead of to "
        "nearest. Every element is within an ulp, so each per-element rule passes it (the swiglu rule "
        "admits a rounding of silu(gate) to the input dtype as well); the mean error is half an ulp "
        "toward zero. Class: biased rounding in a narrowing store (ROCm/aiter#5151). Trigger: any "
        "float16 or bfloat16 input."
    ),
    kills=("unbiased_rounding",),
)
