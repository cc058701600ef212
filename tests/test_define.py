"""An op defined by its signature and fp64 reference (tritoncheck.op, docs/your-op.md): the
definition's validation, the drawn cases, the derived rule against PyTorch's own results
and planted bugs, and a user's op end to end from its own directory."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import tritoncheck as tc
from tritoncheck import registry
from tritoncheck.define import discovery, rounding
from tritoncheck.strategies import Case, TensorSpec
from tritoncheck.tolerance import Precision, reference_precision

ROOT = Path(__file__).resolve().parents[1]


def _reference(a, b):
    return a @ b


@pytest.mark.parametrize("make, error, words", [
    (lambda: tc.Tensor("M", "..."), ValueError, "'...' may appear once, first"),
    (lambda: tc.Tensor("M", "K%2"), ValueError, "shape entries are dim names"),
    (lambda: tc.Tensor("M", dtype="float16"), TypeError, "dtype must be None"),
    (lambda: tc.Dim(max=0), ValueError, "max must be an int >= min"),
    (lambda: tc.Dim(multiple_of=0), ValueError, "multiple_of must be an int >= 1"),
    (lambda: tc.Scalar(), ValueError, "give choices=(...) or both low and high"),
    (lambda: tc.reals(1.0, 0.0), ValueError, "need low < high"),
    (lambda: tc.integers(0, 1.5), ValueError, "an int or a dim name"),
    (lambda: tc.op(inputs={"b": tc.Tensor("K", "N"), "a": tc.Tensor("M", "K")})(_reference), ValueError,
     "must start with the inputs, in their order"),
    (lambda: tc.op(inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")}, grads=("c",))(_reference),
     ValueError, "grads names 'c'"),
    (lambda: tc.op(inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")}, large=("K",),
                   independent=("K",))(_reference), ValueError, "must be the first axis"),
    (lambda: tc.op(inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")}, large=("M",))(_reference),
     ValueError, "must also be independent"),
    (lambda: tc.op(inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")}, dims={"Q": tc.Dim()})(_reference),
     ValueError, "appear in no tensor's shape"),
    (lambda: tc.op(inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")}, numpy=True)(_reference),
     ValueError, "a NumPy reference can have neither"),
])
def test_a_bad_definition_is_an_error_that_names_the_fix(make, error, words, scratch_ops):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value), str(info.value)


def test_a_second_op_of_the_same_name_is_an_error(scratch_ops):
    tc.op("twice", inputs={"x": tc.Tensor("N")})(lambda x: x * 2)
    with pytest.raises(ValueError, match="defined twice"):
        tc.op("twice", inputs={"x": tc.Tensor("N")})(lambda x: x * 3)


def test_cases_follow_the_signature(scratch_ops):
    """Shared dims agree, derived dims follow, domains hold, batch dims are shared."""
    gather = tc.op(
        "gather_scaled",
        inputs={"x": tc.Tensor("...", "V", "D"), "index": tc.Tensor("...", "T", dtype=torch.int64,
                                                                     values=tc.integers(0, "V")),
                "scale": tc.Tensor("D//2", values=tc.positive()), "p": tc.Tensor("...", "V", values=tc.probabilities()),
                "gate": tc.Tensor("T", values=tc.unit_interval())},
        outputs=("y",), dims={"D": tc.Dim(multiple_of=2, max=64)},
    )(lambda x, index, scale, p, gate: x[..., :1, :] * 0 + scale.repeat(2))
    spec = registry.OPS["gather_scaled"]

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=spec.cases(torch.float16))
    def check(case: Case):
        t = case.tensors
        batch = t["x"].shape[:-2]
        v, d = t["x"].shape[-2:]
        assert t["index"].shape[:-1] == batch and t["p"].shape == batch + (v,)
        assert d % 2 == 0 and t["scale"].shape == (d // 2,) and t["gate"].shape == t["index"].shape[-1:]
        values = case.materialise("cpu")
        index = values["index"]
        assert index.dtype == torch.int64 and (index.numel() == 0 or (0 <= int(index.min()) and int(index.max()) < v))
        assert bool((values["scale"] > 0).all())
        gate = values["gate"]
        assert bool(((gate >= 0) & (gate <= 1)).all())
        assert torch.allclose(values["p"].double().sum(-1), torch.ones(batch, dtype=torch.float64), atol=0.05)
    check()
    assert gather.name == "gather_scaled"


def _addmm(a, b, bias):
    """a @ b (+ bias)."""
    return a @ b if bias is None else a @ b + bias


def _addmm_fp32(a, b, bias=None):  # correct: fp32 accumulation, one rounding to the input dtype
    out = a.float() @ b.float()
    return (out if bias is None else out + bias.float()).to(a.dtype)


def _addmm_bias_ignored(a, b, bias=None):
    return (a.float() @ b.float()).to(a.dtype)


def test_an_optional_tensor_is_drawn_absent_and_present_and_checked_both_ways(scratch_ops):
    tc.op("optional_bias", inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N"),
                                   "bias": tc.Tensor("N", optional=True)},
          grads=("a", "b", "bias"), independent=("M",))(_addmm)
    spec = registry.OPS["optional_bias"]
    assert "bias [N] or None" in spec.meaning
    checks = {c.name: c for c in spec.checks}
    good = registry.Implementation.of("optional_bias", _addmm_fp32)
    bad = registry.Implementation.of("optional_bias", _addmm_bias_ignored)
    seen, caught = set(), []

    @settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=spec.cases(torch.float16))
    def check(case: Case):
        present = "bias" in case.tensors
        assert present != ("bias" in case.params), "an absent tensor is a None parameter, a present one a tensor"
        seen.add(present)
        for name in ("matches_reference", "rows_independent", "inputs_unchanged"):
            checks[name].run(case, good)
        if present and case.tensors["bias"].family not in ("zeros", "tiny"):
            try:
                checks["matches_reference"].run(case, bad)
            except AssertionError:
                caught.append(case)
    check()
    assert seen == {True, False}
    assert caught, "a kernel that ignores the bias passed every case with a bias"
    with_gradients = set()

    @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=checks["gradients_match_reference"].cases(spec, torch.float32))
    def gradients(case: Case):  # dbias where the bias is passed; a, b alone where it is None
        with_gradients.add("bias" in case.tensors)
        checks["gradients_match_reference"].run(case, good)
        checks["backward_repeatable"].run(case, good)
    gradients()
    assert with_gradients == {True, False}


def _mm_nk(a, b):  # takes b as [N, K], as a kernel with K-major weights does
    return (a.float() @ b.float().T).to(a.dtype)


def test_a_declared_layout_passes_a_tensor_in_the_kernels_order(scratch_ops):
    tc.op("mm_layouts", inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")},
          layouts={"nk": {"b": (1, 0)}})(lambda a, b: a @ b)
    spec = registry.OPS["mm_layouts"]
    check = {c.name: c for c in spec.checks}["matches_reference"]
    case = Case("mm_layouts", "float32", ("a", "b"),
                {"a": TensorSpec((5, 7), "float32", seed=1), "b": TensorSpec((7, 3), "float32", seed=2)}, {})
    _mm_nk.layout = "nk"
    try:
        check.run(case, registry.Implementation.of("mm_layouts", _mm_nk))  # b arrives as [3, 7]
        del _mm_nk.layout
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):  # b as [7, 3], read as [N, K]
            check.run(case, registry.Implementation.of("mm_layouts", _mm_nk))
    finally:
        if hasattr(_mm_nk, "layout"):
            del _mm_nk.layout
    with pytest.raises(ValueError, match="permutes"):
        tc.op("mm_bad_layout", inputs={"a": tc.Tensor("M", "K")}, layouts={"nk": {"w": (1, 0)}})(lambda a: a)


def _routed(x, ids):
    """x's rows whose id is 1, zeros elsewhere: a data-dependent selection (no meta form)."""
    out = torch.zeros_like(x)
    rows = (ids == 1).nonzero(as_tuple=True)[0]
    out[rows] = x[rows]
    return out


