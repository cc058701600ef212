"""layer_norm and dropout_residual_layer_norm: strategies, tolerance binding and properties.

The domain of both ops: every input finite, and the sum over a row of the squared
deviations from its mean finite in fp32, where any implementation accumulates it:
``N (2 max|x|)^2 <= fp32 max``, i.e. ``max|x| <= sqrt(fp32 max / N) / 2`` (about 1e17
for N = 300, 7e16 for N = 16384). Beyond it ``(x - mean)^2`` or the row sum of squares
overflows in a correct fp32-accumulating kernel (fp32/bf16 inputs; fp16's 65504 is far
inside). The output must be finite in the dtype too, so weights are capped at
``max / (4 sqrt N)`` (``|x_hat| <= sqrt(N - 1)``) and biases at ``max / 4``. For the fused
dropout op, ``h = x / (1 - p) + residual`` must lie in the same domain and be finite
in the input dtype (plain torch forms it there): ``x`` is capped at ``L (1 - p) / 2``
and ``residual`` at ``L / 2``.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck import backend, generic, parity, rounding_bias, tolerance
from tritoncheck.bad_input import BadInput, Spoiler, randn, scalar_spoilers, tensor_spoilers, widen_last
from tritoncheck.config import CONFIG
from tritoncheck.generic import calls_independent, generic_checks, gradients_match_reference, precision, run, snapshot
from tritoncheck.large_problem import LargeProblem, row_wise
from tritoncheck.limits import NO_LIMITS, Limits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.parity import control_baseline
from tritoncheck.properties import norms_tolerance as rules
from tritoncheck.references import norms as ref
from tritoncheck.registry import OPS, Check, Implementation, OpSpec, register
from tritoncheck.stats import COINCIDENCE, FALSE_ALARM
from tritoncheck.stats import binomial_tail_bound as _binomial_tail_bound
from tritoncheck.strategies import Case, TensorSpec, sizes, special_values, tensors

BLOCKS = (64, 4096)  # the kernel's column-block caps (interpreter, GPU): rows past one block loop
LN_ROW_BLOCKS = 16  # small profile: rows x ceil(N / 64) per layer_norm case
DROPOUT_ROW_BLOCKS = 8  # and per dropout case (Philox under the interpreter is slow)
# Longest row of the interpreter's long branch: one layer_norm row of 4097 takes 1.4 s
# forward and backward there (65537: 21 s), so the CPU profile stops just past 4096.
# Dropout gets none on CPU: one dropout row of 4097 takes 4 s forward (65537: 83 s), and
# with rows up to 4099 one test (float32 seed_reproducible) took 274 s of a 339 s op run.
# The GPU profile reaches past 2**17 for both.
LN_LONG_SMALL = 4099
DROPOUT_LONG_SMALL = 0
LONG_ROW = 2**17 + 3
EPSILONS = (1e-5, 1e-6, 1e-2)
DROP_PS = (0.0, 0.1, 0.5, 0.9)
# "offset" twice: a large common offset (|mean| >> std) is the hazard of a norm (a
# one-pass E[x^2] - mean^2 variance cancels to noise there), so it gets twice the weight.
X_FAMILIES = ("normal", "near_max", "tiny", "constant", "outlier", "offset", "offset")
WEIGHT_FAMILIES = ("normal", "constant", "outlier")
BIAS_FAMILIES = ("normal", "constant", "outlier", "offset")
AFFINE_SCALES = (1.0, 0.1, 10.0, 1e-3)
FP32_MAX = float(torch.finfo(torch.float32).max)
# The false-alarm rates of the keep-mask checks and the binomial tail bound are shared with
# attention's dropout checks: tritoncheck/stats.py (with why 1e-8).


def domain_cap(dtype: torch.dtype, n: int) -> float:
    """Largest |x| of the op's domain for rows of length n (module docstring)."""
    return min(float(torch.finfo(dtype).max), math.sqrt(FP32_MAX / n) / 2)


