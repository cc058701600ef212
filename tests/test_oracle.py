"""The oracle's guards: allowances must be finite and >= 0, a NaN result never passes,
and elements whose allowance would accept 0 are counted (and fail a test where they
dominate). Also the two rules that used to be vacuous (softmax at large logits, the
bf16 sums over rows of layer_norm's dweight/dbias)."""
import contextlib

import numpy as np
import pytest
import torch

from tritoncheck import harness, registry, report, tolerance
from tritoncheck.oracle import InvalidAllowance, allowance_mostly_vacuous, assert_close, compare, recording
from tritoncheck.properties import norms_tolerance, softmax_tolerance
from tritoncheck.references import softmax as softmax_ref
from tritoncheck.tolerance import Precision

BACKENDS = ("interpret", "cuda")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1e-3])
def test_an_allowance_that_is_not_a_finite_number_at_least_zero_is_a_suite_bug(bad):
    with pytest.raises(InvalidAllowance) as info:
        compare("y", torch.tensor([1.0, 2.0]), np.array([1.0, 2.0]), np.array([0.1, bad]), rule="rules.some_rule")
    text = str(info.value)
    assert "'y'" in text and "rules.some_rule" in text and "index [1]" in text


def test_an_infinite_allowance_does_not_let_an_infinite_output_pass():
    # inf / inf is NaN, and NaN > 1 is false: this passed before the guard
    with pytest.raises(InvalidAllowance):
        compare("y", torch.tensor([float("inf")]), np.array([1.0]), np.array([np.inf]))


def test_an_allowance_where_the_reference_is_not_finite_is_not_checked():
    c = compare("y", torch.tensor([float("nan"), 1.0]), np.array([np.nan, 1.0]), np.array([np.nan, 0.0]))
    assert c.ok