def test_a_reference_with_a_data_dependent_step_still_gives_its_output_shapes(scratch_ops):
    # nonzero has no meta form: the shapes come from the reference on zeros, and rows_independent runs
    routed = tc.op("routed_rows", inputs={"x": tc.Tensor("M", "N"),
                                          "ids": tc.Tensor("M", dtype=torch.int64, values=tc.integers(0, 2))},
                   independent=("M",))(_routed)
    spec = registry.OPS["routed_rows"]
    check = {c.name: c for c in spec.checks}["rows_independent"]
    good = registry.Implementation.of("routed_rows", lambda x, ids: torch.where((ids == 1)[:, None], x, 0.0))

    @settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=spec.cases(torch.float32))
    def run(case: Case):
        assert routed.output_shapes(case) == {"out": tuple(case.tensors["x"].shape)}
        check.run(case, good)
    run()


def _moe(x, w1, w2, topk_ids, topk_weights):
    """A mixture-of-experts layer with SwiGLU experts, routed by index lists (no meta form)."""
    y = x.new_zeros(x.shape[0], w2.shape[1])
    for e in range(w1.shape[0]):
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        g, u = (x[rows] @ w1[e].T).chunk(2, dim=-1)
        o = (torch.nn.functional.silu(g) * u) @ w2[e].T
        y = y.index_add(0, rows, o * topk_weights[rows, slots, None].to(o.dtype))
    return y


