"""kernels/softmax.py: wrapper validation, fixed smoke cases, the fp64 references.

The fuzzed checks live in tests/test_checks.py; this file pins what a fuzzer does
not: that bad input is refused with an error naming the argument.
"""
import numpy as np
import pytest
import torch

from tritoncheck import backend
from tritoncheck.kernels.softmax import softmax
from tritoncheck.references import softmax as ref

DEVICE = backend.device()


@pytest.mark.parametrize("bad, error, words", [
    (lambda: softmax([1.0, 2.0]), TypeError, "x must be a torch.Tensor"),
    (lambda: softmax(torch.ones(3, dtype=torch.int32, device=DEVICE)), TypeError, "x has dtype torch.int32"),
    (lambda: softmax(torch.ones(3, dtype=torch.float64, device=DEVICE)), TypeError, "x has dtype torch.float64"),
    (lambda: softmax(torch.tensor(1.0, device=DEVICE)), ValueError, "at least one dim"),
    (lambda: softmax(torch.ones(0, 4, device=DEVICE)), ValueError, "x is empty"),
    (lambda: softmax(torch.ones(4, device=DEVICE), 0.0), ValueError, "temperature must be finite and > 0"),
    (lambda: softmax(torch.ones(4, device=DEVICE), float("nan")), ValueError, "temperature"),
    (lambda: softmax(torch.ones(4, device=DEVICE), -1.0), ValueError, "temperature"),
    (lambda: softmax(torch.ones(4, device=DEVICE), "hot"), TypeError, "temperature must be a Python float"),
    (lambda: softmax(torch.ones(4, device=DEVICE), torch.tensor(1.0)), TypeError, "temperature"),
])
def test_bad_input_is_refused_with_the_argument_named(bad, error, words):
    with pytest.raises(error, match=words):
        bad()


@pytest.mark.parametrize("shape", [(1,), (3, 7), (2, 3, 1025), (4, 2049)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_the_reference_on_fixed_shapes(shape, dtype):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    y = softmax(x.to(DEVICE), 0.7).cpu().double().numpy()
    expected = ref.softmax(x.double().numpy(), 0.7)
    assert np.abs(y - expected).max() < {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]


def test_transposed_and_sliced_views_need_no_copy_by_the_caller():
    base = torch.randn(64, 40, device=DEVICE)
    for view in (base.t(), base[:, ::3], base[5:, 1:]):
        expected = torch.softmax(view.double(), -1)
        assert torch.allclose(softmax(view).double(), expected, atol=1e-6)


def test_numpy_and_torch_references_agree_and_torch_reference_gradchecks():
    x = torch.randn(3, 9, dtype=torch.float64)
    x[0, 2] = float("-inf")
    assert np.allclose(ref.softmax_torch(x, 0.5).numpy(), ref.softmax(x.numpy(), 0.5), rtol=1e-13, atol=0)
    xg = torch.randn(3, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ref.softmax_torch(t, 0.3), (xg,))


def test_all_neg_inf_row_is_nan_and_masked_entries_are_exactly_zero():
    x = torch.randn(2, 1500, device=DEVICE)
    x[0] = float("-inf")
    x[1, 700:] = float("-inf")
    y = softmax(x)
    assert torch.isnan(y[0]).all() and (y[1, 700:] == 0).all() and torch.isfinite(y[1]).all()
