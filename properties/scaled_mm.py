"""scaled_mm(a, b, a_scale, b_scale, bias, out_dtype): strategy, tolerance binding and
properties of the block-scaled low-precision GEMM.

The op's dtype axis is the input format (float8_e4m3fn, float8_e5m2, int8): what a kernel
supports and what its tests report is per format; the output dtype is the ``out_dtype``
argument, drawn (bfloat16, float16, float32) and narrowed with ``limits["values"]``.

The domain: finite operands (no fp8 NaN or inf), finite float32 scales > 0, and results
whose every partial sum stays inside fp32's range and whose value stays well inside
``out_dtype``'s: the strategy sets the scales' levels from the operands' largest possible
magnitudes so that ``K max|a| max|b| max(sa) max(sb)`` stays below ``out_max / 64``.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck import backend
from tritoncheck.backend import E5M2_DOT_ON_INTERPRETER
from tritoncheck.bad_input import BadInput, Spoiler, scalar_spoilers, tensor_spoilers
from tritoncheck.config import CONFIG
from tritoncheck.declarations import E5M2_DOT_UPCAST
from tritoncheck.generic import generic_checks, precision, run
from tritoncheck.large_problem import LargeProblem, rows_past_int32
from tritoncheck.limits import NO_LIMITS, Limits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.properties import scaled_mm_tolerance as rules
from tritoncheck.references import scaled_mm as ref
from tritoncheck.references.quantisation import FORMATS, SCALE_BLOCK, blocks, expand, format_max
from tritoncheck.registry import Check, Implementation, OpSpec, register
from tritoncheck.strategies import Case, TensorSpec, dtype_from_name, layouts, tensors

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ARGS = ("a", "b", "a_scale", "b_scale", "bias", "out_dtype")
A_SCALINGS = ("tensor", "row", "block")  # a_scale [1, 1], [M, 1], [M, ceil(K / 128)]
# b_scale [1, 1], [1, N], [ceil(K / 128), ceil(N / 128)], [ceil(K / 128), N] (128 x 1: a column in each K
# block, torchao's and DeepGEMM's for a weight gradient)
B_SCALINGS = ("tensor", "column", "block", "block_column")
VALUE_FAMILIES = ("normal", "wide", "near_max", "tiny", "outlier", "constant")
INT_FAMILIES = ("normal", "wide", "near_max", "outlier", "constant")  # no subnormals in int8
# the operands' scales per format: about 1; near the format's smallest values; near its largest
VALUE_SCALES = {torch.float8_e4m3fn: (1.0, 0.02, 60.0), torch.float8_e5m2: (1.0, 1e-3, 3e3),
                torch.int8: (30.0, 3.0, 100.0)}
# the scales' levels, as powers of two (each scale is its level times 2^-u, u in [0, 8)): unit,
# moderate, and near fp32's ends (tiny scales of large values, huge scales of tiny ones); the
# strategy lowers a level that would take the result past the output's range
SCALE_LEVELS = (0, -7, 7, -40, 40, -100, 100)


def _sizes() -> tuple[int, int, int, int, int]:
    """(K, N, M) largest, the M N K budget and each operand's: the interpreter draws K past two
    scale blocks, N past one (b's 128 x 128 blocks) and M N K within 2**20 (an example's calls
    take about a second there); a GPU past 4096 everywhere, M N K within 2**33 (the fp64
    reference and S run there) and each operand within 2**23 elements (drawn on the host)."""
    return (CONFIG.pick(300, 8200), CONFIG.pick(140, 4200), CONFIG.pick(70, 4200), CONFIG.pick(2**20, 2**33),
            CONFIG.pick(2**15, 2**23))


def _specials(fmt: torch.dtype) -> tuple[float, ...]:
    """Values worth one position: zeros, one, the format's ends and (fp8) its smallest normal
    and subnormal; int8's -128 too."""
    if not fmt.is_floating_point:
        return (0.0, 1.0, -1.0, 127.0, -127.0, -128.0)
    info = torch.finfo(fmt)
    return (0.0, -0.0, 1.0, float(info.max), -float(info.max), float(info.tiny), float(info.tiny * info.eps))