def _moe_eager(x, w1, w2, topk_ids, topk_weights):  # correct, as users write it: h and o in x's dtype
    y = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w1.shape[0]):
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        g, u = (x[rows] @ w1[e].T).chunk(2, dim=-1)
        o = (torch.nn.functional.silu(g) * u) @ w2[e].T
        y.index_add_(0, rows, o.float() * topk_weights[rows, slots, None])
    return y.to(x.dtype)


def _hunt(spec, check, impl, dtype=torch.float16, examples=6):
    """``check`` on ``examples`` derandomized draws of its cases (the op's, unless its own)."""
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=check.cases(spec, dtype) if check.cases else spec.cases(dtype))
    def run(case: Case):
        check.run(case, impl)
    run()


def test_a_users_moe_layer_through_the_door_passes_its_eager_control(scratch_ops):
    """What the door met on an MoE-shaped op: output shapes of a data-dependent reference (rows_independent
    raised), eager float16 intermediates past 65504 (matches_reference failed a correct control), an fp32
    share of 0 and a division by zero in unbiased_rounding."""
    tc.op("user_moe", inputs={"x": tc.Tensor("T", "H"), "w1": tc.Tensor("E", "2*I", "H"),
                              "w2": tc.Tensor("E", "H", "I"),
                              "topk_ids": tc.Tensor("T", "k", dtype=torch.int64, values=tc.integers(0, "E")),
                              "topk_weights": tc.Tensor("T", "k", dtype=torch.float32, values=tc.unit_interval())},
          dims={"k": tc.Dim(max=4), "E": tc.Dim(max=8)}, independent=("T",))(_moe)
    spec = registry.OPS["user_moe"]
    checks = {c.name: c for c in spec.checks}
    control = registry.Implementation.of("user_moe", _moe_eager)
    for name in ("matches_reference", "rows_independent", "unbiased_rounding"):
        _hunt(spec, checks[name], control)


def _scan(x, a, h0):
    """A diagonal linear recurrence: h_t = a_t h_{t-1} + x_t; (every h_t, the last)."""
    h = x.new_zeros(x.shape[0], x.shape[2]) if h0 is None else h0
    ys = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + x[:, t]
        ys.append(h)
    return torch.stack(ys, 1), h


def _scan_fp32(x, a, h0=None):
    h = torch.zeros(x.shape[0], x.shape[2], dtype=torch.float32) if h0 is None else h0.float()
    ys = []
    for t in range(x.shape[1]):
        h = a[:, t].float() * h + x[:, t].float()
        ys.append(h)
    return torch.stack(ys, 1).to(x.dtype), h.to(x.dtype)


def test_a_users_scan_with_an_optional_initial_state_through_the_door(scratch_ops):
    """Two outputs, a sequential reference, an optional initial state with its gradient: every
    generic check passes a correct implementation (float16, 6 derandomized draws each)."""
    tc.op("user_scan", inputs={"x": tc.Tensor("B", "T", "D"), "a": tc.Tensor("B", "T", "D", values=tc.unit_interval()),
                               "h0": tc.Tensor("B", "D", optional=True)},
          outputs=("y", "h"), grads=("x", "a", "h0"), independent=("B",))(_scan)
    spec = registry.OPS["user_scan"]
    impl = registry.Implementation.of("user_scan", _scan_fp32)
    ran = []
    for check in spec.checks:
        if check.requires and check.requires(impl):
            continue
        _hunt(spec, check, impl)
        ran.append(check.name)
    assert {"matches_reference", "gradients_match_reference", "backward_repeatable", "rows_independent",
            "unbiased_rounding", "layout_invariant"} <= set(ran)


