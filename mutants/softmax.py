"""Planted bugs in kernels/softmax.py (see tritoncheck/mutation.py for how they are made)."""
from tritoncheck.kernels import softmax as kernel
from tritoncheck.mutation import mutant

padded_lanes_zero = mutant(
    "softmax", kernel,
    [('x = tl.load(x_row + cols * stride_xc, mask=mask, other=float("-inf"))',
      'x = tl.load(x_row + cols * stride_xc, mask=mask, other=0.0)')],
    name="padded_lanes_zero",
    bug="Lanes past the row end load 0 instead of -inf, so each adds exp(0 - m) to the sum. "
        "Class: wrong identity for a masked reduction (the seed attention kernel's bug). "
        "Trigger: a row length that is not a power of two (single-block path).",
    kills=("matches_reference", "rows_sum_to_one"),
)

no_max_subtraction = mutant(
    "softmax", kernel,
    [("e = tl.exp(z - m)\n        s = tl.sum(e, axis=0)", "e = tl.exp(z)\n        s = tl.sum(e, axis=0)")],
    name="no_max_subtraction",
    bug="exp(z) instead of exp(z - max z): overflows to inf (then inf / inf = NaN) once a "
        "scaled logit exceeds ~88. Class: unstable softmax. Trigger: large logits or small T.",
    kills=("matches_reference", "rows_sum_to_one", "values_in_unit_interval", "shift_invariant"),
)

temperature_multiplied = mutant(
    "softmax", kernel,
    [("z = tl.div_rn(x, temperature)\n        m = tl.max(z, axis=0)", "z = x * temperature\n        m = tl.max(z, axis=0)")],
    name="temperature_multiplied",
    bug="x * T instead of x / T in the single-block path. Class: inverted scale parameter. "
        "Trigger: any T != 1 on a row that fits one block.",
    kills=("matches_reference", "temperature_equivalent"),
)

masked_lane_nan = mutant(
    "softmax", kernel,
    [('m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)', "m_ref = m_new")],
    name="masked_lane_nan",
    bug="The online pass rescales a lane that has seen only -inf by exp(-inf - -inf) = NaN, "
        "which poisons the row sum. Class: missing guard in online softmax. Trigger: -inf "
        "entries in a row longer than one block. matches_reference draws a masked row past one "
        "block in about 1 example of 100 and misses it in a 60-example hunt; "
        "neg_inf_gives_zero draws masked rows every time.",
    kills=("neg_inf_gives_zero",),
)

row_stride_assumed = mutant(
    "softmax", kernel,
    [("x_row = X + row * stride_xr", "x_row = X + row * N * stride_xc")],
    name="row_stride_assumed",
    bug="The row start is computed as row * N * column stride, as if rows were packed. "
        "Class: strides assumed contiguous. Trigger: a view whose rows are not packed "
        "(step-sliced or transposed leading dims).",
    kills=("matches_reference", "rows_independent"),
    # On an H100 (Triton 3.6) every hunt's first transposed view read past the allocation: an
    # illegal memory access, which breaks the process's CUDA context, so every later example
    # crashes too and no check's assertion is reached (a crash is no kill). A user's kernel
    # with this bug fails there all the same, by the crash.
    only_on=(("interpret",), "on the GPU its wrong row starts read past the allocation (an illegal memory "
                             "access, no check's assertion reached); the interpreter reads them and the checks see "
                             "the wrong rows"),
)

backward_missing_inner = mutant(
    "softmax", kernel,
    [("(y * (dy - total) / temperature)", "(y * dy / temperature)")],
    name="backward_missing_inner",
    bug="dx = y * dy / T, without the - <dy, y> term of the softmax Jacobian. Class: "
        "incomplete hand-written backward. Trigger: any upstream gradient that is not "
        "orthogonal to y.",
    kills=("gradients_match_reference",),
)

block_flips_per_call = mutant(
    "softmax", kernel,
    [("    block = min(triton.next_power_of_2(n), _max_block())\n    _softmax_fwd_kernel",
      "    _CALLS.append(1)\n    block = min(triton.next_power_of_2(n), _max_block())\n"
      "    block = block if len(_CALLS) % 2 else max(block // 4, 1)\n    _softmax_fwd_kernel"),
     ("DTYPES = (torch.float32", "_CALLS = []\nDTYPES = (torch.float32")],
    name="block_flips_per_call",
    bug="Every other call runs with a quarter of the block size, so the reduction order "
        "(and the rounding) changes between calls. Class: a tuner or cache that picks a "
        "different config per call. Trigger: a row long enough that the order matters.",
    kills=("deterministic",),
)

writes_into_input = mutant(
    "softmax", kernel,
    [("    y = torch.empty((rows, n), dtype=x2.dtype, device=x2.device)",
      "    y = x2 if x2.is_contiguous() else torch.empty((rows, n), dtype=x2.dtype, device=x2.device)")],
    name="writes_into_input",
    bug="The output is written over the input when the input is contiguous. Class: an "
        "in-place shortcut that breaks the contract (inputs are never modified). Trigger: "
        "any contiguous x.",
    kills=("inputs_unchanged",),
)

