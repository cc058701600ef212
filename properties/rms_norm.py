"""rms_norm and add_rms_norm: strategies, tolerance binding and properties.

The domain: every input finite, and the row's sum of squares finite in fp32, where
any implementation accumulates it: ``N max|h|^2 <= fp32 max``. The cap is taken with
a factor 2 to spare, ``max|h| <= sqrt(fp32 max / N) / 2`` (about 1e17 for N = 300;
fp16's 65504 is far inside). For add_rms_norm, ``h = x + residual`` must lie in the
domain and be finite in the input dtype (it is returned there): ``x`` and ``residual``
are capped at half of it. The output must be finite in the dtype too: ``|x_hat| <=
sqrt(N)``, so weights are capped at ``max / (4 sqrt N)``.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck import backend
from tritoncheck.bad_input import BadInput, Spoiler, randn, scalar_spoilers, tensor_spoilers, widen_last
from tritoncheck.config import CONFIG
from tritoncheck.declarations import BATCH_INVARIANT, one_of
from tritoncheck.generic import generic_checks, gradients_match_reference, precision, run
from tritoncheck.large_problem import LargeProblem, row_wise
from tritoncheck.limits import NO_LIMITS, Limits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.properties import rms_norm_tolerance as rules
from tritoncheck.references import rms_norm as ref
from tritoncheck.registry import Check, Implementation, OpSpec, register
from tritoncheck.strategies import Case, TensorSpec, sizes, special_values, tensors

BLOCKS = (64, 4096)  # the kernel's column-block caps (interpreter, GPU): rows past one block loop
ROW_BLOCKS = 16  # small profile: rows x ceil(N / 64) per case (as layer norm's)
LONG_SMALL = 4099  # the interpreter's longest row: just past 4096 (one row costs about a second)
LONG_ROW = 2**17 + 3
EPSILONS = (1e-6, 1e-5, 1e-2)
X_FAMILIES = ("normal", "near_max", "tiny", "constant", "outlier", "offset")
WEIGHT_FAMILIES = ("normal", "constant", "outlier")
WEIGHT_SCALES = (1.0, 0.1, 10.0, 1e-3)
FP32_MAX = float(torch.finfo(torch.float32).max)
# Scale factors of scale_equivariant: powers of two, so c x is exact, of both signs.
SCALES_C = (2.0, -1.0, 0.5, -4.0, 0.125, -0.25, 8.0)
# Where an RMSNorm rounds to the input dtype: "after_weight", once, from x * rstd * weight
# computed in fp32 (Gemma and others; the default); "before_weight", x * rstd rounded to
# the input dtype, then multiplied by the weight in it (Llama / Hugging Face). The rules
# read it from the precision (``p.declared_value``).
RMS_NORM_CAST = one_of("rms_norm_cast", ("after_weight", "before_weight"),
                       "where an RMSNorm rounds to the input dtype (default 'after_weight'; the tolerance follows it)")
EXTRA_ROWS = 5  # rows added around a batch by batch_invariant: past the interpreter's group cap of 4


def domain_cap(dtype: torch.dtype, n: int) -> float:
    """Largest |h| of the op's domain for rows of length n (module docstring)."""
    return min(float(torch.finfo(dtype).max), math.sqrt(FP32_MAX / n) / 2)