def test_an_op_needs_a_tensor_that_is_always_passed(scratch_ops):
    with pytest.raises(ValueError, match="at least one Tensor input that is not optional"):
        tc.op("all_optional", inputs={"x": tc.Tensor("N", optional=True)})(lambda x: x)


def test_every_long_dim_reaches_the_tile_boundaries(scratch_ops):
    """The lead dim's length classes: 2^k - 1, 2^k, 2^k + 1, past 4096, past 65536."""
    from tritoncheck.strategies import length_classes_reached
    tc.op("scaled_rows", inputs={"x": tc.Tensor("M", "N")})(lambda x: 2 * x)
    reached = length_classes_reached(registry.OPS["scaled_rows"].cases(torch.float32))
    assert {"2^k - 1", "2^k", "2^k + 1", "past 4096", "past 65536"} <= set(reached), reached


# ------------------------------------------------------------ the derived rule

def _allowed(definition, args: dict, dtype: torch.dtype, precision: Precision | None = None):
    """The derived rule's allowance for ``args`` (tensors already in their dtypes)."""
    spec = definition.spec()
    case = Case(definition.name, str(dtype).replace("torch.", ""), tuple(args),
                {k: _spec_of(v) for k, v in args.items() if isinstance(v, torch.Tensor)},
                {k: v for k, v in args.items() if not isinstance(v, torch.Tensor)})
    expected, inputs64 = spec.expected(case, args)
    p = precision or Precision.of(dtype, "interpret")
    return expected, spec.tolerance(case, inputs64, expected, p), spec, case, inputs64


def _spec_of(t: torch.Tensor):
    from tritoncheck.strategies import TensorSpec
    return TensorSpec(tuple(t.shape), str(t.dtype).replace("torch.", ""))


REFERENCES = {
    "softmax": (lambda x: torch.softmax(x, -1), {"x": (16, 300)}, 1.0),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), {"x": (16, 300)}, 3.0),
    "gelu": (lambda x: torch.nn.functional.gelu(x), {"x": (16, 300)}, 4.0),
    "gelu_tanh": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), {"x": (16, 300)}, 4.0),
    "silu_mul": (lambda g, u: torch.nn.functional.silu(g) * u, {"g": (16, 300), "u": (16, 300)}, 3.0),
    "layer_norm": (lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]), {"x": (16, 300)}, 1.0),
    "rms_norm": (lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), {"x": (16, 300)}, 1.0),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), {"x": (16, 300)}, 3.0),
    "matmul": (lambda a, b: a @ b, {"a": (16, 700), "b": (700, 24)}, 1.0),
    "bias_gelu": (lambda x, w, b: torch.nn.functional.gelu(x @ w + b), {"x": (8, 200), "w": (200, 32), "b": (32,)},
                  1.0),
    "cumsum": (lambda x: torch.cumsum(x, -1), {"x": (8, 500)}, 1.0),
    "tanh_scaled": (lambda x: 30 * torch.tanh(x / 30), {"x": (16, 300)}, 30.0),
}


def _audit_params():
    for name in sorted(REFERENCES):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            marks = []
            if name == "log_softmax" and dtype != torch.float32:
                # PyTorch's CPU half log_softmax loses the log of the sum's small terms (0.0 where
                # the fp64 value is -3.7e-4, seed 2): its sum of exps is not held in fp32. The rule
                # models fp32 inside a composite op, as CUDA's kernels do; the CPU's is the finding.
                marks.append(pytest.mark.xfail(reason="PyTorch's CPU half log_softmax: not fp32 inside",
                                               strict=False))
            yield pytest.param(name, dtype, id=f"{name}-{str(dtype).replace('torch.', '')}", marks=marks)


