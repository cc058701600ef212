"""tritoncheck/rounding_bias.py: a biased narrowing store fails, round-to-nearest passes."""
import numpy as np
import pytest
import torch

from tritoncheck import generic, registry, rounding_bias
from tritoncheck.limits import NotApplicable
from tritoncheck.strategies import Case, TensorSpec

OPS = registry.load()
DELTA = rounding_bias.FALSE_ALARM / 2


def test_round_to_nearest_errors_pass_and_truncated_ones_fail():
    rng = np.random.default_rng(0)
    n, bound, fp32 = 2000, np.full(2000, 0.5), np.zeros(2000)
    nearest = rng.uniform(-0.5, 0.5, n)
    assert not rounding_bias.bias(nearest, bound, fp32, DELTA).failed
    truncated = rng.uniform(-1.0, 0.0, n)  # a store that rounds toward zero, in ulps, signed toward zero
    found = rounding_bias.bias(truncated, np.full(n, 1.0), fp32, DELTA)
    assert found.failed and found.mean < -0.45 and found.allowed < 0.3


def test_the_statistic_stays_inside_its_bound_on_symmetric_errors_of_any_magnitudes():
    # self-normalised: heavy-tailed magnitudes (cancellations) with fair signs never fail
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(20, 400))
        magnitude = rng.pareto(1.5, n)
        errors = magnitude * rng.choice((-1.0, 1.0), n)
        assert not rounding_bias.bias(errors, magnitude + 0.5, np.zeros(n), DELTA).failed


def test_fp32_arithmetic_shared_by_every_element_is_charged_worst_case():
    # a row's fp32 mean off by 0.3 ulp of every output: biased, but within the rule's fp32 share
    n = 5000
    shifted = np.random.default_rng(2).uniform(-0.5, 0.5, n) + 0.3
    assert rounding_bias.bias(shifted, np.full(n, 1.0), np.zeros(n), DELTA).failed
    assert not rounding_bias.bias(shifted, np.full(n, 1.0), np.full(n, 0.3), DELTA).failed


def _swiglu_case(dtype="float16"):
    spec = {"gate": TensorSpec((8, 100), dtype, seed=1), "up": TensorSpec((8, 100), dtype, seed=2)}
    return Case("swiglu", dtype, ("gate", "up"), spec)


@pytest.mark.parametrize("target", ["tritoncheck.kernels.elementwise:swiglu",
                                    "tritoncheck.controls.elementwise:torch_swiglu"])
def test_the_kernel_and_the_control_round_without_bias(target):
    fn = registry.resolve(target)
    generic.unbiased_rounding(_swiglu_case(), registry.Implementation.of("swiglu", fn))


def test_a_truncating_store_within_an_ulp_everywhere_fails():
    """The issue 36 finding: an elementwise op whose fp32 result is truncated to float16
    passes every per-element rule; its mean error is half an ulp toward zero."""
    from tritoncheck.generic import matches_reference
    from tritoncheck.mutants.elementwise import swiglu_truncating_store as mutant
    impl = registry.Implementation.of("swiglu", mutant.fn, name=mutant.name, kind="mutant")
    matches_reference(_swiglu_case(), impl)  # every element within its allowance
    with pytest.raises(AssertionError, match=r"output 'y' is biased toward zero: its mean error is -0\.4"):
        generic.unbiased_rounding(_swiglu_case(), impl)


def test_the_check_applies_where_an_output_narrows_and_says_why_not_elsewhere():
    with pytest.raises(NotApplicable, match="no output of swiglu is narrower than fp32 in float32"):
        rounding_bias.narrowing_cases(OPS["swiglu"], torch.float32)
    with pytest.raises(NotApplicable, match="no output of cross_entropy"):  # its loss is float32 in every dtype
        rounding_bias.narrowing_cases(OPS["cross_entropy"], torch.float16)
    assert rounding_bias.narrowing_outputs(OPS["attention"], torch.float16) == ("o",)  # lse is float32
    with pytest.raises(NotApplicable, match="bfloat16 outputs are not judged"):
        rounding_bias.narrowing_cases(OPS["swiglu"], torch.bfloat16)


def test_values_that_share_their_roundings_are_drawn_spread():
    case = Case("add_rms_norm", "float16", ("x", "residual", "weight", "eps"),
                {"x": TensorSpec((16,), "float16", family="tiny", injections=((1, 0.0),)),
                 "residual": TensorSpec((16,), "float16", family="offset"),
                 "weight": TensorSpec((16,), "float16", family="outlier")}, {"eps": 1e-6})
    spread = rounding_bias.spread_values(case)
    assert [s.family for s in spread.tensors.values()] == ["normal", "normal", "outlier"]
    assert spread.tensors["x"].injections == () and spread.params == case.params


def test_elements_the_rule_leaves_unconstrained_are_not_judged():
    # a defined op's allowance is infinite (masked) where nothing pins an element down (an
    # intermediate past float16's range); every element so once divided by a zero weight
    pool = rounding_bias._Pool()
    expected = np.linspace(1.0, 2.0, 64)
    got = torch.from_numpy(expected).half()
    pool.add(got, expected, np.ma.masked_invalid(np.full(64, np.inf)), np.zeros(64), torch.float16)
    found = pool.judged(DELTA)
    assert all(b.elements == 0 and not b.failed and b.allowed == np.inf for b in found.values())


def test_a_defined_ops_fp32_share_is_its_arithmetic_not_the_references_noise(scratch_ops):
    """compute_only(p) for a defined op: the derived rule with intermediates held in fp32 (the
    arithmetic's share c, nonzero for a sum), not the fp64 reference's own error; a truncating
    store still fails."""
    import tritoncheck as tc
    from tritoncheck.tolerance import Precision, reference_precision
    spec = tc.op("bias_rowsum", inputs={"x": tc.Tensor("M", "K")})(lambda x: x.sum(-1, keepdim=True) * x).spec()
    case = Case("bias_rowsum", "float16", ("x",), {"x": TensorSpec((64, 32), "float16", seed=0)})
    x = case.materialise("cpu")["x"]
    expected, inputs64 = spec.expected(case, {"x": x})
    p = Precision.of(torch.float16, "interpret")
    share = np.ma.getdata(spec.tolerance(case, inputs64, expected, rounding_bias.compute_only(p))["out"])
    noise = np.ma.getdata(spec.tolerance(case, inputs64, expected, reference_precision(p))["out"])
    assert np.all(share > 1e3 * noise) and np.median(share / np.abs(expected["out"])) < 2.0**-14
    impl = registry.Implementation.of("bias_rowsum", lambda x: _truncated(x.float().sum(-1, keepdim=True) * x.float()))
    with pytest.raises(AssertionError, match="biased toward zero"):
        generic.unbiased_rounding(case, impl)


def _truncated(y: torch.Tensor) -> torch.Tensor:
    """fp32 ``y`` stored in float16 by truncation (toward zero)."""
    h = y.half()
    over = (h.float().abs() > y.abs()) & torch.isfinite(h)
    return torch.where(over, torch.nextafter(h, torch.zeros_like(h)), h)