@st.composite
def _shape(draw, row_blocks: int, long_max_small: int, limits: Limits, op: str,
           dtype: torch.dtype) -> tuple[int, ...]:
    """Rows of any length (past one column block included) under 0-2 leading dims.

    On the interpreter a call costs about (rows x column blocks of 64) programs-worth
    of work (the dropout kernel's Philox is the dearest), so the small profile bounds
    that product by ``row_blocks``: up to 12 rows of N <= 64, 2-3 rows of N ~ 300.
    Rarely (``strategies.lengths``) a row reaches past 4096, up to ``long_max_small`` on
    the interpreter and past 2**17 on a GPU."""
    n = draw(limits.length(op, "N", 1, CONFIG.pick(300, 16384), long_max=CONFIG.pick(long_max_small, LONG_ROW),
                           long_percent=CONFIG.long_percent(3), blocks=BLOCKS))
    small_rows = max(1, row_blocks // -(-n // BLOCKS[0]))
    max_rows = max(1, min(CONFIG.pick(min(12, small_rows), 4096), CONFIG.pick(2**12, 2**21) // n))
    lead = tuple(draw(st.lists(sizes(1, max_rows), max_size=2).filter(lambda d: math.prod(d) <= max_rows)))
    return lead + (n,)


def _affine(draw, n: int, dtype: torch.dtype) -> tuple[TensorSpec, TensorSpec]:
    big = float(torch.finfo(dtype).max)
    weight = draw(tensors((n,), dtype, families=WEIGHT_FAMILIES, scales=AFFINE_SCALES,
                          max_magnitude=big / (4 * math.sqrt(n))))
    bias = draw(tensors((n,), dtype, families=BIAS_FAMILIES, scales=AFFINE_SCALES, max_magnitude=big / 4))
    return weight, bias


@st.composite
def layer_norm_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """x [..., N] in any layout and value family of the domain; strided weight/bias."""
    shape = draw(_shape(LN_ROW_BLOCKS, LN_LONG_SMALL, limits, "layer_norm", dtype))
    n = shape[-1]
    cap = domain_cap(dtype, n)
    x = draw(tensors(shape, dtype, families=X_FAMILIES, max_magnitude=cap,
                     specials=special_values(dtype, max_magnitude=cap)))
    weight, bias = _affine(draw, n, dtype)
    eps = draw(limits.choice("eps", EPSILONS))
    return Case("layer_norm", str(dtype).replace("torch.", ""), ("x", "weight", "bias", "eps"),
                {"x": x, "weight": weight, "bias": bias}, {"eps": eps})


@st.composite
def dropout_residual_layer_norm_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """x and residual [..., N] in any layouts and value families of the domain, p, seed."""
    shape = draw(_shape(DROPOUT_ROW_BLOCKS, DROPOUT_LONG_SMALL, limits, "dropout_residual_layer_norm", dtype))
    n = shape[-1]
    p = draw(st.sampled_from(DROP_PS))
    cap = domain_cap(dtype, n)
    x = draw(tensors(shape, dtype, families=X_FAMILIES, max_magnitude=cap * (1 - p) / 2,
                     specials=special_values(dtype, max_magnitude=cap * (1 - p) / 2)))
    residual = draw(tensors(shape, dtype, families=X_FAMILIES, max_magnitude=cap / 2,
                            specials=special_values(dtype, max_magnitude=cap / 2)))
    weight, bias = _affine(draw, n, dtype)
    seed = draw(st.one_of(st.integers(0, 2**16), st.integers(0, 2**63 - 1)))
    eps = draw(limits.choice("eps", EPSILONS))
    return Case("dropout_residual_layer_norm", str(dtype).replace("torch.", ""),
                ("x", "residual", "weight", "bias", "p", "seed", "eps"),
                {"x": x, "residual": residual, "weight": weight, "bias": bias},
                {"p": p, "seed": seed, "eps": eps})


# ------------------------------------------------------------------ tolerance binding

def layer_norm_tolerance(case, inputs64, expected, p):
    return {"y": rules.layer_norm(inputs64["x"], inputs64["weight"], inputs64["bias"], expected["y"],
                                case.params["eps"], p)}


def layer_norm_grad_tolerance(case, inputs64, outputs64, grads64, p):
    return rules.layer_norm_grad(inputs64["x"], inputs64["weight"], inputs64["dy"], grads64["x"],
                               grads64["weight"], grads64["bias"], case.params["eps"], p)


def _dropout_allowed(x, residual, weight, bias, keep, p_drop, eps, y_ref, p):
    """The layer-norm rule on h as the contract forms it (NumPy or tensors, on the rules' device)."""
    x, residual = tolerance.float64_on(x), tolerance.float64_on(residual)
    keep = torch.as_tensor(keep, device=x.device).to(torch.bool)
    h = torch.where(keep, x / (1.0 - p_drop), 0.0) + residual
    err = rules.dropout_input_error(x, residual, keep, p_drop, p)
    return rules.layer_norm(h, weight, bias, y_ref, eps, p, input_err=err)


def dropout_tolerance(case, inputs64, expected, p):
    """Used only where the reference is defined without the implementation's mask (p = 0)."""
    keep = np.ones(inputs64["x"].shape, dtype=bool)
    return {"y": _dropout_allowed(inputs64["x"], inputs64["residual"], inputs64["weight"], inputs64["bias"], keep,
                                  case.params["p"], case.params["eps"], expected["y"], p),
            "keep": np.zeros(inputs64["x"].shape)}


def dropout_reference(x, residual, weight, bias, p, seed, eps=1e-5):
    """fp64 reference of the fused op where the contract fixes the mask: at p = 0
    every element is kept (``keep`` all True). For p > 0 the mask comes from the
    implementation's own RNG; the suite then checks y against
    ``tritoncheck.references.norms.dropout_residual_layer_norm_given_keep`` built from the returned
    mask (``dropout_matches_reference``) and the mask by its own properties."""
    if p != 0:
        raise ValueError("dropout_residual_layer_norm has no reference for p > 0 without the keep mask: use "
                         "tritoncheck.references.norms.dropout_residual_layer_norm_given_keep(x, residual, weight, bias, p, "
                         "keep, eps) with the implementation's keep")
    x = np.asarray(x, dtype=np.float64)
    return ref.layer_norm(x + np.asarray(residual, dtype=np.float64), weight, bias, eps), np.ones(x.shape, bool)


def dropout_reference_torch(x, residual, weight, bias, p, seed, eps=1e-5):
    """:func:`dropout_reference` in float64 torch on the inputs' device."""
    keep = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    if p != 0:
        dropout_reference(x, residual, weight, bias, p, seed, eps)  # raises, saying what to use
    return ref.dropout_residual_layer_norm_given_keep_torch(x, residual, weight, bias, 0.0, keep, eps), keep


# ------------------------------------------------------------------ layer_norm properties

def _apply_layout(spec: TensorSpec, t: torch.Tensor) -> torch.Tensor:
    return spec.layout.apply(t) if spec.layout is not None else t.clone()


def normalised_moments(case: Case, impl: Implementation) -> None:
    """With unit weight and zero bias, each row of y has mean 0 and (biased) variance
    var / (var + eps), var the row's variance, within the row mean of the elements'
    allowances (mean) and 2 mean(|x_hat| a) + mean((a + mean a)^2) (variance)."""
    values = case.materialise(backend.device())
    x = values["x"]
    n = x.shape[-1]
    values["weight"] = torch.ones(n, dtype=x.dtype, device=x.device)
    values["bias"] = torch.zeros(n, dtype=x.dtype, device=x.device)
    _, outs = run(case, impl, values)
    x64 = to_numpy(x).reshape(-1, n)
    eps = case.params["eps"]
    y = to_numpy(outs["y"]).reshape(-1, n)
    xhat = ref.layer_norm(x64, np.ones(n), np.zeros(n), eps)
    a = rules.layer_norm(x64, np.ones(n), np.zeros(n), xhat, eps, precision(impl, case))
    var = np.var(x64, axis=-1)
    fp64 = n * tolerance.unit_roundoff(torch.float64) * (1 + np.max(np.abs(xhat), axis=-1, initial=0.0)) ** 2
    abar = a.mean(axis=-1)
    dtype = getattr(torch, case.dtype)
    assert_close("row means of y", torch.from_numpy(y.mean(axis=-1)), np.zeros(var.shape), abar + fp64,
                 what="rows of y (weight 1, bias 0) do not have mean 0", dtype=dtype, record=False, vacuity=True)
    want = var / (var + eps)
    allowed = 2 * np.mean(np.abs(xhat) * a, axis=-1) + np.mean((a + abar[..., None]) ** 2, axis=-1) + fp64
    assert_close("row variances of y", torch.from_numpy(y.var(axis=-1)), want, allowed,
                 what="rows of y (weight 1, bias 0) do not have variance var / (var + eps)", dtype=dtype,
                 record=False, vacuity=True, noise=fp64)  # fp64: the reference's own error, derived above


def constant_row_gives_bias(case: Case, impl: Implementation) -> None:
    """Every row of x set to a constant (its first element) gives y = bias, within the
    forward rule's allowance, which for a constant row is the rounding of the mean
    times rstd = 1/sqrt(eps) (not bitwise: torch's CPU F.layer_norm evaluates
    x * rstd - mean * rstd with a fused multiply-add in fp16/bf16 and is off by
    u(fp32) |x| / sqrt(eps); a kernel that does not refine its mean is off by the
    mean's rounding; the project kernel is exact)."""
    values = case.materialise(backend.device())
    x = values["x"]
    x.copy_(x[..., :1].expand(x.shape).clone())
    _, outs = run(case, impl, values)
    x64 = to_numpy(x)
    w, b = to_numpy(values["weight"]), to_numpy(values["bias"])
    want = np.broadcast_to(b, x64.shape)
    allowed = rules.layer_norm(x64, w, b, want, case.params["eps"], precision(impl, case))
    assert_close("y", outs["y"], want, allowed, what="a constant row of x does not give y = bias", record=False,
                 vacuity=True)  # bias is exact: no reference noise


def _exact_affine(x0: np.ndarray, a: float, c: float, dtype: torch.dtype):
    """(x1, x_new) with x1 close to x0, both exactly representable in dtype and
    x_new = a * x1 + c exactly (a a power of two; c moved to a representable multiple).
    x1 keeps x0's values rounded to the spacing of x_new's magnitude, so that a * x1 + c
    needs no rounding. None if that fails (an overflow, a crossed binade)."""
    q = tolerance.ulp(np.abs(a * x0) + abs(c), dtype)
    qmax = float(q.max(initial=0.0))
    if qmax > 0:
        c = round(c / qmax) * qmax
    q = tolerance.ulp(np.abs(a * x0) + abs(c), dtype)
    x1 = np.round(a * x0 / q) * q / a
    x_new = a * x1 + c
    t1, t2 = torch.from_numpy(x1).to(dtype), torch.from_numpy(x_new).to(dtype)
    if not (np.array_equal(t1.double().numpy(), x1) and np.array_equal(t2.double().numpy(), x_new)):
        return None
    return t1, t2, c


SCALES_A = (1.0, 2.0, 0.5, 4.0, 0.125)
SHIFTS_C = (0.0, 1e4, -1e4, 3.0, -64.0, 3e4)


@st.composite
def _with_affine(draw, op: OpSpec, dtype: torch.dtype) -> Case:
    case = draw(op.cases(dtype))
    a = draw(st.sampled_from(SCALES_A))
    c = draw(st.sampled_from(SHIFTS_C))
    return Case(case.op, case.dtype, case.args, case.tensors, {**case.params, "a": a, "c": c}, case.kwargs)


def shift_scale_invariant(case: Case, impl: Implementation) -> None:
    """layer_norm(a x + c, eps a^2) equals layer_norm(x, eps) for a > 0 and any c. The
    inputs are made exact: a is a power of two, and x is rounded to the spacing of
    a x + c (c to a multiple of it), so both calls see exactly related inputs; their
    outputs must agree within the sum of both allowances (the large shifts, c = 1e4 on
    rows of std ~1, are the catastrophic-cancellation case)."""
    values = case.materialise(backend.device())
    x = values["x"]
    dtype = x.dtype
    a, c = float(case.params.get("a", 2.0)), float(case.params.get("c", 1e4))
    exact = _exact_affine(to_numpy(x), a, c, dtype)
    assume(exact is not None)
    x1, x2, c = exact
    n = x.shape[-1]
    assume(float(x2.abs().max()) <= domain_cap(dtype, n))
    spec = case.tensors["x"]
    eps = case.params["eps"]
    args = {k: v for k, v in values.items() if k not in ("a", "c")}
    _, outs1 = run(case, impl, {**args, "x": _apply_layout(spec, x1.to(x.device))})
    _, outs2 = run(case, impl, {**args, "x": _apply_layout(spec, x2.to(x.device)), "eps": eps * a * a})
    w, b = to_numpy(values["weight"]), to_numpy(values["bias"])
    p = precision(impl, case)
    x1n, x2n = x1.double().numpy(), x2.double().numpy()
    want = ref.layer_norm(x1n, w, b, eps)
    allowed = rules.layer_norm(x1n, w, b, want, eps, p) + rules.layer_norm(x2n, w, b, want, eps * a * a, p)
    assert_close("y", outs2["y"], to_numpy(outs1["y"]), allowed,
                 what=f"layer_norm({a:g} x + {c:g}, eps * {a * a:g}) != layer_norm(x, eps)", record=False)


def _in_gradient_domain(case: Case, inputs64, outputs64, grads64) -> None:
    """Reject (``assume``) cases whose exact gradients do not fit the dtype (fp16: dx ~
    dy w / sqrt(eps) passes 65504 for a large upstream gradient on a row of tiny spread),
    and cases where the fp32 intermediates of torch's backward formula overflow (|x|
    near the forward domain's cap with a large upstream gradient)."""
    big = float(torch.finfo(getattr(torch, case.dtype)).max) / 2
    assume(all(np.all(np.isfinite(g)) and float(np.max(np.abs(g))) <= big for g in grads64.values() if g.size))
    # torch's CPU backward (the control) expands dx = a w dy + b x + c; the rounding of
    # its sums makes b up to u(fp32) sum|w dy x| rstd^3 / N (0 in exact arithmetic on a
    # constant row), and b x must stay finite in fp32.
    x = inputs64["x"].reshape(-1, inputs64["x"].shape[-1])
    g = (inputs64["weight"] * inputs64["dy"]).reshape(x.shape)
    n = x.shape[-1]
    rstd = 1 / np.sqrt(x.var(axis=-1) + inputs64["eps"])
    s = np.abs(g * x).sum(axis=-1) * tolerance.U32 * rstd**3
    a = np.abs(x).max(axis=-1)
    assume(bool(np.all(s * np.maximum(a / n, 1.0) <= FP32_MAX / 16)))


def gradients_in_range_match_reference(case: Case, impl: Implementation) -> None:
    """Gradients of x, weight and bias match fp64 PyTorch autograd on the same rounded
    inputs and upstream gradients, within the derived tolerance; cases outside the
    gradient domain (see _in_gradient_domain) are drawn again."""
    gradients_match_reference(case, impl, in_domain=_in_gradient_domain)


# ------------------------------------------------------------------ dropout properties

def _check_dropout_outputs(x: torch.Tensor, outs) -> None:
    keep = outs["keep"]
    if keep.dtype != torch.bool:
        raise AssertionError(f"output 'keep' has dtype {keep.dtype}, the contract says torch.bool")
    if tuple(keep.shape) != tuple(x.shape):
        raise AssertionError(f"output 'keep' has shape {list(keep.shape)}, x has {list(x.shape)}")
    if outs["y"].dtype != x.dtype:
        raise AssertionError(f"output 'y' has dtype {outs['y'].dtype}, the contract says {x.dtype}")


def _dropout_run(case: Case, impl: Implementation, values=None):
    values, outs = run(case, impl, values)
    _check_dropout_outputs(values["x"], outs)
    return values, outs


def dropout_matches_reference(case: Case, impl: Implementation) -> None:
    """y matches the fp64 reference layer_norm(where(keep, x / (1 - p), 0) + residual)
    built from the keep mask the implementation returned and the inputs as they were
    before the call, within the derived tolerance (which allows h to be formed in the
    input dtype)."""
    values = case.materialise(backend.device())
    before = snapshot(values)
    _, outs = run(case, impl, values)
    assert_dropout_matches(OPS[case.op], case, impl, before, outs)


def assert_dropout_matches(op: OpSpec, case: Case, impl: Implementation, values, outs) -> None:
    """``outs`` against the fp64 reference given their own keep mask, of ``values`` taken
    before the call (a kernel that rewrote its inputs to agree with a wrong y would agree
    with a reference computed after it): calls_independent's comparison for this op,
    where the reference needs the mask the call returned."""
    _check_dropout_outputs(values["x"], outs)
    keep = outs["keep"]
    v = {k: values[k].detach() for k in ("x", "residual", "weight", "bias")}
    prm = case.params
    # fp64 on the kernel's device (the GPU's: no host round trip of the rows)
    want = ref.dropout_residual_layer_norm_given_keep_torch(v["x"], v["residual"], v["weight"], v["bias"],
                                                            prm["p"], keep, prm["eps"])
    allowed = _dropout_allowed(v["x"], v["residual"], v["weight"], v["bias"], keep, prm["p"], prm["eps"], want,
                               precision(impl, case))
    baseline = parity.baseline_errors(case.op, values["x"].dtype, case, values, outs, {"y": want})
    parity.assert_close("y", outs["y"], want, allowed, baseline["y"], dtype=values["x"].dtype,
                        what="y does not match the reference given the returned keep")


def _bias_cases(op: OpSpec, dtype: torch.dtype):
    rounding_bias.require_narrowing(op, dtype)
    return _with_p(op, dtype, (0.0,)).map(rounding_bias.spread_values)


def dropout_calls_independent(case: Case, impl: Implementation) -> None:
    """calls_independent (tritoncheck/generic.py) at every p: each of the two calls (the
    same seed, so by the contract the same mask) is compared with the fp64 reference
    given the keep mask it returned, from its inputs as they were before it."""
    calls_independent(case, impl, compare=assert_dropout_matches)


@st.composite
def _with_p(draw, op: OpSpec, dtype: torch.dtype, ps: tuple[float, ...]) -> Case:
    case = draw(op.cases(dtype))
    return case.replace(p=draw(st.sampled_from(ps)))


def p_zero_is_layer_norm(case: Case, impl: Implementation) -> None:
    """At p = 0 every element is kept (keep all True, exactly) and y is
    layer_norm(x + residual) of the fp64 reference, within the tolerance: not bitwise
    the op's own layer_norm, since the contract does not fix where x + residual rounds
    (fp32 inside a fused kernel, the input dtype in plain torch)."""
    assert case.params["p"] == 0.0
    values, outs = _dropout_run(case, impl)
    keep = outs["keep"]
    if not bool(keep.all()):
        dropped = (~keep).nonzero()
        raise AssertionError(f"p = 0 but {dropped.shape[0]} of {keep.numel()} elements were dropped; first at "
                             f"{[int(i) for i in dropped[0]]}")
    v = {k: to_numpy(values[k]) for k in ("x", "residual", "weight", "bias")}
    eps = case.params["eps"]
    want = ref.layer_norm(v["x"] + v["residual"], v["weight"], v["bias"], eps)
    allowed, noise = (_dropout_allowed(v["x"], v["residual"], v["weight"], v["bias"], np.ones(want.shape, bool), 0.0,
                                       eps, want, prec)
                      for prec in (precision(impl, case), tolerance.reference_precision(precision(impl, case))))
    assert_close("y", outs["y"], want, allowed, what="at p = 0, y is not layer_norm(x + residual)", record=False,
                 vacuity=True, noise=noise)


def keep_fraction_binomial(case: Case, impl: Implementation) -> None:
    """The number of kept elements is consistent with Binomial(numel, 1 - p): a
    two-sided Chernoff test, rigorous at a false-alarm rate below FALSE_ALARM per example
    (at p = 0 a single dropped element fails). Small tensors have little power but no
    more false alarms, so they are not skipped."""
    _, outs = _dropout_run(case, impl)
    keep = outs["keep"]
    n = keep.numel()
    assume(n > 0)
    k = int(keep.sum())
    q = 1.0 - case.params["p"]
    bound = _binomial_tail_bound(k, n, q)
    if bound < FALSE_ALARM / 2:
        raise AssertionError(f"kept {k} of {n} elements ({k / n:.4f}) at p = {case.params['p']:g}: expected "
                             f"{q:.4f} of them; a count this far from {n * q:.1f} has probability <= {bound:.3g}")


def seed_reproducible(case: Case, impl: Implementation) -> None:
    """The same seed gives bitwise the same keep and y; another seed gives another
    mask, and the rows of one call do not share a mask: the latter two only where a
    coincidence has probability below COINCIDENCE ((p^2 + (1-p)^2)^count), each of the
    three tests at most that, 3 COINCIDENCE per example."""
    values, outs = _dropout_run(case, impl)
    _, again = _dropout_run(case, impl, dict(values))
    assert_identical("keep", outs["keep"], again["keep"], "the same seed gave another keep mask")
    assert_identical("y", outs["y"], again["y"], "the same seed gave another y")
    p = case.params["p"]
    same = p * p + (1 - p) * (1 - p)  # probability that two independent elements agree
    keep = outs["keep"]
    n = keep.shape[-1]
    rows = keep.reshape(-1, n)
    m = rows.shape[0]

    def unlikely(count):
        return same < 1 and count * math.log(same) < math.log(COINCIDENCE)

    if unlikely(keep.numel()):
        other = dict(values, seed=(case.params["seed"] + 1) % 2**63)
        _, outs2 = _dropout_run(case, impl, other)
        if torch.equal(outs2["keep"], keep):
            raise AssertionError(f"seeds {case.params['seed']} and {other['seed']} gave the same keep mask of "
                                 f"{keep.numel()} elements at p = {p:g}")
    if m >= 2 and unlikely(n * (m - 1)) and all(torch.equal(rows[0], rows[i]) for i in range(1, m)):
        raise AssertionError(f"all {m} rows got the same keep mask (N = {n}, p = {p:g}): the random stream "
                             "does not depend on the row")
    if m >= 2 and same < 1 and math.log(m * (m - 1) / 2) + n * math.log(same) < math.log(COINCIDENCE):
        seen = {}
        for i in range(m):
            key = bytes(rows[i].cpu().numpy().tobytes())
            if key in seen:
                raise AssertionError(f"rows {seen[key]} and {i} got the same keep mask (N = {n}, p = {p:g})")
            seen[key] = i



def _dropout_residual_layer_norm_baseline(case, values, outs):
    """Plain PyTorch in the input dtype, given the implementation's own keep mask."""
    x, keep, p = values["x"], outs["keep"], values["p"]
    h = torch.where(keep, x / (1 - p), torch.zeros((), dtype=x.dtype, device=x.device)) + values["residual"]
    y = torch.nn.functional.layer_norm(h, (x.shape[-1],), values["weight"], values["bias"], values.get("eps", 1e-5))
    return y, keep


register(OpSpec(
    name="layer_norm",
    signature="layer_norm(x, weight, bias, eps=1e-5) -> y",
    meaning="over the last dim; `x [..., N]`, `weight`, `bias` `[N]`; biased variance; "
            "`y = (x - mean) / sqrt(var + eps) * weight + bias`",
    scalars=("eps",),
    dims={"N": ("x", -1)},
    arguments=("x", "weight", "bias", "eps"),
    outputs=("y",),
    kernel="tritoncheck.kernels.norms:layer_norm",
    controls=("tritoncheck.controls.norms:torch_layer_norm",),
    baseline=control_baseline("tritoncheck.controls.norms:torch_layer_norm"),
    large_problem=LargeProblem(row_wise(4099, "x", vectors=("weight", "bias")), "rows", ("x",),
                               whole_sum_grads=("weight", "bias")),
    bad_input=BadInput(
        lambda dims, device: {"x": randn((dims["b"], dims["n"]), device), "weight": randn((dims["n"],), device),
                              "bias": randn((dims["n"],), device), "eps": 1e-5},
        tensor_spoilers("x", fixed_rank=False) + tensor_spoilers("weight", fixed_rank=True)
        + tensor_spoilers("bias", fixed_rank=True)
        + (Spoiler("weight", "one element more than x's last dim", lambda a: widen_last(a["weight"])),
           Spoiler("bias", "one element more than x's last dim", lambda a: widen_last(a["bias"])))
        + scalar_spoilers("eps", (-1e-5, math.nan, math.inf, "small"))),
    reference=ref.layer_norm,
    torch_reference=ref.layer_norm_torch,
    cases=layer_norm_cases,
    tolerance=layer_norm_tolerance,
    grad_tolerance=layer_norm_grad_tolerance,
    grad_inputs=("x", "weight", "bias"),
    grad_outputs=("y",),
    output_shapes=lambda case: {"y": case.tensors["x"].shape},
    checks=tuple(c if c.name != "gradients_match_reference" else Check(
        c.name, gradients_in_range_match_reference, cases=c.cases, requires=c.requires)
        for c in generic_checks(grad=True)) + (
        Check("normalised_moments", normalised_moments),
        Check("constant_row_gives_bias", constant_row_gives_bias),
        Check("shift_scale_invariant", shift_scale_invariant, cases=_with_affine, needs_arguments=("eps",)),
    ),
))

register(OpSpec(
    name="dropout_residual_layer_norm",
    signature="dropout_residual_layer_norm(x, residual, weight, bias, p, seed, eps=1e-5) -> (y, keep)",
    meaning="`h = where(keep, x / (1 - p), 0) + residual`, `y = layer_norm(h, weight, bias, eps)`; `keep` is the "
            "bool keep-mask, shape of `x`; `0 <= p < 1`; the same `seed` gives the same `keep`",
    scalars=("p", "seed", "eps"),
    dims={"N": ("x", -1)},
    arguments=("x", "residual", "weight", "bias", "p", "seed", "eps"),
    outputs=("y", "keep"),
    kernel="tritoncheck.kernels.norms:dropout_residual_layer_norm",
    controls=("tritoncheck.controls.norms:torch_dropout_residual_layer_norm",),
    baseline=_dropout_residual_layer_norm_baseline,
    large_problem=LargeProblem(row_wise(4099, "x", "residual", vectors=("weight", "bias")), "rows", ("x", "residual"),
                               params={"p": 0.0, "seed": 0}),
    bad_input=BadInput(
        lambda dims, device: {"x": randn((dims["b"], dims["n"]), device),
                              "residual": randn((dims["b"], dims["n"]), device), "weight": randn((dims["n"],), device),
                              "bias": randn((dims["n"],), device), "p": 0.25, "seed": 7, "eps": 1e-5},
        tensor_spoilers("x", fixed_rank=False) + tensor_spoilers("residual", fixed_rank=False)
        + tensor_spoilers("weight", fixed_rank=True)
        + (Spoiler("residual", "a longer last dim than x", lambda a: widen_last(a["residual"])),
           Spoiler("bias", "one element more than x's last dim", lambda a: widen_last(a["bias"])))
        + scalar_spoilers("p", (-0.1, 1.0, 1.5, math.nan, "half")) + scalar_spoilers("seed", (1.5, "seven", None))
        + scalar_spoilers("eps", (-1e-5, math.nan))),
    reference=dropout_reference,
    torch_reference=dropout_reference_torch,
    cases=dropout_residual_layer_norm_cases,
    tolerance=dropout_tolerance,
    output_dtypes={"keep": torch.bool},
    checks=(Check("matches_reference", dropout_matches_reference),)
    + tuple(c for c in generic_checks(grad=False)
            if c.name not in ("matches_reference", "calls_independent", "unbiased_rounding")) + (
        Check("calls_independent", dropout_calls_independent),
        # the reference needs the returned mask for p > 0; at p = 0 the same stores round y
        # (and the check's own value families: rounding_bias.narrowing_cases)
        Check("unbiased_rounding", generic.unbiased_rounding, cases=_bias_cases,
              false_alarm=rounding_bias.FALSE_ALARM),
        Check("p_zero_is_layer_norm", p_zero_is_layer_norm, cases=lambda op, dtype: _with_p(op, dtype, (0.0,))),
        Check("keep_fraction_binomial", keep_fraction_binomial, false_alarm=FALSE_ALARM),
        Check("seed_reproducible", seed_reproducible,
              cases=lambda op, dtype: _with_p(op, dtype, (0.5, 0.1, 0.9)), false_alarm=3 * COINCIDENCE),
    ),
))