masked_row_zero = mutant(
    "softmax", kernel,
    [("        e = tl.exp(z - m)\n        s = tl.sum(e, axis=0)\n        tl.store(y_row + cols, (e / s)",
      "        e = tl.exp(z - tl.where(m == float('-inf'), 0.0, m))\n        s = tl.sum(e, axis=0)\n"
      "        tl.store(y_row + cols, tl.where(s > 0, e / s, 0.0)")],
    name="masked_row_zero",
    bug="A row that is entirely -inf gives zeros instead of NaN ('safe softmax'). Class: a "
        "silent convention change that hides fully-masked rows. Trigger: an all -inf row.",
    kills=("all_neg_inf_row_gives_nan",),
)

huge_logit_rows_zeroed = mutant(
    "softmax", kernel,
    [("tl.store(y_row + cols, (e / s).to(Y.dtype.element_ty), mask=mask)",
      "tl.store(y_row + cols, tl.where(m > 1e30, 0.0, e / s).to(Y.dtype.element_ty), mask=mask)")],
    name="huge_logit_rows_zeroed",
    bug="A row whose largest scaled logit exceeds 1e30 gives zeros (single-block path). Class: an "
        "overflow guard that treats rows of huge logits as invalid and blanks them; the old "
        "softmax rule charged u |max| to the top entry, whose allowance reached 1 there, so this "
        "passed every check (issue 16). Trigger: x / T with a max above 1e30 (fp32 or bf16 values "
        "near the dtype's max) in a row that fits one block.",
    kills=("matches_reference", "rows_sum_to_one"),
)

long_rows_detached = mutant(
    "softmax", kernel,
    [("    return _Softmax.apply(x, float(temperature))",
      "    if x.shape[-1] > 64:\n"
      "        return _launch_fwd(_rows(x), float(temperature)).view(x.shape)\n"
      "    return _Softmax.apply(x, float(temperature))")],
    name="long_rows_detached",
    bug="Rows longer than 64 go straight to the forward launch, around the autograd Function, "
        "so the output carries no grad_fn and no gradient reaches x. Class: a fast path that "
        "forgets autograd (an inference-only branch reached in training). Trigger: any row "
        "longer than 64 with x requiring grad; shorter rows are differentiable, so the bug "
        "shows only on some draws.",
    kills=("gradients_match_reference", "deterministic"),
)

autotune_config_rounds_in_input_dtype = mutant(
    "softmax", kernel,
    [("@unspecialised_jit\ndef _softmax_fwd_kernel(",
      '@triton.autotune(configs=[triton.Config({"LOW_PRECISION": 0}), triton.Config({"LOW_PRECISION": 1})], '
      'key=["N"])\n@unspecialised_jit\ndef _softmax_fwd_kernel('),
     ("    SINGLE_BLOCK: tl.constexpr,\n):", "    SINGLE_BLOCK: tl.constexpr,\n    LOW_PRECISION: tl.constexpr,\n):"),
     ("        e = tl.exp(z - m)\n        s = tl.sum(e, axis=0)",
      "        e = tl.exp(z - m)\n        if LOW_PRECISION:\n            e = e.to(Y.dtype.element_ty).to(tl.float32)\n"
      "        s = tl.sum(e, axis=0)"),
     ("BLOCK=block, SINGLE_BLOCK=n <= block, num_warps=4 if block <= 2048 else 8,",
      "BLOCK=block, SINGLE_BLOCK=n <= block,"),
     ("softmax.supports_backward = True", "softmax.supports_backward = True\nsoftmax.autotuned = (_softmax_fwd_kernel,)")],
    name="autotune_config_rounds_in_input_dtype",
    bug="An autotuned forward whose second config rounds the exponentials to the input dtype before "
        "summing and dividing (a 'low precision' variant among the tuning configs): each of its results "
        "errs by up to 1.5 ulp where the other config's err by half. Class: autotune configs that "
        "disagree (triton#6524: the autotuned choice differs from a fixed config). Trigger: float16 or "
        "bfloat16 rows that fit one block, whenever that config runs; autotune_configs_agree runs every "
        "config on every example.",
    kills=("matches_reference", "autotune_configs_agree"),
)

truncating_store = mutant(
    "softmax", kernel,
    [("tl.store(y_row + cols, (e / s).to(Y.dtype.element_ty), mask=mask)",
      'tl.store(y_row + cols, (e / s).to(Y.dtype.element_ty, fp_downcast_rounding="rtz"), mask=mask)'),
     ("tl.store(y_row + offs, (tl.exp(z - m) / s).to(Y.dtype.element_ty), mask=mask)",
      'tl.store(y_row + offs, (tl.exp(z - m) / s).to(Y.dtype.element_ty, fp_downcast_rounding="rtz"), mask=mask)')],
    name="truncating_store",
    bug="The fp32 result is stored in float16/bfloat16 rounding toward zero (a conversion that "
        "truncates the low mantissa bits) instead of to nearest: every element within an ulp, all "
        "of them low. Class: biased rounding in a narrowing store (ROCm/aiter#5151: a bf16 "
        "conversion that truncated shrank a residual stream 8.98 % over 72 calls). Trigger: any "
        "float16 or bfloat16 input; float32 stores do not narrow.",
    kills=("unbiased_rounding",),
)