@pytest.mark.parametrize("name, dtype", list(_audit_params()))
def test_pytorch_own_result_is_within_the_derived_rule(name, dtype, scratch_ops):
    """The audit of the default rule: the reference itself run by PyTorch in the input dtype
    (what a user gets without a kernel) is never outside the allowance derived from it,
    forward and backward, on inputs of several scales. (A kernel that matches PyTorch must
    never fail it.)"""
    fn, shapes, scale = REFERENCES[name]
    definition = tc.op(f"audit_{name}", inputs={k: tc.Tensor(*[f"{k}{i}" for i in range(len(s))])
                                                for k, s in shapes.items()},
                       grads=tuple(shapes) if name != "cumsum" else ())(fn)
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        args = {k: (torch.randn(s, generator=gen, dtype=torch.float64) * scale * (10.0 ** (seed - 1))).to(dtype)
                for k, s in shapes.items()}
        expected, allowed, spec, case, inputs64 = _allowed(definition, args, dtype)
        got = fn(*args.values())
        err = (got.double() - torch.as_tensor(expected["out"])).abs()
        a = torch.as_tensor(np.ma.filled(allowed["out"], np.inf))
        assert bool((err <= a).all()), f"{name} {dtype} seed {seed}: {float((err / a).max()):.3g} x the allowance"
        if not definition.grads:
            continue
        leaves = {k: v.clone().requires_grad_(True) for k, v in args.items()}
        out = fn(*leaves.values())
        dy = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(dtype)
        grads = torch.autograd.grad(out, list(leaves.values()), dy)
        np_in = {**inputs64, "dout": dy.double().numpy()}
        case = case.replace(tensors={"dout": _spec_of(dy)})
        args64 = {k: torch.from_numpy(v).requires_grad_(True) for k, v in inputs64.items()}
        ref_out = spec.torch_reference(*args64.values())[0]
        ref_grads = torch.autograd.grad(ref_out, list(args64.values()), dy.double())
        np_grads = {k: g.numpy() for k, g in zip(args64, ref_grads)}
        g_allowed = spec.grad_tolerance(case, np_in, {"out": ref_out.detach().numpy()}, np_grads,
                                        Precision.of(dtype, "interpret"))
        for k, g in zip(args64, grads):
            e = (g.double() - torch.from_numpy(np_grads[k])).abs()
            ga = torch.as_tensor(np.ma.filled(g_allowed[f"d{k}"], np.inf))
            assert bool((e <= ga).all()), f"{name} d{k} {dtype} seed {seed}: {float((e / ga).max()):.3g} x"


def test_the_derived_rule_catches_planted_bugs(scratch_ops):
    """Each of these is a few ulps or less at the output's scale, and each fails the rule."""
    mm = tc.op("audit_mm", inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")})(lambda a, b: a @ b)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 512, generator=gen).half()
    b = torch.randn(512, 8, generator=gen).half()
    expected, allowed, *_ = _allowed(mm, {"a": a, "b": b}, torch.float16)
    fp16_sum = torch.zeros(8, 8, dtype=torch.float16)
    for k in range(512):  # accumulation in float16
        fp16_sum = fp16_sum + (a[:, k:k + 1].float() * b[k:k + 1, :].float()).half()
    tail_dropped = (a[:, :500].float() @ b[:500].float()).half()  # K tail past the last full block of 20
    for bug in (fp16_sum, tail_dropped):
        assert bool(((bug.double() - torch.as_tensor(expected["out"])).abs() > torch.as_tensor(allowed["out"])).any())
    gelu = tc.op("audit_gelu", inputs={"x": tc.Tensor("N")})(lambda x: torch.nn.functional.gelu(x))
    x = torch.linspace(-4, 4, 4001, dtype=torch.float32)
    expected, allowed, *_ = _allowed(gelu, {"x": x}, torch.float32)
    tanh_form = torch.nn.functional.gelu(x, approximate="tanh").double()
    assert bool(((tanh_form - torch.as_tensor(expected["out"])).abs() > torch.as_tensor(allowed["out"])).any())


def test_exact_outputs_are_compared_bit_for_bit(scratch_ops):
    quant = tc.op("audit_quant", inputs={"x": tc.Tensor("M", "K", values=tc.finite(max_magnitude=1e3))},
                  outputs={"q": tc.Output(dtype=torch.float8_e4m3fn), "scale": tc.Output(dtype=torch.float32)})(
        lambda x: ((x.float() / (x.abs().amax(-1, keepdim=True).float() / 448.0)), x.abs().amax(-1).float() / 448.0))
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(1)).half()
    expected, allowed, spec, *_ = _allowed(quant, {"x": x}, torch.float16)
    assert not np.any(allowed["q"]), "a quantised output's allowance is zero"
    q = expected["q"]
    assert np.array_equal(q, torch.as_tensor(q).to(torch.float8_e4m3fn).double().numpy()), \
        "the expected 1-byte output is the reference rounded to its dtype"
    assert quant.exact == {"q"}