@pytest.mark.parametrize("got", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_output_against_a_finite_reference_fails(got):
    c = compare("y", torch.tensor([got, 1.0]), np.array([1.0, 1.0]), np.array([1e30, 0.0]))
    assert not c.ok and c.violations == 1


def test_vacuous_elements_are_counted_as_defined():
    e = np.array([1.0, 0.5, 0.0, 1e-40, 1e-9, 0.25, -0.5])
    allowed = np.array([1.0, 0.1, 1.0, 1.0, 1.0, 0.3, 0.6])
    c = compare("y", torch.zeros(7), e, allowed, dtype=torch.float32)
    # 0.0 is exact (noise 0: not above it) and not counted; 1e-40 (below the fp32
    # underflow floors) and 1e-9 (below u(fp32) * max|expected| = 6e-8) accept 0 but no
    # rule could pin them down: not checkable, reported apart; of the other four, 1.0
    # (allowed 1.0), 0.25 (0.3) and -0.5 (0.6) would accept 0, 0.5 (0.1) would not.
    assert (c.counted, c.vacuous, c.uncheckable) == (4, 3, 2) and c.mostly_vacuous
    c = compare("y", torch.tensor(e), e, np.full(7, 1e-3), dtype=torch.float32)
    assert (c.counted, c.vacuous, c.uncheckable, c.mostly_vacuous) == (4, 0, 2, False)


def test_an_expected_value_that_is_zero_within_the_references_error_is_not_counted():
    # a constant upstream gradient: the exact softmax gradient is 0, the fp64 reference
    # leaves ~1e-17 noise, and an allowance of u(fp32)-size would "accept 0" there
    e = np.array([3e-17, -2e-17, 1e-17])
    c = compare("dx", torch.zeros(3), e, np.full(3, 1e-7), dtype=torch.float32, noise=np.full(3, 1e-16))
    assert c.ok and (c.counted, c.vacuous) == (0, 0)


def test_the_allowance_does_not_decide_what_is_counted():
    # REFERENCE_RESOLUTION left out every element whose allowance exceeded 2^20 times its
    # value: the most vacuous elements were never counted. Now an element above the
    # reference's noise counts however loose its allowance, and is vacuous.
    e = np.array([0.5, 0.7, 1.0])
    c = compare("dx", torch.zeros(3), e, np.array([1e30, 1e30, 1e-9]), dtype=torch.bfloat16, noise=1e-19)
    assert (c.counted, c.vacuous, c.uncheckable) == (3, 2, 0) and c.mostly_vacuous
    assert allowance_mostly_vacuous(e, np.array([1e30, 1e30, 1e-9]), torch.bfloat16, noise=1e-19)
    assert not allowance_mostly_vacuous(e, np.array([1e30, 1e30, 1e-9]), torch.bfloat16, noise=np.array([1.0, 1.0, 0.0]))


def test_elements_a_rule_declares_unconstrained_are_reported_not_judged():
    # the context-parallel merge where the blocks' weights are lost: its cap reaches |o|
    e = np.array([1.0, 2.0, 3.0])
    c = compare("o", torch.zeros(3), e, np.array([1.0, 2.0, 1e-6]), dtype=torch.float32,
                unconstrained=np.array([True, True, False]))
    assert (c.counted, c.vacuous, c.uncheckable) == (1, 0, 2) and not c.mostly_vacuous


def test_the_reference_noise_is_the_rule_at_fp64():
    # softmax's gradient with a constant upstream gradient is 0 exactly; the fp64
    # reference leaves noise the rule at u(fp64) bounds, while the bfloat16 allowance is
    # 2^45 times larger: that noise is not counted, a real gradient is
    x = np.random.default_rng(0).standard_normal((4, 64))
    y = softmax_ref.softmax(x, 1.0)
    for dy, counted in ((np.full_like(x, 0.3), 0), (np.random.default_rng(1).standard_normal(x.shape), x.size // 2)):
        dx = torch.func.vjp(lambda t: torch.softmax(t, -1), torch.from_numpy(x))[1](torch.from_numpy(dy))[0].numpy()
        p = Precision.of(torch.bfloat16, "interpret")
        allowed = softmax_tolerance.softmax_grad(x, y, dy, dx, 1.0, p)
        noise = softmax_tolerance.softmax_grad(x, y, dy, dx, 1.0, tolerance.reference_precision(p))
        assert np.all(noise < allowed * 2.0**-30)
        c = compare("dx", torch.from_numpy(dx), dx, allowed, dtype=torch.bfloat16, noise=noise)
        assert (c.counted == 0) if counted == 0 else (c.counted > counted), (c.counted, counted)


def test_integer_outputs_count_nothing():
    c = compare("keep", torch.tensor([True, False]), np.array([1.0, 0.0]), 0.0, dtype=torch.bool)
    assert c.ok and (c.counted, c.vacuous) == (0, 0)


def _target(check_name: str = "matches_reference") -> harness.Target:
    op = registry.load()["softmax"]
    impl = registry.implementations("softmax")[0]
    return harness.Target(op, impl, torch.float32, next(c for c in op.checks if c.name == check_name))


def test_a_test_whose_examples_are_mostly_vacuous_fails_naming_output_and_rule(monkeypatch):
    collector = report.Collector()
    monkeypatch.setattr(harness, "_collector", collector)
    target = _target()
    case = None

    class _Case:
        def to_json(self):
            return {}

    case = _Case()
    sink = collector.sink(target, case)
    vacuous = compare("y", torch.zeros(1), np.array([1.0]), np.array([1.0]))
    fine = compare("y", torch.ones(1), np.array([1.0]), np.array([1e-6]))
    sink(vacuous)
    for _ in range(3):
        sink(fine)
    assert harness.vacuity_failure(target) is None  # 1 of 4: under half
    sink(vacuous)
    sink(fine)
    assert harness.vacuity_failure(target) is None  # 2 of 6: a third
    sink(vacuous)
    problem = harness.vacuity_failure(target)  # 3 of 7: under half
    assert problem is None
    sink(vacuous)
    problem = harness.vacuity_failure(target)  # 4 of 8: half the examples checked nothing
    assert problem and "output 'y'" in problem and "4 of 8 examples" in problem and "at least 50%" in problem
    assert "tritoncheck.properties.softmax.softmax_tolerance" in problem


def test_half_the_examples_vacuous_fails_a_property_test_naming_its_check(monkeypatch):
    # a property check's comparisons with a reference count too (not report rows)
    collector = report.Collector()
    monkeypatch.setattr(harness, "_collector", collector)
    target = _target("rows_sum_to_one")

    class _Case:
        def to_json(self):
            return {}

    with recording(collector.sink(target, _Case(), rows=False)):
        for allowed in (2.0, 1e-6, 2.0, 1e-6):
            with contextlib.suppress(AssertionError):
                assert_close("row sums of y", torch.ones(3), np.ones(3), allowed, record=False, vacuity=True)
        assert_close("y", torch.ones(3), np.full(3, 2.0), 1.5, record=False)  # a self-comparison: not counted
    assert collector.rows == []
    problem = harness.vacuity_failure(target)
    assert problem and "'row sums of y': 2 of 4 examples" in problem and "rows_sum_to_one" in problem
    assert "'y'" not in problem


# ----------------------------------------------------------------- softmax, large logits

@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_zero_output_fails_for_logits_near_the_fp32_max(backend):
    x = np.array([[3e38, -3e38, 1e38]])
    y = softmax_ref.softmax(x, 1.0)
    allowed = softmax_tolerance.softmax(x, y, 1.0, Precision.of(torch.float32, backend))
    assert allowed[0, 0] < 1e-5  # was 1.00000006
    assert not compare("y", torch.zeros(1, 3), y, allowed).ok
    assert compare("y", torch.tensor([[1.0, 0.0, 0.0]]), y, allowed).ok


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.1])
def test_softmax_top_entry_allowance_is_small_for_huge_logits_at_any_temperature(dtype, temperature):
    cap = float(torch.finfo(dtype).max) * min(temperature, 1.0) / 2
    x = torch.tensor([[cap, -cap, cap / 3, 0.0]], dtype=dtype).double().numpy()
    y = softmax_ref.softmax(x, temperature)
    for backend in BACKENDS:
        p = Precision.of(dtype, backend)
        allowed = softmax_tolerance.softmax(x, y, temperature, p)
        assert allowed[0, 0] < 1e-5 + p.store  # the store's rounding and little else
        assert np.all(np.isfinite(allowed)) and np.all(allowed >= 0)


def test_softmax_fp64_torch_reference_keeps_ties_near_the_fp32_max():
    # exp(z - logsumexp(z)) rounded z - lse by 1e22 here and gave [1, 1]
    x = torch.tensor([[1.6881195546468432e38, 1.6881195546468432e38, -1.0]], dtype=torch.float64)
    assert torch.allclose(softmax_ref.softmax_torch(x), torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64))