def _largest(spec: TensorSpec, fmt: torch.dtype) -> float:
    """The largest magnitude ``spec``'s family gives (6 sigma for normal ones; every value
    is clipped to the format's range anyway)."""
    top = format_max(fmt)
    if spec.family in ("near_max", "wide") or spec.injections:
        return top
    if spec.family == "tiny":
        return min(top, 16 * float(torch.finfo(fmt).tiny))
    return min(top, (1e3 if spec.family == "outlier" else 6.0) * spec.scale)


def _scale_spec(shape, level: float, draw) -> TensorSpec:
    family = draw(st.sampled_from(("scales", "pow2_scales")))
    return TensorSpec(shape=shape, dtype="float32", family=family, scale=level, seed=draw(st.integers(0, 2**32 - 1)),
                      layout=draw(layouts(2)))


@st.composite
def scaled_mm_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS, k_range: tuple[int, int] | None = None,
                    min_m: int = 1, min_n: int = 1) -> Case:
    """a [M, K] and b [K, N] of the format ``dtype`` in any layouts, each scale in any of
    its layouts (A_SCALINGS, B_SCALINGS; any combination), an optional bias and an out_dtype. ``k_range``
    replaces K's range (a check that needs short sums); ``min_m``, ``min_n``: checks that
    compare rows or columns."""
    fmt = dtype
    k_max, n_max, m_max, flops, per_tensor = _sizes()
    k_lo, k_hi = k_range or (1, k_max)
    k = draw(limits.size("K", k_lo, k_hi, blocks=(SCALE_BLOCK,)))
    n = draw(limits.size("N", min_n, max(min_n, min(n_max, per_tensor // k, flops // k)), blocks=(SCALE_BLOCK,)))
    m = draw(limits.size("M", min_m, max(min_m, min(m_max, per_tensor // k, flops // (k * n)))))
    families = VALUE_FAMILIES if fmt.is_floating_point else INT_FAMILIES
    a = draw(tensors((m, k), fmt, families=families, scales=VALUE_SCALES[fmt], specials=_specials(fmt)))
    b = draw(tensors((k, n), fmt, families=families, scales=VALUE_SCALES[fmt], specials=_specials(fmt)))
    out_dtype = draw(limits.choice("out_dtype", OUT_DTYPES))
    # the scales' levels: drawn, then lowered together until the largest result fits
    ea, eb = draw(st.sampled_from(SCALE_LEVELS)), draw(st.sampled_from(SCALE_LEVELS))
    room = math.log2(float(torch.finfo(out_dtype).max) / 64) - math.log2(k * _largest(a, fmt) * _largest(b, fmt))
    excess = max(0, math.ceil(ea + eb - room))
    ea, eb = ea - excess // 2, eb - (excess - excess // 2)
    a_shape = {"tensor": (1, 1), "row": (m, 1), "block": (m, blocks(k))}[draw(st.sampled_from(A_SCALINGS))]
    b_shape = {"tensor": (1, 1), "column": (1, n), "block": (blocks(k), blocks(n)),
               "block_column": (blocks(k), n)}[draw(st.sampled_from(B_SCALINGS))]
    specs = {"a": a, "b": b, "a_scale": _scale_spec(a_shape, 2.0**ea, draw),
             "b_scale": _scale_spec(b_shape, 2.0**eb, draw)}
    params = {"bias": None, "out_dtype": out_dtype}
    if not limits.held("bias") and draw(st.booleans()):
        # about the size of a typical result, or much smaller
        typical = math.sqrt(k) * _largest(a, fmt) * _largest(b, fmt) * 2.0 ** (ea + eb) / 64
        specs["bias"] = draw(tensors((n,), out_dtype, scales=(typical, typical / 256)))
        del params["bias"]
    return Case("scaled_mm", str(fmt).replace("torch.", ""), ARGS, specs, params)


def scaled_mm_tolerance(case, inputs64, expected, p):
    return {"c": rules.scaled_mm(inputs64["a"], inputs64["b"], inputs64["a_scale"], inputs64["b_scale"],
                                 inputs64.get("bias"), expected["c"], dtype_from_name(case.dtype), p)}


def _out_dtype(case: Case) -> torch.dtype:
    return case.params["out_dtype"]


def _laid_out(case: Case, name: str, values: torch.Tensor) -> torch.Tensor:
    """``values`` in the layout the case gives ``name`` (its strides, gaps and offset)."""
    layout = case.tensors[name].layout
    return layout.apply(values) if layout is not None else values.clone()


def _compare(case: Case, impl: Implementation, values, outs, what: str, p=None) -> None:
    """``outs["c"]`` against the fp64 reference of ``values`` under the op's rule."""
    fmt = dtype_from_name(case.dtype)
    v64 = {k: (to_numpy(v) if isinstance(v, torch.Tensor) else v) for k, v in values.items()}
    want = ref.scaled_mm(*(v64[a] for a in ARGS))
    allowed = rules.scaled_mm(v64["a"], v64["b"], v64["a_scale"], v64["b_scale"], v64["bias"], want, fmt,
                              p or precision(impl, case))
    assert_close("c", outs["c"], want, allowed, what=what, dtype=_out_dtype(case), record=False, vacuity=True)


# ------------------------------------------------------------------ properties

EXACT_BITS = 14  # significant bits every partial sum of computes_in_input_format's products fits in


def _significand_steps(fmt: torch.dtype, k: int) -> int:
    """Significands 1 + i / steps for the cancelling pairs: all the format has (8 for e4m3, 4
    for e5m2) where every partial sum of the K products (each below 4, a multiple of
    steps^-2) fits in EXACT_BITS significant bits, fewer for a longer K, never below 2 (two
    significands, so that a pair's two dequantisations round differently)."""
    most = 8 if fmt == torch.float8_e4m3fn else 4
    fits = math.sqrt(2**EXACT_BITS / (4 * max(k - 1, 1)))
    return max(2, min(most, 2 ** int(math.floor(math.log2(max(fits, 1.0))))))


def _pair_values(fmt: torch.dtype, count: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` values of one binade (fp8: 1 + i / steps), random signs; int8: 1 to 11."""
    if not fmt.is_floating_point:
        return rng.integers(1, 12, count) * rng.choice((-1.0, 1.0), count)
    return (1.0 + rng.integers(0, steps, count) / steps) * rng.choice((-1.0, 1.0), count)


def computes_in_input_format(case: Case, impl: Implementation) -> None:
    """The output is that of the quantised values themselves, not of a rounded copy of the
    dequantised operands: a kernel that forms ``a * a_scale`` in bfloat16 or float16 (a
    dress-up of a bf16 GEMM: KernelBench-Hard's fp8 solutions did this) or tf32 errs by
    ~2^-9 (2^-12, 2^-11) of each product.

    Inputs where that shows whatever the output dtype: each row of ``a`` is ``alpha_m``
    times ``(p_j, q_j)`` pairs and each column of ``b`` ``beta_n`` times ``(q_j, -p_j)``
    (alpha, beta powers of two, p, q one binade of the format's significands), so each pair
    of products cancels exactly, plus one small witness product (the exact result is not
    0); the scales have full fp32 significands (a rounded ``a * a_scale`` loses bits). A
    correct kernel's only error is the rule's fp32 part on these short sums (K <= 64, or
    the smallest K a kernel declares); every partial sum is a multiple of steps^-2 below
    4 K times alpha beta, exact in EXACT_BITS significant bits (the significands are chosen
    so), so a declared fp8 accumulation that keeps that many (13 fraction bits) adds nothing
    here; one that keeps fewer is charged as declared."""
    values = case.materialise(backend.device())
    fmt = dtype_from_name(case.dtype)
    m, k = values["a"].shape
    n = values["b"].shape[1]
    rng = np.random.default_rng(case.tensors["a"].seed)
    pairs = (k - 1) // 2
    steps = _significand_steps(fmt, k)
    p, q = _pair_values(fmt, pairs, steps, rng), _pair_values(fmt, pairs, steps, rng)
    powers = (1.0, 2.0, 4.0) if not fmt.is_floating_point else (0.5, 1.0, 2.0, 4.0)
    alpha, beta = rng.choice(powers, m), rng.choice(powers, n)
    witness = 1.0 if not fmt.is_floating_point else 1.0 / steps  # its product a multiple of steps^-2 too
    a = np.zeros((m, k))
    bm = np.zeros((k, n))
    a[:, 0:2 * pairs:2], a[:, 1:2 * pairs:2] = alpha[:, None] * p, alpha[:, None] * q
    bm[0:2 * pairs:2], bm[1:2 * pairs:2] = q[:, None] * beta, -p[:, None] * beta
    a[:, 2 * pairs], bm[2 * pairs] = alpha * witness, beta * witness
    device = values["a"].device
    structured = dict(values, bias=None)
    structured["a"] = _laid_out(case, "a", torch.from_numpy(a).to(fmt).to(device))
    structured["b"] = _laid_out(case, "b", torch.from_numpy(bm).to(fmt).to(device))
    for name in ("a_scale", "b_scale"):  # full significands: 1.2345678 is far from a power of two
        structured[name] = _laid_out(case, name, (values[name].double() * 1.2345678).float())
    _, outs = run(case, impl, structured)
    p_used = precision(impl, case)
    needed = math.ceil(math.log2(4 * max(k - 1, 1) * steps**2))
    if p_used.fp8_accumulation is not None and p_used.fp8_accumulation[0] + 1 >= needed:
        p_used = dataclasses.replace(p_used, fp8_accumulation=None)
    _compare(case, impl, structured, outs, "the output is not that of the quantised values: pairs of products that "
             "cancel exactly do not (a rounded copy of a * a_scale or b * b_scale, e.g. dequantised to bfloat16)",
             p_used)


@st.composite
def _short_sums(draw, op: OpSpec, dtype: torch.dtype) -> Case:
    return draw(op.cases(dtype, k_range=(3, 64)))


@st.composite
def _with_region(draw, op: OpSpec, dtype: torch.dtype) -> Case:
    case = draw(op.cases(dtype))
    return Case(case.op, case.dtype, case.args, case.tensors,
                {**case.params, "region_seed": draw(st.integers(0, 2**32 - 1))}, case.kwargs)


def _scaled_region(q: torch.Tensor, f: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, f * base): ``q`` with every value whose ``f`` multiple would leave the format
    divided by ``f`` first (rounded into it), and that times ``f`` (exact). A subnormal of an
    fp8 format is raised to the format's smallest normal (its sign kept) in both: on sm_90 the
    tensor core's fp8 dot of e5m2 subnormals is not invariant under a power of two (measured on
    an H200: a [1, 5] x [5, 1] product of subnormal a moved by 7e-5 relative when a was scaled
    by 4), a property of the hardware's operand handling, not a misread scale."""
    fmt = q.dtype
    q64 = q.double()
    if fmt.is_floating_point:
        smallest_normal = torch.finfo(fmt).smallest_normal
        q64 = torch.where((q64 != 0) & (q64.abs() < smallest_normal), torch.sign(q64) * smallest_normal, q64)
    fits = q64.abs() * f <= format_max(fmt)
    if fmt.is_floating_point:
        base = torch.where(fits, q64, (q64 / f).to(fmt).double())
    else:
        base = torch.where(fits, q64, torch.trunc(q64 / f))
    return base.to(fmt), (base * f).to(fmt)


def scale_block_invariant(case: Case, impl: Implementation) -> None:
    """Multiplying the values that share one scale (a 1 x 128 block of ``a``, a row, a 128 x
    128 block of ``b``, a column, a whole operand) by ``f = 2^t`` and dividing that scale by
    ``f`` changes nothing, bit for bit: the dequantised operands are the same numbers, and
    a power of two scales every product, partial sum and rounding of that group exactly
    (fp32 and the fp8 accumulator alike; the block's fp8 subnormals are raised to the smallest
    normal first: the tensor core's fp8 dot of subnormal operands is not invariant). A kernel that reads a block's scale for another
    block's values (the last, short block's scale from the one before) moves. The group is
    the last along K half the time (the short block of a K not a multiple of 128)."""
    values = case.materialise(backend.device())
    rng = np.random.default_rng(int(case.params.get("region_seed", 0)))
    side = "a" if rng.random() < 0.5 else "b"
    q, scale = values[side], values[f"{side}_scale"]
    groups = (ref.a_groups if side == "a" else ref.b_groups)(scale.shape, q.shape)
    k_axis = 1 if side == "a" else 0
    entry = [int(rng.integers(0, scale.shape[0])), int(rng.integers(0, scale.shape[1]))]
    if rng.random() < 0.5:
        entry[k_axis] = scale.shape[k_axis] - 1
    f = 2.0 ** int(rng.integers(1, 4))
    # the divided scale, and its product with the other side's scales, stay normal fp32 numbers (a
    # power of two moves a subnormal's rounding)
    other = values["b_scale" if side == "a" else "a_scale"]
    divided_scale = float(scale[tuple(entry)]) / f
    assume(min(divided_scale, divided_scale * float(other.min())) >= 2.0**-120)
    index = [torch.arange(q.shape[axis], device=q.device) for axis in (0, 1)]
    member = [(index[axis] // groups[axis] == entry[axis]) if groups[axis] else torch.ones_like(index[axis],
                                                                                                 dtype=torch.bool)
              for axis in (0, 1)]
    region = member[0][:, None] & member[1][None, :]
    base_values, scaled_values = _scaled_region(q, f)
    base = torch.where(region, base_values.double(), q.double()).to(q.dtype)
    scaled = torch.where(region, scaled_values.double(), q.double()).to(q.dtype)
    divided = scale.clone()
    divided[tuple(entry)] = scale[tuple(entry)] / f
    first = dict(values, **{side: _laid_out(case, side, base)})
    second = dict(values, **{side: _laid_out(case, side, scaled),
                             f"{side}_scale": _laid_out(case, f"{side}_scale", divided)})
    _, c1 = run(case, impl, first)
    _, c2 = run(case, impl, second)
    assert_identical("c", c1["c"], c2["c"], f"{side}'s values under {side}_scale{entry} times {f:g} and that scale "
                                            f"divided by {f:g} (the same dequantised {side}) changed c")


def _other_values(case: Case, name: str, device) -> torch.Tensor:
    spec = case.tensors[name]
    return TensorSpec(**{**spec.__dict__, "seed": (spec.seed + 1) % 2**32, "injections": ()}).materialise(device)


def rows_independent(case: Case, impl: Implementation) -> None:
    """Row r of c does not change, bit for bit, when every other row of ``a`` (and its
    scales, where ``a_scale`` has a row each) changes."""
    values, outs = run(case, impl)
    r = values["a"].shape[0] // 2
    assume(values["a"].shape[0] >= 2)
    other = dict(values)
    for name in ("a", "a_scale"):
        t = values[name]
        if name == "a" or t.shape[0] > 1:
            new = _other_values(case, name, t.device)
            new[r] = t[r]
            other[name] = new
    _, outs2 = run(case, impl, other)
    assert_identical("c", outs["c"][r], outs2["c"][r], f"row {r} of c changed when the other rows of a changed")


def columns_independent(case: Case, impl: Implementation) -> None:
    """Column j of c does not change, bit for bit, when every other column of ``b`` changes
    (and the entries of ``b_scale`` that column j does not read)."""
    values, outs = run(case, impl)
    j = values["b"].shape[1] // 2
    assume(values["b"].shape[1] >= 2)
    other = dict(values)
    b = values["b"]
    new = _other_values(case, "b", b.device)
    new[:, j] = b[:, j]
    other["b"] = new
    scale = values["b_scale"]
    if scale.shape[1] > 1:
        group = ref.b_groups(scale.shape, b.shape)[1]
        kept = j // group
        new_scale = _other_values(case, "b_scale", scale.device)
        new_scale[:, kept] = scale[:, kept]
        other["b_scale"] = new_scale
    _, outs2 = run(case, impl, other)
    assert_identical("c", outs["c"][:, j], outs2["c"][:, j],
                     f"column {j} of c changed when the other columns of b changed")


# ------------------------------------------------------------------ the record's side pieces

def _baseline(case, values, outs):
    """Plain PyTorch in the output dtype: the operands dequantised into it, its matmul."""
    out = values["out_dtype"]
    a, b, sa, sb = values["a"], values["b"], values["a_scale"], values["b_scale"]
    a_full = a.to(out) * expand(sa, a.shape, ref.a_groups(sa.shape, a.shape)).to(out)
    b_full = b.to(out) * expand(sb, b.shape, ref.b_groups(sb.shape, b.shape)).to(out)
    c = a_full @ b_full
    return c if values["bias"] is None else c + values["bias"]


LARGE_K, LARGE_N = 300, 300  # K and N past two scale blocks, neither a multiple of 128


def _large_problem(dtype, device):
    """a [M, 300] past 2**31 elements (M = 7.2M rows, 1 x 128 block scales) times b [300, 300]
    (128 x 128 block scales), so a's and c's offsets (M K, M N) both pass 2**31; about 2.2 GB
    of a and 4.3 GB of c in bfloat16."""
    m = rows_past_int32(LARGE_K)
    fmt = dtype if dtype in FORMATS else torch.float8_e4m3fn
    scale = 1.0 if fmt.is_floating_point else 30.0
    # the float source is made (and freed) before the next: torch.randn of 2**31 is 8.6 GB
    a, b = torch.randn((m, LARGE_K), device=device), torch.randn((LARGE_K, LARGE_N), device=device)
    for t in (a, b):
        t.mul_(scale).clamp_(-100, 100)
        if not fmt.is_floating_point:
            t.round_()
    a, b = a.to(fmt), b.to(fmt)
    return {"a": a, "b": b, "a_scale": torch.rand((m, blocks(LARGE_K)), device=device) + 0.5,
            "b_scale": torch.rand((blocks(LARGE_K), blocks(LARGE_N)), device=device) * 1e-2 + 1e-3,
            "bias": None, "out_dtype": torch.bfloat16}


def _valid_call(dims, device):
    m, k, n = dims["n"], dims["m"], dims["d"]
    return {"a": torch.randn((m, k), device=device).to(torch.float8_e4m3fn),
            "b": torch.randn((k, n), device=device).to(torch.float8_e4m3fn),
            "a_scale": torch.rand((m, 1), device=device) + 0.5, "b_scale": torch.rand((1, n), device=device) + 0.5,
            "bias": torch.randn((n,), device=device).to(torch.bfloat16), "out_dtype": torch.bfloat16}


BAD_INPUT = BadInput(
    _valid_call,
    tensor_spoilers("a", fixed_rank=True) + tensor_spoilers("b", fixed_rank=True)
    + tensor_spoilers("a_scale", fixed_rank=True) + tensor_spoilers("b_scale", fixed_rank=True)
    + (Spoiler("b", "float8_e5m2 while a is float8_e4m3fn", lambda a: a["b"].to(torch.float8_e5m2)),
       Spoiler("b", "one row more than a's K", lambda a: torch.cat([a["b"], a["b"][:1]])),
       Spoiler("a", "float16 (not a quantised format)", lambda a: a["a"].half()),
       Spoiler("a", "an empty K", lambda a: a["a"][:, :0]),
       Spoiler("a_scale", "one scale per element of a", lambda a: torch.ones(a["a"].shape, device=a["a"].device)),
       Spoiler("a_scale", "float16", lambda a: a["a_scale"].half()),
       Spoiler("b_scale", "one scale per row of b", lambda a: torch.ones((a["b"].shape[0], 1), device=a["b"].device)),
       Spoiler("b_scale", "float64", lambda a: a["b_scale"].double()),
       Spoiler("bias", "float32 while out_dtype is bfloat16", lambda a: a["bias"].float()),
       Spoiler("bias", "one entry more than N", lambda a: torch.cat([a["bias"], a["bias"][:1]])),
       Spoiler("bias", "2-D", lambda a: a["bias"][None, :]),
       Spoiler("bias", "a list", lambda a: a["bias"].tolist()))
    + scalar_spoilers("out_dtype", (None, "bfloat16", torch.float64, torch.int8)))


register(OpSpec(
    name="scaled_mm",
    backend_limits=(E5M2_DOT_ON_INTERPRETER,),
    declarations=(E5M2_DOT_UPCAST,),
    signature="scaled_mm(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16) -> c",
    meaning="`a [M, K]`, `b [K, N]` in one format (the dtype: `float8_e4m3fn`, `float8_e5m2` or `int8`), finite; "
            "float32 scales > 0: `a_scale` `[1, 1]` (per tensor), `[M, 1]` (per row) or `[M, ceil(K/128)]` (per "
            "1 x 128 block along K), `b_scale` `[1, 1]`, `[1, N]` (per column), `[ceil(K/128), ceil(N/128)]` (per "
            "128 x 128 block) or `[ceil(K/128), N]` (per 128 x 1 block), any combination, a short last block having a scale of its own; `c = (a * a_scale) @ "
            "(b * b_scale) + bias` (`bias [N]` in `out_dtype`, optional) in `out_dtype` (bfloat16, float16 or "
            "float32), the products exact and summed in fp32 (or an fp8 tensor core's accumulation as the "
            "implementation declares it: `fp8_accumulation`). Declared layout `nk`: `b` as `[N, K]` and `b_scale` as "
            "`[1 or N or ceil(N/128), 1 or ceil(K/128)]` (nn.Linear's weight, DeepSeek-V3's and vLLM's).",
    scalars=("out_dtype",),
    dims={"M": ("a", 0), "K": ("a", 1), "N": ("b", 1)},
    choices={"out_dtype": OUT_DTYPES},
    arguments=ARGS,
    outputs=("c",),
    kernel="tritoncheck.kernels.scaled_mm:scaled_mm",
    controls=("tritoncheck.controls.scaled_mm:dequantised_matmul", "tritoncheck.controls.scaled_mm:blockwise_matmul"),
    baseline=_baseline,
    large_problem=LargeProblem(_large_problem, "rows", ("a", "a_scale")),
    bad_input=BAD_INPUT,
    reference=ref.scaled_mm,
    torch_reference=ref.scaled_mm_torch,
    cases=scaled_mm_cases,
    tolerance=scaled_mm_tolerance,
    dtypes=FORMATS,
    result_dtype_of=_out_dtype,
    layouts={"nk": {"b": (1, 0), "b_scale": (1, 0)}},
    checks=generic_checks(grad=False) + (
        Check("computes_in_input_format", computes_in_input_format, cases=_short_sums),
        Check("scale_block_invariant", scale_block_invariant, cases=_with_region),
        Check("rows_independent", rows_independent, cases=lambda op, dtype: op.cases(dtype, min_m=2)),
        Check("columns_independent", columns_independent, cases=lambda op, dtype: op.cases(dtype, min_n=2)),
    ),
))