def test_an_element_no_rule_pins_down_is_not_judged(scratch_ops):
    """x / (y - z) with y - z within the error of its operands: unconstrained, masked."""
    ratio = tc.op("audit_ratio", inputs={"x": tc.Tensor("N"), "y": tc.Tensor("N"), "z": tc.Tensor("N")})(
        lambda x, y, z: x / ((y * 3) - (z * 3)))
    y = torch.tensor([1.0, 2.0], dtype=torch.float16)
    z = torch.tensor([1.0 + 2**-10, 1.0], dtype=torch.float16)
    _, allowed, *_ = _allowed(ratio, {"x": torch.ones(2, dtype=torch.float16), "y": y, "z": z}, torch.float16)
    assert isinstance(allowed["out"], np.ma.MaskedArray) and list(np.ma.getmaskarray(allowed["out"])) == [True, False]


def test_an_intermediate_past_the_input_dtypes_range_leaves_what_depends_on_it_unjudged(scratch_ops):
    """float16 x + bias past 65504: eager PyTorch rounds it to inf (GELU(-inf) = NaN where the
    exact output is -0), a fused kernel holds it in fp32; both are the op as written, so that
    element is not judged, and the others still are."""
    op = tc.op("audit_overflow", inputs={"x": tc.Tensor("N"), "bias": tc.Tensor("N")})(
        lambda x, bias: torch.nn.functional.gelu(x + bias))
    x = torch.tensor([-65000.0, 1.5, -2.0], dtype=torch.float16)
    bias = torch.tensor([-1000.0, 0.25, 0.5], dtype=torch.float16)
    expected, allowed, *_ = _allowed(op, {"x": x, "bias": bias}, torch.float16)
    assert list(np.ma.getmaskarray(allowed["out"])) == [True, False, False]
    eager = torch.nn.functional.gelu(x + bias)
    assert torch.isnan(eager[0]) and bool((torch.as_tensor(np.ma.getdata(allowed["out"]))[1:]
                                           < 1e-2 * torch.as_tensor(expected["out"][1:]).abs()).all())
    assert bool(((eager[1:].double() - torch.as_tensor(expected["out"][1:])).abs()
                 <= torch.as_tensor(np.ma.getdata(allowed["out"])[1:])).all())