def test_softmax_rounding_of_x_over_t_still_covers_a_near_tie():
    # bf16 x / 0.1 rounds 98.75 and 100 by up to 0.25: the second entry's weight is
    # then uncertain by e^0.5, and the rule must follow it (torch.softmax(x / t) in bf16)
    x = torch.tensor([[10.0, 9.875, -3.0]], dtype=torch.bfloat16).double().numpy()
    y = softmax_ref.softmax(x, 0.1)
    got = torch.softmax(torch.from_numpy(x).to(torch.bfloat16) / 0.1, dim=-1)
    allowed = softmax_tolerance.softmax(x, y, 0.1, Precision.of(torch.bfloat16, "interpret"))
    assert compare("y", got, y, allowed).ok


# ----------------------------------------------------- layer_norm, bf16 sums over rows

def _layer_norm_grads(rows: int, n: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, n, generator=gen).to(dtype).double().requires_grad_(True)
    w = torch.randn(n, generator=gen).to(dtype).double().requires_grad_(True)
    b = torch.randn(n, generator=gen).to(dtype).double().requires_grad_(True)
    dy = torch.rand(rows, n, generator=gen).to(dtype).double()
    y = torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    return [t.detach().numpy() for t in (x, w, dy, dx, dw, db)]


@pytest.mark.parametrize("rows", [600, 4096])
@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_bf16_parameter_gradients_of_a_large_batch_cannot_be_zero(rows, backend):
    x, w, dy, dx, dw, db = _layer_norm_grads(rows, 8, torch.bfloat16)
    allowed = norms_tolerance.layer_norm_grad(x, w, dy, dx, dw, db, 1e-5, Precision.of(torch.bfloat16, backend))
    for name, exact in (("dweight", dw), ("dbias", db)):
        c = compare(name, torch.zeros(exact.shape), exact, allowed[name], dtype=torch.bfloat16)
        assert not c.ok and c.vacuous == 0, (name, c)


def test_layer_norm_admits_input_dtype_row_sums_only_while_they_stay_checkable():
    p = Precision.of(torch.bfloat16, "cuda")
    small = _layer_norm_grads(64, 8, torch.bfloat16)
    large = _layer_norm_grads(65, 8, torch.bfloat16)
    a_small = norms_tolerance.layer_norm_grad(*small, 1e-5, p)["dbias"]
    a_large = norms_tolerance.layer_norm_grad(*large, 1e-5, p)["dbias"]
    sum_small = np.abs(small[2]).sum(axis=0)
    sum_large = np.abs(large[2]).sum(axis=0)
    # at 64 rows a bf16 running sum is admitted: SAFETY * 64 u(bf16) = 1/2 of sum|dy|
    assert np.all(a_small >= 0.5 * sum_small) and np.all(a_small < sum_small)
    # at 65 rows only fp32 accumulation is: a small fraction of sum|dy|
    assert np.all(a_large < 0.05 * sum_large)


@pytest.mark.parametrize("n", [15, 1000])
def test_layer_norm_dx_admits_an_fp32_mean_one_ulp_off_on_a_constant_row(n):
    """A constant bfloat16 row is layer norm's singular point: an fp32 mean one ulp off (a
    division by n that is not correctly rounded, as in Liger-Kernel's and PyTorch's CUDA
    layer norm, measured on an H100) makes every x_hat -0.019 and dx = -rstd x_hat^2 g =
    -0.44 where the exact dx is 0. Correct fp32 arithmetic: the rule must admit it."""
    c, w0, dy0, eps, f = 1000.0, 1.5, 2.5, 1e-5, np.float32
    x, w, dy = np.full((2, n), c), np.full(n, w0), np.full((2, n), dy0)
    mean = f(c) + np.spacing(f(c))
    centred = x.astype(f) - mean
    rstd = f(1) / np.sqrt(np.mean(centred * centred, axis=-1, keepdims=True, dtype=f) + f(eps))
    xhat, g = centred * rstd, (w * dy).astype(f)
    c1 = np.mean(xhat * g, axis=-1, keepdims=True, dtype=f)
    c2 = np.mean(g, axis=-1, keepdims=True, dtype=f)
    got = torch.from_numpy((g - (xhat * c1 + c2)) * rstd).to(torch.bfloat16)
    assert abs(float(got[0, 0]) + 0.44) < 0.01
    allowed = norms_tolerance.layer_norm_grad(x, w, dy, np.zeros_like(x), np.zeros(n), np.full(n, 2 * dy0), eps,
                                              Precision.of(torch.bfloat16, "cuda"))
    assert compare("dx", got, np.zeros_like(x), allowed["dx"], dtype=torch.bfloat16).ok
