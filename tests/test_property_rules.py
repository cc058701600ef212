"""The allowances derived for properties themselves (not borrowed from matches_reference)
are tight where the property is exact, and fail the bugs they are meant to see."""
import numpy as np
import pytest
import torch

from tritoncheck import registry
from tritoncheck.properties import elementwise_tolerance, softmax_tolerance
from tritoncheck.properties.attention import _online_merge
from tritoncheck.strategies import Case, TensorSpec
from tritoncheck.tolerance import Precision

OPS = registry.load()


def test_row_sum_allowance_stays_small_for_huge_logits():
    # the per-element softmax rule allowed ~1 for the top entry here; the row sum cannot
    x = np.array([[3e38, -3e38, 1e38]])
    y = np.array([[1.0, 0.0, 0.0]])
    allowed = softmax_tolerance.softmax_row_sum(x, y, 1.0, Precision.of(torch.float32, "interpret"))
    assert allowed[0] < 1e-5


def test_rows_sum_to_one_fails_a_softmax_that_zeroes_huge_logit_rows():
    def zero_huge_rows(x, temperature=1.0):
        y = torch.softmax(x.float() / temperature, dim=-1)
        return torch.where(x.float().amax(-1, keepdim=True) > 1e30, 0.0, y).to(x.dtype)

    zero_huge_rows.uses_triton = False
    impl = registry.Implementation.of("softmax", zero_huge_rows)
    check = {c.name: c for c in OPS["softmax"].checks}["rows_sum_to_one"]
    case = Case("softmax", "float32", ("x", "temperature"),
                {"x": TensorSpec((2, 5), "float32", family="near_max", seed=7)}, {"temperature": 1.0})
    with pytest.raises(AssertionError, match="rows do not sum to one"):
        check.run(case, impl)


def test_row_sum_allowance_covers_store_rounding_of_a_long_row():
    n = 131075
    x = np.zeros((1, n))
    y = torch.full((1, n), 1.0 / n, dtype=torch.float16).double().numpy()
    allowed = softmax_tolerance.softmax_row_sum(x, y, 1.0, Precision.of(torch.float16, "cuda"))
    assert abs(y.sum() - 1) <= allowed[0] < 0.02


def test_pair_norm_is_exact_for_scaled_tables():
    x = np.array([[3.0, 4.0]])
    cos, sin = np.array([[2.0]]), np.array([[0.0]])
    y = np.array([[6.0, 8.0]])
    norm, allowed = elementwise_tolerance.rope_pair_norm(x, cos, sin, y, torch.float32, Precision.of(torch.float32, "cuda"))
    assert norm[0, 0] == 10.0 and allowed[0, 0] < 1e-5


def test_online_merge_is_the_logsumexp_of_all_blocks():
    rng = np.random.default_rng(0)
    s = rng.standard_normal((3, 10)) * 30
    blocks = [s[:, :3], s[:, 3:4], s[:, 4:]]
    lses = [np.logaddexp.reduce(b, axis=-1) for b in blocks]
    lses[1][0] = -np.inf  # a block row 0 does not see
    full = np.logaddexp.reduce(np.concatenate([blocks[0], blocks[2]], axis=-1), axis=-1)
    merged = _online_merge(lses)
    assert np.allclose(merged[0], full[0], rtol=0, atol=1e-12)
    assert np.allclose(merged[1:], np.logaddexp.reduce(s, axis=-1)[1:], rtol=0, atol=1e-12)


def test_online_lse_catches_an_lse_that_is_the_max_score_without_the_reference():
    # the blocks' maxima merge to more than the full maximum: no fp64 reference involved
    def max_as_lse(q, k, v, causal=False, sm_scale=None):
        scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        return torch.softmax(s, dim=-1).to(q.dtype) @ v, s.amax(-1)

    max_as_lse.uses_triton = False
    impl = registry.Implementation.of("attention", max_as_lse)
    check = {c.name: c for c in OPS["attention"].checks}["online_lse_matches_full"]
    spec = {n: TensorSpec((1, 1, 8, 16), "float32", seed=i) for i, n in enumerate("qkv")}
    case = Case("attention", "float32", ("q", "k", "v", "causal", "sm_scale"), spec,
                {"causal": False, "sm_scale": None, "key_cuts": (3, 5)})
    with pytest.raises(AssertionError, match="online merge"):
        check.run(case, impl)


def test_softmax_allowance_is_finite_beside_a_neg_inf_entry_of_a_near_max_row():
    # drawn by the gpu profile at 200 examples: bf16 logits near the cap, T = 0.5, x[0] = -inf;
    # the exponent error is infinite there and e^{-inf + inf} made the allowance NaN
    spec = TensorSpec(shape=(17,), dtype="bfloat16", family="near_max", seed=0, injections=((0, float("-inf")),),
                      max_magnitude=8.473828473128839e37)
    case = Case("softmax", "bfloat16", ("x", "temperature"), {"x": spec}, {"temperature": 0.5})
    x = case.materialise(torch.device("cpu"))["x"].double().numpy()
    p = Precision.of(torch.bfloat16, "cuda")
    allowed = softmax_tolerance.softmax(x, np.zeros_like(x), 0.5, p)
    assert np.isfinite(allowed).all() and allowed[0] == p.floor  # a -inf entry is exactly 0: the floor only


@pytest.mark.parametrize("control", ["torch_softmax", "torch_softmax_cuda_backward"])
def test_softmax_gradient_admits_pytorchs_own_float16_backward(control):
    # issue 36, seen on an H200 (torch 2.11): torch.softmax's float16 gradient failed
    # gradients_match_reference at 1.00 x the allowance (expected 1.90056122e-06, got
    # 1.96695328e-06). PyTorch's CUDA backward rounds each product dy * y to float16 (into
    # the subnormals at dy ~ 1e-3) before summing them: torch_softmax does so on a GPU,
    # torch_softmax_cuda_backward everywhere (on CPU torch computes it all in fp32).
    from tritoncheck import backend
    from tritoncheck.controls import softmax as controls
    from tritoncheck.generic import gradients_match_reference
    fn = getattr(controls, control)
    x = TensorSpec((2045,), "float16", family="normal", scale=1.0, seed=0)
    dy = TensorSpec((2045,), "float16", family="normal", scale=1e-3, seed=0)
    case = Case("softmax", "float16", ("x", "temperature"), {"x": x, "dy": dy}, {"temperature": 1.0})
    impl = registry.Implementation.of("softmax", fn, kind="control")
    values = case.materialise(backend.device())
    xg = values["x"].clone().requires_grad_(True)
    (dx,) = torch.autograd.grad(fn(xg), xg, values["dy"])
    if control == "torch_softmax_cuda_backward" or backend.current() == "cuda":
        assert dx[517].item() == 1.9669532775878906e-06  # the value seen on the GPU
    gradients_match_reference(case, impl)