def test_the_reference_precision_is_far_below_the_rule(scratch_ops):
    mm = tc.op("audit_noise", inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")})(lambda a, b: a @ b)
    a, b = torch.randn(4, 64).float(), torch.randn(64, 4).float()
    p = Precision.of(torch.float32, "interpret")
    _, allowed, *_ = _allowed(mm, {"a": a, "b": b}, torch.float32, p)
    _, noise, *_ = _allowed(mm, {"a": a, "b": b}, torch.float32, reference_precision(p))
    assert np.all(noise["out"] < 1e-6 * allowed["out"])


def test_units_of_a_reference_written_in_float32_follow_it():
    """``x.float()`` in the reference: its steps round in float32, whatever the input dtype."""
    units = rounding.Units(accumulate=2.0**-24, dot=2.0**-24)
    # positive x: no cancellation in x * 3 + 1 (a random sign put a result near 0 once in a while)
    x = (torch.rand(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.5).half().double()
    out, _ = rounding.evaluate(lambda x: x.float() * 3.0 + 1.0, [x], [torch.float16], units)
    assert float((out.err / out.value.abs()).max()) < 1e-6  # fp32 roundings, not fp16 ones
    out, _ = rounding.evaluate(lambda x: x * 3.0 + 1.0, [x], [torch.float16], units)
    assert float((out.err / out.value.abs()).max()) > 4e-4  # fp16 roundings


def test_a_gpu_that_flushes_tiny_inputs_is_within_the_bound():
    """bfloat16 a holding values below fp32's smallest normal (a GPU may flush them to zero
    on load) against b near 1e30: the product's error is |a| |b|, which the read floor
    allows; a flush-free evaluation's bound would be a few ulps of the output."""
    units = rounding.Units(accumulate=2.0**-24, dot=2.0**-8)
    a = torch.tensor([[2.0**-130, 2.0**-131]], dtype=torch.bfloat16).double()
    b = torch.tensor([[1e30], [1e30]], dtype=torch.bfloat16).double()
    out, evaluation = rounding.evaluate(lambda a, b: a @ b, [a, b], [torch.bfloat16] * 2, units)
    flushed = (a * (a.abs() >= 2.0**-126)) @ b  # what an FTZ load computes
    assert float((flushed - out.value).abs().max()) <= float(out.err.max()) and not evaluation.overflow
    assert float(out.err.max()) < 2 * float(out.value.abs().max())  # and no wider than the flush itself


def test_a_sum_past_fp32_range_marks_the_evaluation():
    """Cancelling terms near fp32's largest value: the result is finite, but an fp32
    accumulator may overflow on the way, so no fp32 implementation is bound to it."""
    units = rounding.Units(accumulate=2.0**-24, dot=2.0**-24)
    x = torch.tensor([3e38, 3e38, -3e38, -3e38], dtype=torch.float64)
    _, evaluation = rounding.evaluate(lambda x: x.sum(), [x], [torch.float32], units)
    assert evaluation.overflow
    a, b = x[None, :], torch.ones(4, 1, dtype=torch.float64)
    _, evaluation = rounding.evaluate(lambda a, b: a @ b, [a, b], [torch.float32] * 2, units)
    assert evaluation.overflow
    _, evaluation = rounding.evaluate(lambda x: x.sum(), [x / 1e10], [torch.float32], units)
    assert not evaluation.overflow


def test_an_operation_on_another_thread_sees_the_evaluation():
    """On CUDA, autograd runs a backward on a device thread of its own (a tracked gradient of
    the bf16 matmul example raised 'used outside tracking()' on an H200): the evaluation's
    units reach every thread of the process."""
    import threading
    units = rounding.Units(accumulate=2.0**-24, dot=2.0**-24)
    found = {}
    with rounding.tracking(units):
        t = rounding.track(torch.full((4,), 1.0 / 3.0, dtype=torch.float64), torch.float32)
        worker = threading.Thread(target=lambda: found.setdefault("y", t * 3.0))
        worker.start()
        worker.join()
    assert float(found["y"].err.max()) > 0


# ------------------------------------------------------------ discovery

def test_pyproject_names_the_op_modules(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.tritoncheck]\nop-modules = ["userops_a", "userops_b"]\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert discovery.pyproject_modules() == ["userops_a", "userops_b"]
    (tmp_path / "pyproject.toml").write_text('[tool.tritoncheck]\nop-modules = "userops_a"\n')
    with pytest.raises(ValueError, match="must be a list of module names"):
        discovery.pyproject_modules()


def test_an_unknown_op_says_how_to_define_one():
    with pytest.raises(ValueError, match="docs/your-op.md"):
        registry.register_implementation("my_matmul", "torch:matmul")


# ------------------------------------------------------------ end to end

USER_OPS = '''
import torch
import tritoncheck as tc

@tc.op(inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")}, grads=("a", "b"), independent=("M",))
def user_matmul(a, b):
    """C = A @ B."""
    return a @ b
'''

USER_KERNELS = '''
import torch

def matmul(a, b):
    return (a.float() @ b.float()).to(a.dtype)

def matmul_k_tail_dropped(a, b):
    # the last K column left out: wrong at every K > 1, so the quick profile's per-run size
    # pool (which may hold only K below one block) cannot miss it with 6 examples
    k = max(a.shape[1] - 1, 1)
    return (a[:, :k].float() @ b[:k].float()).to(a.dtype)
'''


def _tritoncheck(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "tritoncheck", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow  # 29 CPU-s; every commit: .ci/run's scripts/installed_user_op_demo.sh does the same, installed
def test_a_users_op_end_to_end_from_its_own_directory(tmp_path):
    """Defined in the user's package, found through pyproject, the correct kernel passes and
    the K-tail bug fails with a replay command that reproduces it from there."""
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text(textwrap.dedent(USER_OPS))
    (pkg / "kernels.py").write_text(textwrap.dedent(USER_KERNELS))
    (tmp_path / "pyproject.toml").write_text('[tool.tritoncheck]\nop-modules = ["userpkg.ops"]\n')
    common = ["--dtype", "float32", "--profile", "quick", "--max-examples", "6", "-n", "0"]
    good = _tritoncheck(tmp_path, "user_matmul=userpkg.kernels:matmul", *common)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-2000:]
    bad = _tritoncheck(tmp_path, "user_matmul=userpkg.kernels:matmul_k_tail_dropped", *common, "--", "-k",
                       "matches_reference")
    assert bad.returncode == 1, bad.stdout[-3000:]
    import re
    replay = re.search(r"python -m tritoncheck\.replay reports/failures/\S+\.json", bad.stdout).group(0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    again = subprocess.run(replay.split(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "FAILED" in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]