@st.composite
def _shape(draw, limits: Limits, op: str) -> tuple[int, ...]:
    """Rows of any length (past one column block included) under 0-2 leading dims; on
    the interpreter rows x column blocks of 64 stay within ROW_BLOCKS, and rarely a row
    reaches past 4096 (``strategies.lengths``), past 2**17 on a GPU."""
    n = draw(limits.length(op, "N", 1, CONFIG.pick(300, 16384), long_max=CONFIG.pick(LONG_SMALL, LONG_ROW),
                           long_percent=CONFIG.long_percent(3), blocks=BLOCKS))
    small_rows = max(1, ROW_BLOCKS // -(-n // BLOCKS[0]))
    max_rows = max(1, min(CONFIG.pick(min(12, small_rows), 4096), CONFIG.pick(2**12, 2**21) // n))
    lead = tuple(draw(st.lists(sizes(1, max_rows), max_size=2).filter(lambda d: math.prod(d) <= max_rows)))
    return lead + (n,)


def _rows_of(draw, shape, dtype, cap) -> TensorSpec:
    return draw(tensors(shape, dtype, families=X_FAMILIES, max_magnitude=cap,
                        specials=special_values(dtype, max_magnitude=cap)))


def _weight(draw, n: int, dtype: torch.dtype) -> TensorSpec:
    big = float(torch.finfo(dtype).max)
    return draw(tensors((n,), dtype, families=WEIGHT_FAMILIES, scales=WEIGHT_SCALES,
                        max_magnitude=big / (4 * math.sqrt(n))))


@st.composite
def rms_norm_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """x [..., N] in any layout and value family of the domain; a strided weight."""
    shape = draw(_shape(limits, "rms_norm"))
    n = shape[-1]
    x = _rows_of(draw, shape, dtype, domain_cap(dtype, n))
    return Case("rms_norm", str(dtype).replace("torch.", ""), ("x", "weight", "eps"),
                {"x": x, "weight": _weight(draw, n, dtype)}, {"eps": draw(limits.choice("eps", EPSILONS))})


@st.composite
def add_rms_norm_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """x and residual [..., N] in any layouts and value families, each up to half the domain."""
    shape = draw(_shape(limits, "add_rms_norm"))
    n = shape[-1]
    half = domain_cap(dtype, n) / 2
    x, residual = _rows_of(draw, shape, dtype, half), _rows_of(draw, shape, dtype, half)
    return Case("add_rms_norm", str(dtype).replace("torch.", ""), ("x", "residual", "weight", "eps"),
                {"x": x, "residual": residual, "weight": _weight(draw, n, dtype)},
                {"eps": draw(limits.choice("eps", EPSILONS))})


# ------------------------------------------------------------------ tolerance binding

def rms_norm_tolerance(case, inputs64, expected, p):
    return {"y": rules.rms_norm(inputs64["x"], inputs64["weight"], expected["y"], case.params["eps"], p)}


def rms_norm_grad_tolerance(case, inputs64, outputs64, grads64, p):
    allowed = rules.rms_norm_grad(inputs64["x"], inputs64["weight"], inputs64["dy"], grads64["x"],
                                  grads64["weight"], case.params["eps"], p)
    return {"dx": allowed["dx"], "dweight": allowed["dweight"]}


def add_rms_norm_tolerance(case, inputs64, expected, p):
    """y by the RMSNorm rule on the exact h with h's rounding to the input dtype as an
    input error; h itself is one rounding of the exact sum (p.store |h| + p.floor)."""
    h = expected["h"]
    err = rules.input_error(h, p)
    return {"y": rules.rms_norm(h, inputs64["weight"], expected["y"], case.params["eps"], p, input_err=err),
            "h": to_numpy(err)}


def add_rms_norm_grad_tolerance(case, inputs64, outputs64, grads64, p):
    """dx = dresidual = dh + the RMSNorm gradient at the rounded h (rules.rms_norm_grad)."""
    h = outputs64["h"]
    allowed = rules.rms_norm_grad(h, inputs64["weight"], inputs64["dy"], grads64["x"], grads64["weight"],
                                  case.params["eps"], p, input_err=rules.input_error(h, p), dh=inputs64["dh"])
    return {"dx": allowed["dx"], "dresidual": allowed["dx"], "dweight": allowed["dweight"]}


def _in_gradient_domain(case: Case, inputs64, outputs64, grads64) -> None:
    """Reject (``assume``) cases whose exact gradients do not fit the dtype (fp16's dx ~
    dy w / sqrt(eps) passes 65504 for a large upstream gradient on a row of tiny values),
    or whose g = weight * dy does not: the unfused backward of ``weight * t`` forms it in
    the input dtype, and an infinite g gives inf - inf = NaN where the exact dx, a
    cancellation, is finite."""
    big = float(torch.finfo(getattr(torch, case.dtype)).max) / 2
    g = np.abs(inputs64["weight"] * inputs64["dy"])
    assume(all(np.all(np.isfinite(v)) and float(np.max(np.abs(v), initial=0.0)) <= big
               for v in (*grads64.values(), g)))


def gradients_in_range_match_reference(case: Case, impl: Implementation) -> None:
    """Gradients match fp64 PyTorch autograd on the same rounded inputs and upstream
    gradients, within the derived tolerance; cases whose exact gradients overflow the
    dtype are drawn again."""
    gradients_match_reference(case, impl, in_domain=_in_gradient_domain)


# ------------------------------------------------------------------ properties

def _layout_like(spec: TensorSpec, t: torch.Tensor) -> torch.Tensor:
    return spec.layout.apply(t) if spec.layout is not None else t.clone()


@st.composite
def _with_scale(draw, op: OpSpec, dtype: torch.dtype) -> Case:
    case = draw(op.cases(dtype))
    return Case(case.op, case.dtype, case.args, case.tensors, {**case.params, "c": draw(st.sampled_from(SCALES_C))},
                case.kwargs)


def scale_equivariant(case: Case, impl: Implementation) -> None:
    """rms_norm(c x, eps c^2) equals sign(c) rms_norm(x, eps) for c a power of two of
    either sign (c x exact, and eps scaled with x^2 so that the identity holds
    whatever eps is, not only where it is negligible), within the sum of the two calls'
    allowances, as each is within its allowance of the same exact value. Cases where c x
    is not exact (an overflow, a subnormal that loses bits) or leaves the domain are
    drawn again."""
    values = case.materialise(backend.device())
    x, c, eps = values["x"], float(case.params.get("c", -2.0)), case.params["eps"]
    x64 = to_numpy(x)
    scaled = torch.from_numpy(c * x64).to(x.dtype)
    assume(np.array_equal(scaled.double().numpy(), c * x64))
    assume(float(scaled.abs().max()) <= domain_cap(x.dtype, x.shape[-1]))
    args = {k: v for k, v in values.items() if k != "c"}
    _, outs1 = run(case, impl, args)
    _, outs2 = run(case, impl, {**args, "x": _layout_like(case.tensors["x"], scaled.to(x.device)),
                                "eps": eps * c * c})
    w = to_numpy(values["weight"])
    p = precision(impl, case)
    want = ref.rms_norm(x64, w, eps)
    allowed = rules.rms_norm(x64, w, want, eps, p) + rules.rms_norm(c * x64, w, math.copysign(1.0, c) * want,
                                                                    eps * c * c, p)
    assert_close("y", outs2["y"], math.copysign(1.0, c) * to_numpy(outs1["y"]), allowed,
                 what=f"rms_norm({c:g} x, eps * {c * c:g}) != sign({c:g}) rms_norm(x, eps)", record=False)


@st.composite
def _with_permutation(draw, op: OpSpec, dtype: torch.dtype) -> Case:
    case = draw(op.cases(dtype))
    return Case(case.op, case.dtype, case.args, case.tensors,
                {**case.params, "permutation_seed": draw(st.integers(0, 2**32 - 1))}, case.kwargs)


def permutation_equivariant(case: Case, impl: Implementation) -> None:
    """Permuting the hidden dim of x and weight together permutes y: rms_norm(x[..., P],
    weight[P]) equals rms_norm(x, weight)[..., P], within twice the allowance (the sum of
    squares is taken in another order, so not bitwise; each call is within the per-call
    allowance, which the permutation permutes, of the same exact value)."""
    values = case.materialise(backend.device())
    x, w = values["x"], values["weight"]
    n = x.shape[-1]
    perm = torch.from_numpy(np.random.default_rng(case.params.get("permutation_seed", 0)).permutation(n))
    args = {k: v for k, v in values.items() if k != "permutation_seed"}
    _, outs = run(case, impl, args)
    moved = perm.to(x.device)
    _, outs_p = run(case, impl, {**args, "x": _layout_like(case.tensors["x"], x[..., moved]),
                                 "weight": _layout_like(case.tensors["weight"], w[moved])})
    x64, w64 = to_numpy(x), to_numpy(w)
    eps = case.params["eps"]
    allowed = rules.rms_norm(x64, w64, ref.rms_norm(x64, w64, eps), eps, precision(impl, case))
    p = perm.numpy()
    assert_close("y", outs_p["y"], to_numpy(outs["y"])[..., p], 2 * allowed[..., p],
                 what="rms_norm(x[..., P], weight[P]) != rms_norm(x, weight)[..., P]", record=False)


def _promises_batch_invariance(impl: Implementation) -> str | None:
    if getattr(impl.fn, "batch_invariant", False):
        return None
    return f"{impl.name} does not declare batch_invariant = True (each row's outputs bitwise free of the batch)"


def batch_invariant(case: Case, impl: Implementation) -> None:
    """For an implementation that declares ``batch_invariant = True``: each row's outputs
    are bitwise the same whether the row is called alone, with the case's other rows, or
    with EXTRA_ROWS more rows before and after it (row counts on both sides of the
    kernels' block and group heuristics). All calls are on contiguous [rows, N] tensors,
    so that only the batch differs (not the layout)."""
    op = case.op
    values = case.materialise(backend.device())
    n = values["x"].shape[-1]
    per_row = [a for a in case.args if a in ("x", "residual")]
    rows = {a: values[a].reshape(-1, n).contiguous() for a in per_row}
    m = rows["x"].shape[0]
    gen = torch.Generator().manual_seed(m * 7919 + n)
    # other rows: the case's own rows halved (exact; in the domain) and reordered
    pad = {a: (0.5 * t.flip(0)).repeat(EXTRA_ROWS // m + 1, 1)[:EXTRA_ROWS] for a, t in rows.items()}
    order = torch.randperm(EXTRA_ROWS, generator=gen).to(rows["x"].device)
    pad = {a: t[order] for a, t in pad.items()}

    def call(tensors):
        _, outs = run(case, impl, {**values, **tensors})
        return outs

    alone = call(rows)
    padded = call({a: torch.cat([pad[a], rows[a], pad[a]]) for a in per_row})
    for i in sorted({0, m - 1}):
        single = call({a: t[i:i + 1].clone() for a, t in rows.items()})
        for name, out in alone.items():
            assert_identical(name, out[i], single[name][0],
                             f"{impl.name} ({op}): row {i} of {m} differs from the same row called alone")
            assert_identical(name, out[i], padded[name][EXTRA_ROWS + i],
                             f"{impl.name} ({op}): row {i} differs when {EXTRA_ROWS} rows come before and after")


def residual_sum_exact(case: Case, impl: Implementation) -> None:
    """h is x + residual exactly as PyTorch forms it in the input dtype (the sum rounded
    once): bit for bit, in the input dtype. A model feeds h to its next residual add, so
    an h in another dtype or rounded otherwise changes every later layer."""
    values, outs = run(case, impl)
    x, residual = values["x"], values["residual"]
    h = outs["h"]
    if h.dtype != x.dtype:
        raise AssertionError(f"h has dtype {h.dtype}, the contract says the input dtype {x.dtype}")
    assert_identical("h", (x + residual).detach(), h.detach(), f"{impl.name}: h is not x + residual in {x.dtype}")


# ------------------------------------------------------------------ the records' side pieces

def _rms_norm_baseline(case, values, outs):
    """torch's own RMSNorm (F.rms_norm) in the input dtype."""
    x = values["x"]
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), values["weight"], values.get("eps", 1e-6))


def _add_rms_norm_baseline(case, values, outs):
    """The residual sum in the input dtype, then torch's own RMSNorm in it."""
    h = values["x"] + values["residual"]
    return torch.nn.functional.rms_norm(h, (h.shape[-1],), values["weight"], values.get("eps", 1e-6)), h


def _valid_call(residual: bool):
    def valid(dims, device):
        b, n = dims["b"], dims["n"]
        out = {"x": randn((b, n), device), "weight": randn((n,), device), "eps": 1e-6}
        if residual:
            out["residual"] = randn((b, n), device)
        return out
    return valid


RMS_NORM_BAD_INPUT = BadInput(
    _valid_call(residual=False),
    tensor_spoilers("x", fixed_rank=False) + tensor_spoilers("weight", fixed_rank=True)
    + (Spoiler("weight", "one element more than x's last dim", lambda a: widen_last(a["weight"])),
       Spoiler("weight", "float16 while x is float32", lambda a: a["weight"].half()),
       Spoiler("x", "an empty last dim", lambda a: a["x"][..., :0]))
    + scalar_spoilers("eps", (0.0, -1e-6, math.nan, math.inf, "small", True)))

ADD_RMS_NORM_BAD_INPUT = BadInput(
    _valid_call(residual=True),
    tensor_spoilers("x", fixed_rank=False) + tensor_spoilers("residual", fixed_rank=False)
    + tensor_spoilers("weight", fixed_rank=True)
    + (Spoiler("residual", "a longer last dim than x", lambda a: widen_last(a["residual"])),
       Spoiler("residual", "one row more than x", lambda a: torch.cat([a["residual"], a["residual"][:1]])),
       Spoiler("residual", "bfloat16 while x is float32", lambda a: a["residual"].bfloat16()),
       Spoiler("weight", "one element more than x's last dim", lambda a: widen_last(a["weight"])))
    + scalar_spoilers("eps", (0.0, -1e-6, math.nan, "small")))


def _grad_checks() -> tuple[Check, ...]:
    return tuple(c if c.name != "gradients_match_reference" else Check(
        c.name, gradients_in_range_match_reference, cases=c.cases, requires=c.requires)
        for c in generic_checks(grad=True))


register(OpSpec(
    name="rms_norm",
    declarations=(RMS_NORM_CAST, BATCH_INVARIANT),
    signature="rms_norm(x, weight, eps=1e-6) -> y",
    meaning="over the last dim; `x [..., N]`, `weight` `[N]`; `y = x / sqrt(mean(x^2) + eps) * weight`; "
            "where y rounds to the input dtype is declared (`rms_norm_cast`)",
    scalars=("eps",),
    dims={"N": ("x", -1)},
    arguments=("x", "weight", "eps"),
    outputs=("y",),
    kernel="tritoncheck.kernels.rms_norm:rms_norm",
    controls=("tritoncheck.controls.rms_norm:torch_rms_norm_llama", "tritoncheck.controls.rms_norm:torch_rms_norm_fp32"),
    baseline=_rms_norm_baseline,
    large_problem=LargeProblem(row_wise(4099, "x", vectors=("weight",)), "rows", ("x",), whole_sum_grads=("weight",)),
    bad_input=RMS_NORM_BAD_INPUT,
    reference=ref.rms_norm,
    torch_reference=ref.rms_norm_torch,
    cases=rms_norm_cases,
    tolerance=rms_norm_tolerance,
    grad_tolerance=rms_norm_grad_tolerance,
    grad_inputs=("x", "weight"),
    grad_outputs=("y",),
    output_shapes=lambda case: {"y": case.tensors["x"].shape},
    checks=_grad_checks() + (
        Check("scale_equivariant", scale_equivariant, cases=_with_scale, needs_arguments=("eps",)),
        Check("permutation_equivariant", permutation_equivariant, cases=_with_permutation),
        Check("batch_invariant", batch_invariant, requires=_promises_batch_invariance),
    ),
))

register(OpSpec(
    name="add_rms_norm",
    declarations=(RMS_NORM_CAST, BATCH_INVARIANT),
    signature="add_rms_norm(x, residual, weight, eps=1e-6) -> (y, h)",
    meaning="`h = x + residual` in the input dtype (returned for the next residual add), "
            "`y = rms_norm(h, weight, eps)`; `x`, `residual` `[..., N]`, `weight` `[N]`",
    scalars=("eps",),
    dims={"N": ("x", -1)},
    arguments=("x", "residual", "weight", "eps"),
    outputs=("y", "h"),
    kernel="tritoncheck.kernels.rms_norm:add_rms_norm",
    controls=("tritoncheck.controls.rms_norm:torch_add_rms_norm_llama",
              "tritoncheck.controls.rms_norm:torch_add_rms_norm_fp32"),
    baseline=_add_rms_norm_baseline,
    large_problem=LargeProblem(row_wise(4099, "x", "residual", vectors=("weight",)), "rows", ("x", "residual"),
                               whole_sum_grads=("weight",)),
    bad_input=ADD_RMS_NORM_BAD_INPUT,
    reference=ref.add_rms_norm,
    torch_reference=ref.add_rms_norm_torch,
    cases=add_rms_norm_cases,
    tolerance=add_rms_norm_tolerance,
    grad_tolerance=add_rms_norm_grad_tolerance,
    grad_inputs=("x", "residual", "weight"),
    grad_outputs=("y", "h"),
    output_shapes=lambda case: {"y": case.tensors["x"].shape, "h": case.tensors["x"].shape},
    checks=_grad_checks() + (
        Check("residual_sum_exact", residual_sum_exact),
        Check("batch_invariant", batch_invariant, requires=_promises_batch_invariance),
    ),
))
