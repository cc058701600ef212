"""Smoke tests of the cross-entropy kernel, its references, control and mutants.

Fast fixed cases with loose bounds; the derived tolerances and the fuzzing live in the
suite. Runs under the Triton interpreter when there is no GPU (set before triton loads).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritoncheck import backend
from tritoncheck.controls import losses as controls
from tritoncheck.kernels import losses as kmod
from tritoncheck.kernels.losses import cross_entropy
from tritoncheck.references import losses as ref

# the plugin chose the backend (TRITON_INTERPRET) before this module was imported
DEVICE = backend.device()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Loose smoke bounds (fp32 compute; the bf16 gradient store truncates under the interpreter).
LOSS_TOL = 1e-4
GRAD_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
CHECKS = {
    "matches_reference", "gradients_match_reference", "ignored_rows_zero", "loss_at_least_zero",
    "shift_invariant", "deterministic", "inputs_unchanged",
}


def _logits(m, v, dtype, layout="contiguous", scale=3.0, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    if layout == "contiguous":
        x = torch.randn(m, v, generator=g) * scale + offset
    elif layout == "transposed":
        x = (torch.randn(v, m, generator=g) * scale + offset).t()
    elif layout == "sliced":  # step-sliced columns and rows, with a storage offset
        x = (torch.randn(2 * m + 1, 2 * v + 3, generator=g) * scale + offset)[1::2, 3::2]
    else:
        raise AssertionError(layout)
    return x.to(dtype).to(DEVICE)


def _targets(m, v, seed=0, ignore=(), ignore_index=-100):
    g = torch.Generator().manual_seed(seed + 1)
    t = torch.randint(0, v, (m,), generator=g)
    for i in ignore:
        t[i] = ignore_index
    return t.to(DEVICE)


def _np(t):
    return t.detach().cpu().to(torch.float64).numpy()


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "args, kwargs, exc, name",
    [
        (([[1.0, 2.0]], "t"), {}, TypeError, "logits"),
        (("not a tensor", "t"), {}, TypeError, "logits"),
        (("x64", "t"), {}, TypeError, "logits"),
        (("x", "t32"), {}, TypeError, "target"),
        (("x", "tlist"), {}, TypeError, "target"),
        (("x", "t"), {"ignore_index": 1.5}, TypeError, "ignore_index"),
        (("x3d", "t"), {}, ValueError, "logits"),
        (("x1d", "t"), {}, ValueError, "logits"),
        (("xv0", "t"), {}, ValueError, "logits"),
        (("x", "tshort"), {}, ValueError, "target"),
        (("x", "thigh"), {}, ValueError, "target"),
        (("x", "tneg"), {}, ValueError, "target"),
    ],
)
def test_validation(args, kwargs, exc, name):
    x = _logits(4, 10, torch.float32)
    t = _targets(4, 10)
    pool = {
        "x": x, "x64": x.double(), "x3d": x[None], "x1d": x[0], "xv0": x[:, :0],
        "t": t, "t32": t.int(), "tlist": t.tolist(), "tshort": t[:3],
        "thigh": torch.tensor([0, 10, 1, 2], device=DEVICE), "tneg": torch.tensor([0, -1, 1, 2], device=DEVICE),
    }
    call = [pool.get(a, a) if isinstance(a, str) else a for a in args]
    with pytest.raises(exc, match=name):
        cross_entropy(*call, **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_validation_two_devices():
    x = _logits(4, 10, torch.float32)
    other = torch.device("cpu") if DEVICE.type == "cuda" else torch.device("cuda")
    with pytest.raises(ValueError, match="target"):
        cross_entropy(x, _targets(4, 10).to(other))


def test_empty_rows_and_custom_ignore_index():
    x = _logits(0, 7, torch.float32)
    out = cross_entropy(x, torch.zeros(0, dtype=torch.int64, device=DEVICE))
    assert out.shape == (0,) and out.dtype == torch.float32
    # ignore_index inside [0, V): those rows are ignored, not looked up.
    x = _logits(5, 7, torch.float32)
    t = torch.tensor([3, 0, 3, 6, 1], device=DEVICE)
    loss = cross_entropy(x, t, ignore_index=3)
    np.testing.assert_allclose(_np(loss), ref.cross_entropy(_np(x), t.cpu().numpy(), ignore_index=3), atol=1e-5, rtol=1e-5)
    assert loss[0].item() == 0.0 and loss[2].item() == 0.0
    # A strided target (every other element of a longer tensor).
    t_long = torch.tensor([3, 9, 0, 9, 3, 9, 6, 9, 1], device=DEVICE)
    torch.testing.assert_close(cross_entropy(x, t_long[::2], ignore_index=3), loss, rtol=0, atol=0)


# --------------------------------------------------------------------------- forward


# (M, V, layout, dtype): V below one block; V longer than one block and not a multiple of
# it (300 under the interpreter's 128 cap; 5000 under the GPU's 4096 cap).
CASES = [
    (m, v, layout, dtype)
    for m, v in [(5, 10), (6, 300)]
    for layout in ["contiguous", "transposed", "sliced"]
    for dtype in DTYPES
] + [(3, 5000, "contiguous", torch.float32), (2, 5000, "sliced", torch.bfloat16)]


@pytest.mark.parametrize("m, v, layout, dtype", CASES, ids=lambda p: str(p))
def test_forward_matches_reference(m, v, layout, dtype):
    x = _logits(m, v, dtype, layout)
    t = _targets(m, v, ignore=(1,))
    x_before = x.clone()
    loss = cross_entropy(x, t)
    assert loss.dtype == torch.float32 and loss.shape == (m,)
    expect = ref.cross_entropy(_np(x), t.cpu().numpy())
    err = np.abs(_np(loss) - expect).max()
    assert err <= LOSS_TOL * (1 + np.abs(expect).max()), err
    assert loss[1].item() == 0.0  # exactly
    assert torch.equal(x, x_before)
    assert torch.equal(cross_entropy(x, t), loss)  # deterministic


@pytest.mark.parametrize("offset", [1e4, -1e4])
def test_forward_large_offset_fp32(offset):
    x = _logits(4, 300, torch.float32, offset=offset)
    t = _targets(4, 300)
    expect = ref.cross_entropy(_np(x), t.cpu().numpy())
    err = np.abs(_np(cross_entropy(x, t)) - expect).max()
    assert err <= 4 * 2**-24 * (abs(offset) + 10) * 300 ** 0.5, err


def test_forward_non_finite_rows():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor(
        [[inf, 0.0, 1.0], [-inf, -inf, -inf], [nan, inf, 0.0], [-inf, 2.0, 1.0], [-inf, 2.0, 1.0], [nan, nan, nan]],
        device=DEVICE,
    )
    t = torch.tensor([1, 0, 2, 0, 1, -100], device=DEVICE)
    expect = ref.cross_entropy(_np(x), t.cpu().numpy())
    np.testing.assert_allclose(_np(cross_entropy(x, t)), expect, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert np.isinf(expect[0]) and np.isnan(expect[1]) and np.isnan(expect[2]) and np.isinf(expect[3])


# --------------------------------------------------------------------------- references


def test_references_agree():
    x = _logits(6, 40, torch.float64, scale=5.0).cpu()
    t = _targets(6, 40, ignore=(2,)).cpu()
    np.testing.assert_allclose(
        ref.cross_entropy_torch(x, t).numpy(), ref.cross_entropy(x.numpy(), t.numpy()), rtol=1e-13, atol=1e-13
    )
    with pytest.raises(ValueError, match="target"):
        ref.cross_entropy(x.numpy(), np.full(6, 40))


def test_reference_gradcheck():
    x = _logits(3, 6, torch.float64).cpu().requires_grad_()
    t = _targets(3, 6, ignore=(2,)).cpu()
    assert torch.autograd.gradcheck(lambda z: ref.cross_entropy_torch(z, t), (x,))


def test_control_matches_reference():
    x = _logits(6, 300, torch.float16)
    t = _targets(6, 300, ignore=(0,))
    expect = ref.cross_entropy(_np(x), t.cpu().numpy())
    np.testing.assert_allclose(_np(controls.torch_cross_entropy(x, t)), expect, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="target"):
        controls.torch_cross_entropy(x, torch.full((6,), 300, device=DEVICE))


# --------------------------------------------------------------------------- backward


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("m, v", [(5, 10), (6, 300)])
def test_gradients_match_reference(m, v, layout, dtype):
    x = _logits(m, v, dtype, layout).requires_grad_()
    t = _targets(m, v, ignore=(2,))
    # A strided upstream gradient (stride 2) exercises the dloss stride.
    dloss = torch.randn(2 * m, generator=torch.Generator().manual_seed(5))[::2].to(DEVICE)
    cross_entropy(x, t).backward(dloss)
    assert x.grad.dtype == dtype
    x64 = x.detach().cpu().double().requires_grad_()
    ref.cross_entropy_torch(x64, t.cpu()).backward(dloss.cpu().double())
    err = (x.grad.cpu().double() - x64.grad).abs().max().item()
    assert err <= GRAD_TOL[dtype] * (1 + dloss.abs().max().item()), err
    assert torch.count_nonzero(x.grad[2]).item() == 0  # ignored row: exact zeros


# --------------------------------------------------------------------------- mutants


def _mutants():
    from tritoncheck.mutants import losses as mmod

    return [getattr(mmod, n) for n in mmod.__all__]


def test_mutants_declared():
    mus = _mutants()
    assert {m.name for m in mus} == {"padded_logits_zero", "ignore_index_not_zeroed", "no_max_subtraction", "grad_missing_onehot"}
    for m in mus:
        assert m.op == "cross_entropy" and set(m.kills) <= CHECKS, (m.name, m.kills)


def test_mutant_padded_logits_zero_differs():
    from tritoncheck.mutants.losses import padded_logits_zero as mu

    x, t = _logits(4, 300, torch.float32, scale=0.5), _targets(4, 300)  # 300: not a multiple of the block
    assert (mu(x, t) - cross_entropy(x, t)).abs().min().item() > 0.1
    x, t = _logits(4, 16, torch.float32), _targets(4, 16)  # no padded lanes: identical
    assert torch.equal(mu(x, t), cross_entropy(x, t))


def test_mutant_ignore_index_not_zeroed_differs():
    from tritoncheck.mutants.losses import ignore_index_not_zeroed as mu

    x, t = _logits(4, 30, torch.float32), _targets(4, 30, ignore=(0, 3))
    out = mu(x, t)
    assert out[0].item() != 0.0 and out[3].item() != 0.0
    assert torch.equal(out[1:3], cross_entropy(x, t)[1:3])


def test_mutant_no_max_subtraction_differs():
    from tritoncheck.mutants.losses import no_max_subtraction as mu

    x, t = _logits(3, 40, torch.float32, offset=100.0), _targets(3, 40)
    assert not torch.isfinite(mu(x, t)).any()
    assert torch.isfinite(cross_entropy(x, t)).all()
    x = _logits(3, 40, torch.float32, offset=-200.0)
    assert (mu(x, t) < 0).all()  # lse underflows to -inf: a negative loss
    assert (cross_entropy(x, t) >= 0).all()


def test_mutant_grad_missing_onehot_differs():
    from tritoncheck.mutants.losses import grad_missing_onehot as mu

    x, t = _logits(4, 30, torch.float32), _targets(4, 30)
    assert torch.equal(mu(x, t), cross_entropy(x, t))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    mu(xa, t).sum().backward()
    cross_entropy(xb, t).sum().backward()
    assert (xa.grad - xb.grad).abs().max().item() > 0.5


def test_block_constants_are_read_at_call_time(monkeypatch):
    # Lowering the cap forces many blocks per row; the result must not change.
    x, t = _logits(3, 100, torch.float32), _targets(3, 100)
    full = cross_entropy(x, t)
    monkeypatch.setattr(kmod, "MAX_BLOCK_V_INTERPRET", 16)
    monkeypatch.setattr(kmod, "MAX_BLOCK_V_CUDA", 16)
    assert kmod.block_v_for(100, x.device) == 16
    torch.testing.assert_close(cross_entropy(x, t), full, rtol=1e-6, atol=1e-6)
