"""Planted bugs in kernels.py: each a one-snippet source patch (tritoncheck.mutation.mutant),
with the real bug it models and the checks that must catch it. The outputs are compared
bit for bit, so each is caught by ``matches_reference`` on the first case that reaches it."""
import tritoncheck.mutation as mutation
from fp8_quant import (
    kernels,
    ops,  # noqa: F401 - registers the ops the mutants belong to
)

last_block_scale_from_previous = mutation.mutant(
    "dequantize_fp8", kernels,
    [("last = tl.cdiv(K, QBLOCK) - 1", "last = K // QBLOCK - 1")],
    name="last_block_scale_from_previous", attr="dequantize_fp8",
    bug="The scale prefetch is clamped to K // 128 - 1, the last full block, instead of the last block: when "
        "K is not a multiple of 128 (and K > 128) the partial last block is scaled by the block before it. "
        "A floor where a ceiling belongs; right for every K that is a multiple of 128.",
    kills=("matches_reference",),
)

round_toward_zero = mutation.mutant(
    "quantize_fp8", kernels,
    [("bits = bits + 0x7FFFF + ((bits >> 20) & 1)", "bits = bits")],
    name="round_toward_zero", attr="quantize_fp8",
    bug="The dropped mantissa bits are cleared without rounding (truncation toward zero, as a hand-written or "
        "fast conversion does): about half of q's values in e4m3's normal range are one step too small in "
        "magnitude, a bias of half a step on average.",
    kills=("matches_reference",),
)

amax_wrong_axis = mutation.mutant(
    "quantize_fp8", kernels,
    [("amax = tl.max(tl.abs(x), axis=1)", "amax = tl.max(tl.abs(x), axis=0)")],
    name="amax_wrong_axis", attr="quantize_fp8",
    bug="amax is taken over the tile's rows (axis 0) instead of the block's columns (axis 1): each row gets "
        "the largest magnitude of one column. The tile is square (128 x 128), so the shapes agree and it "
        "compiles and runs; every scale and most q values are wrong.",
    kills=("matches_reference",),
)

zero_block_nan = mutation.mutant(
    "quantize_fp8", kernels,
    [("scale = tl.maximum(tl.math.div_rn(amax, E4M3_MAX), SCALE_FLOOR)", "scale = tl.math.div_rn(amax, E4M3_MAX)")],
    name="zero_block_nan", attr="quantize_fp8",
    bug="No floor on the scale: an all-zero block (padding, a ReLU's zeros) gets scale 0 and q = 0 / 0 = NaN, "
        "and a block of subnormal-sized values a subnormal scale (DeepSeek-V3's act_quant computes "
        "amax / 448 unguarded).",
    kills=("matches_reference",),
)

approximate_scale_division = mutation.mutant(
    "quantize_fp8", kernels,
    [("scale = tl.maximum(tl.math.div_rn(amax, E4M3_MAX), SCALE_FLOOR)",
      "scale = tl.maximum(amax / E4M3_MAX, SCALE_FLOOR)")],
    name="approximate_scale_division", attr="quantize_fp8",
    bug="amax / 448 with Triton's '/', which NVIDIA GPUs compile to an approximate division (up to 2 ulp): a "
        "scale one ulp off the contract's correctly rounded one, and q off by a step where x / scale lands "
        "near a rounding boundary.",
    kills=("matches_reference",),
    only_on=(("cuda",), "the interpreter divides with NumPy, correctly rounded: '/' is approximate only "
                        "in compiled code"),
)
