"""Smoke tests of the rope and swiglu kernels, their references, controls and mutants.

Fast fixed cases with loose bounds; the derived tolerances and the fuzzing live in the
suite. Runs under the Triton interpreter when there is no GPU (set before triton loads).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritoncheck import backend, registry
from tritoncheck.controls import elementwise as controls
from tritoncheck.kernels import elementwise as kmod
from tritoncheck.kernels.elementwise import rope, swiglu
from tritoncheck.references import elementwise as ref

# the plugin chose the backend (TRITON_INTERPRET) before this module was imported
DEVICE = backend.device()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Loose smoke bounds, relative to the output's scale: fp32 compute, one rounding (or, for
# bf16 under the interpreter, one truncation) on store.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
CHECKS = {op: {c.name for c in registry.load()[op].checks} for op in ("rope", "swiglu")}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _x(b, h, s, d, dtype, layout="contiguous", seed=0):
    g = _gen(seed)
    if layout == "contiguous":
        x = torch.randn(b, h, s, d, generator=g)
    elif layout == "bshd":  # [B, S, H, D] storage seen as [B, H, S, D]
        x = torch.randn(b, s, h, d, generator=g).transpose(1, 2)
    elif layout == "sliced":  # step along D and S, storage offset
        x = torch.randn(b, h, 2 * s + 1, 2 * d + 1, generator=g)[:, :, 1::2, 1::2]
    else:
        raise AssertionError(layout)
    return x.to(dtype).to(DEVICE)


def _cos_sin(s, half, dtype=torch.float32, layout="contiguous", seed=1):
    theta = torch.rand(s, half, generator=_gen(seed)) * 6.3
    cos, sin = theta.cos(), theta.sin()
    if layout == "transposed":
        cos, sin = cos.t().contiguous().t(), sin.t().contiguous().t()
    return cos.to(dtype).to(DEVICE), sin.to(dtype).to(DEVICE)


def _np(t):
    return t.detach().cpu().to(torch.float64).numpy()


def _rel_err(out, expect):
    return np.abs(_np(out) - expect).max() / (1 + np.abs(expect).max())


# =========================================================================== rope


@pytest.mark.parametrize(
    "which, exc, name",
    [
        ("x_not_tensor", TypeError, "x"),
        ("x_int", TypeError, "x"),
        ("x_fp64", TypeError, "x"),
        ("cos_int", TypeError, "cos"),
        ("sin_not_tensor", TypeError, "sin"),
        ("x_3d", ValueError, "x"),
        ("d_odd", ValueError, "D"),
        ("cos_shape", ValueError, "cos"),
        ("sin_shape", ValueError, "sin"),
    ],
)
def test_rope_validation(which, exc, name):
    x = _x(1, 2, 5, 8, torch.float32)
    cos, sin = _cos_sin(5, 4)
    args = {
        "x_not_tensor": ([1.0], cos, sin),
        "x_int": (x.to(torch.int32), cos, sin),
        "x_fp64": (x.double(), cos, sin),
        "cos_int": (x, cos.to(torch.int32), sin),
        "sin_not_tensor": (x, cos, 0.5),
        "x_3d": (x[0], cos, sin),
        "d_odd": (x[..., :7], cos, sin),
        "cos_shape": (x, cos[:4], sin),
        "sin_shape": (x, cos, sin[:, :3]),
    }[which]
    with pytest.raises(exc, match=name):
        rope(*args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_rope_validation_two_devices():
    x = _x(1, 2, 5, 8, torch.float32)
    cos, sin = _cos_sin(5, 4)
    other = torch.device("cpu") if DEVICE.type == "cuda" else torch.device("cuda")
    with pytest.raises(ValueError, match="cos"):
        rope(x, cos.to(other), sin)


# (B, H, S, D): odd S, D not a power of two, D/2 above the interpreter's pair block (16),
# D = 2 (a single pair).
ROPE_SHAPES = [(2, 3, 7, 10), (1, 2, 5, 42), (1, 1, 3, 2), (2, 1, 9, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "bshd", "sliced"])
@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=str)
def test_rope_matches_reference(shape, layout, dtype):
    b, h, s, d = shape
    x = _x(b, h, s, d, dtype, layout)
    cos, sin = _cos_sin(s, d // 2, dtype, "transposed" if layout == "sliced" else "contiguous")
    x_before = x.clone()
    y = rope(x, cos, sin)
    assert y.dtype == dtype and y.shape == x.shape
    expect = ref.rope(_np(x), _np(cos), _np(sin))
    assert _rel_err(y, expect) <= TOL[dtype]
    assert torch.equal(x, x_before)
    assert torch.equal(rope(x, cos, sin), y)  # deterministic


def test_rope_mixed_table_dtype():
    # fp32 tables with bf16 activations: computed in fp32, output bf16.
    x = _x(1, 2, 5, 12, torch.bfloat16)
    cos, sin = _cos_sin(5, 6, torch.float32)
    y = rope(x, cos, sin)
    assert y.dtype == torch.bfloat16
    assert _rel_err(y, ref.rope(_np(x), _np(cos), _np(sin))) <= TOL[torch.bfloat16]


def test_rope_empty():
    x = _x(0, 2, 5, 8, torch.float32)
    cos, sin = _cos_sin(5, 4)
    assert rope(x, cos, sin).shape == x.shape


def test_rope_references_agree_and_gradcheck():
    x = _x(1, 2, 3, 6, torch.float64).cpu()
    cos, sin = _cos_sin(3, 3, torch.float64)
    cos, sin = cos.cpu(), sin.cpu()
    np.testing.assert_allclose(ref.rope_torch(x, cos, sin).numpy(), ref.rope(x.numpy(), cos.numpy(), sin.numpy()), rtol=1e-14, atol=1e-14)
    xg = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda z: ref.rope_torch(z, cos, sin), (xg,))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_control(dtype):
    x = _x(1, 2, 5, 12, dtype, "bshd")
    cos, sin = _cos_sin(5, 6, dtype)
    expect = ref.rope(_np(x), _np(cos), _np(sin))
    assert _rel_err(controls.torch_rope(x, cos, sin), expect) <= 4 * TOL[dtype]
    with pytest.raises(ValueError):
        controls.torch_rope(x[..., :11], cos, sin)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, layout", [((2, 3, 7, 10), "bshd"), ((1, 2, 5, 42), "sliced")], ids=str)
def test_rope_gradients_match_reference(shape, layout, dtype):
    b, h, s, d = shape
    x = _x(b, h, s, d, dtype, layout).requires_grad_()
    cos, sin = _cos_sin(s, d // 2, dtype)
    dy = torch.randn(b, h, s, d, generator=_gen(7)).to(dtype).to(DEVICE).transpose(2, 3).contiguous().transpose(2, 3)
    rope(x, cos, sin).backward(dy)
    assert x.grad.dtype == dtype
    x64 = x.detach().cpu().double().requires_grad_()
    ref.rope_torch(x64, cos.cpu(), sin.cpu()).backward(dy.cpu().double())
    assert _rel_err(x.grad, x64.grad.numpy()) <= TOL[dtype]


def test_rope_block_constants_are_read_at_call_time(monkeypatch):
    x = _x(1, 2, 5, 42, torch.float32)
    cos, sin = _cos_sin(5, 21)
    full = rope(x, cos, sin)
    for name in ("MAX_BLOCK_P_INTERPRET", "MAX_BLOCK_P_CUDA"):
        monkeypatch.setattr(kmod, name, 4)
    assert kmod.rope_blocks_for(21, x.device)[1] == 4
    torch.testing.assert_close(rope(x, cos, sin), full, rtol=0, atol=0)


# =========================================================================== swiglu


@pytest.mark.parametrize(
    "which, exc, name",
    [
        ("gate_not_tensor", TypeError, "gate"),
        ("up_not_tensor", TypeError, "up"),
        ("gate_int", TypeError, "gate"),
        ("mixed_dtype", TypeError, "up"),
        ("shape", ValueError, "up"),
    ],
)
def test_swiglu_validation(which, exc, name):
    g = torch.randn(4, 6, device=DEVICE)
    args = {
        "gate_not_tensor": ([1.0], g),
        "up_not_tensor": (g, 2.0),
        "gate_int": (g.to(torch.int64), g.to(torch.int64)),
        "mixed_dtype": (g, g.half()),
        "shape": (g, g[:, :5]),
    }[which]
    with pytest.raises(exc, match=name):
        swiglu(*args)


def _gate_up(shape, dtype, layout="contiguous", seed=0):
    g = _gen(seed)
    if layout == "contiguous":
        gate, up = torch.randn(shape, generator=g) * 4, torch.randn(shape, generator=g)
    elif layout == "mixed":  # gate transposed, up step-sliced with an offset
        gate = (torch.randn(tuple(reversed(shape)), generator=g) * 4).permute(*reversed(range(len(shape))))
        up = torch.randn(tuple(2 * n + 1 for n in shape), generator=g)[tuple(slice(1, None, 2) for _ in shape)]
    else:
        raise AssertionError(layout)
    gate = gate.clone() if layout == "contiguous" else gate
    flat = gate.reshape(-1) if gate.is_contiguous() else None
    if flat is not None and flat.numel() >= 3:
        flat[0], flat[1], flat[2] = 120.0, -120.0, 0.0  # saturated sigmoid both ways, and 0
    return gate.to(dtype).to(DEVICE), up.to(dtype).to(DEVICE)


SWIGLU_CASES = [((7,), "contiguous"), ((33, 5), "mixed"), ((3, 4, 50), "contiguous"), ((2, 3, 45), "mixed"), ((), "contiguous")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, layout", SWIGLU_CASES, ids=str)
def test_swiglu_matches_reference(shape, layout, dtype):
    gate, up = _gate_up(shape, dtype, layout)
    before = (gate.clone(), up.clone())
    y = swiglu(gate, up)
    assert y.dtype == dtype and y.shape == gate.shape
    expect = ref.swiglu(_np(gate), _np(up))
    assert _rel_err(y, expect) <= TOL[dtype]
    assert torch.equal(gate, before[0]) and torch.equal(up, before[1])
    assert torch.equal(swiglu(gate, up), y)


def test_swiglu_large_gate_no_overflow():
    gate = torch.tensor([-1e4, -100.0, -89.0, 89.0, 100.0, 3e4], device=DEVICE)
    up = torch.ones_like(gate)
    y = swiglu(gate, up)
    assert torch.isfinite(y).all()
    np.testing.assert_allclose(_np(y), ref.swiglu(_np(gate), _np(up)), rtol=1e-6, atol=1e-30)


def test_swiglu_empty():
    g = torch.zeros(0, 5, device=DEVICE)
    assert swiglu(g, g).shape == (0, 5)


def test_swiglu_references_agree_and_gradcheck():
    g = torch.tensor([-800.0, -30.0, -1.0, 0.0, 0.5, 2.0, 40.0, 800.0], dtype=torch.float64)
    u = torch.linspace(-2, 2, 8, dtype=torch.float64)
    np.testing.assert_allclose(ref.swiglu_torch(g, u).numpy(), ref.swiglu(g.numpy(), u.numpy()), rtol=1e-14, atol=1e-300)
    gg = torch.tensor([-3.0, -0.7, 0.3, 1.5, 4.0], dtype=torch.float64, requires_grad=True)
    uu = torch.linspace(-2, 2, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ref.swiglu_torch, (gg, uu))
    # Saturated gates: finite gradients (no NaN leaking through the stable sigmoid's where).
    g2 = g.clone().requires_grad_()
    ref.swiglu_torch(g2, u).sum().backward()
    assert torch.isfinite(g2.grad).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_control(dtype):
    gate, up = _gate_up((3, 20), dtype)
    assert _rel_err(controls.torch_swiglu(gate, up), ref.swiglu(_np(gate), _np(up))) <= 4 * TOL[dtype]
    with pytest.raises(ValueError):
        controls.torch_swiglu(gate, up[:, :5])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, layout", [((33, 5), "mixed"), ((3, 4, 50), "contiguous")], ids=str)
def test_swiglu_gradients_match_reference(shape, layout, dtype):
    gate, up = _gate_up(shape, dtype, layout)
    gate.requires_grad_()
    up.requires_grad_()
    dy = torch.randn(shape, generator=_gen(3)).to(dtype).to(DEVICE)
    swiglu(gate, up).backward(dy)
    g64 = gate.detach().cpu().double().requires_grad_()
    u64 = up.detach().cpu().double().requires_grad_()
    ref.swiglu_torch(g64, u64).backward(dy.cpu().double())
    assert gate.grad.dtype == dtype and up.grad.dtype == dtype
    assert _rel_err(gate.grad, g64.grad.numpy()) <= TOL[dtype]
    assert _rel_err(up.grad, u64.grad.numpy()) <= TOL[dtype]


# =========================================================================== mutants


def _mutants():
    from tritoncheck.mutants import elementwise as mmod

    return {n: getattr(mmod, n) for n in mmod.__all__}


def test_mutants_declared():
    mus = _mutants()
    assert set(mus) == {"half_split_pairs", "sin_sign_flipped", "backward_same_rotation", "last_row_block_unwritten",
                        "sigmoid_overflow", "dup_missing_sigmoid", "gradients_into_saved_inputs",
                        "x_strides_assumed_contiguous", "gate_strides_assumed_contiguous",
                        "autotune_without_reset_to_zero", "swiglu_truncating_store"}
    for name, m in mus.items():
        assert m.name == name and set(m.kills) <= CHECKS[m.op], (name, m.kills)


def _rope_case(d=12):
    x = _x(1, 2, 5, d, torch.float32, "bshd")
    cos, sin = _cos_sin(5, d // 2)
    return x, cos, sin


def _pair_norms(t):
    t = t.detach().double()
    return (t[..., 0::2] ** 2 + t[..., 1::2] ** 2).sqrt()


def test_mutant_half_split_pairs_differs():
    mu = _mutants()["half_split_pairs"]
    x, cos, sin = _rope_case()
    y_mu, y = mu(x, cos, sin), rope(x, cos, sin)
    assert (y_mu - y).abs().max().item() > 0.1
    assert (_pair_norms(y_mu) - _pair_norms(x)).abs().max().item() > 0.1  # pair norms broken
    assert torch.allclose(_pair_norms(y), _pair_norms(x), atol=1e-5)
    x2, cos2, sin2 = _rope_case(d=2)  # one pair: both layouts agree
    assert torch.equal(mu(x2, cos2, sin2), rope(x2, cos2, sin2))


def test_mutant_sin_sign_flipped_differs():
    mu = _mutants()["sin_sign_flipped"]
    x, cos, sin = _rope_case()
    y_mu = mu(x, cos, sin)
    assert (y_mu - rope(x, cos, sin)).abs().max().item() > 0.1
    assert torch.allclose(_pair_norms(y_mu), _pair_norms(x), atol=1e-5)  # still a rotation


def _rope_grad(fn, x, cos, sin, dy):
    xg = x.clone().requires_grad_()
    fn(xg, cos, sin).backward(dy)
    return xg.grad


def test_mutant_backward_same_rotation_differs():
    mu = _mutants()["backward_same_rotation"]
    x, cos, sin = _rope_case()
    assert torch.equal(mu(x, cos, sin), rope(x, cos, sin))
    dy = torch.randn(x.shape, generator=_gen(9)).to(DEVICE)
    assert (_rope_grad(mu, x, cos, sin, dy) - _rope_grad(rope, x, cos, sin, dy)).abs().max().item() > 0.1


def test_mutant_sigmoid_overflow_differs():
    mu = _mutants()["sigmoid_overflow"]
    gate = torch.tensor([-100.0, -1.0, 0.5, 100.0], device=DEVICE)
    up = torch.ones_like(gate)
    y_mu = mu(gate, up)
    assert torch.isnan(y_mu[3]) and torch.isfinite(swiglu(gate, up)).all()
    torch.testing.assert_close(y_mu[:3], swiglu(gate, up)[:3], rtol=1e-6, atol=1e-6)
    g = gate.clone().requires_grad_()
    mu(g, up).sum().backward()
    assert torch.isnan(g.grad[3])


def test_mutant_dup_missing_sigmoid_differs():
    mu = _mutants()["dup_missing_sigmoid"]
    gate, up = _gate_up((4, 9), torch.float32)
    assert torch.equal(mu(gate, up), swiglu(gate, up))
    grads = []
    for fn in (mu, swiglu):
        g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
        fn(g, u).sum().backward()
        grads.append((g.grad, u.grad))
    assert torch.equal(grads[0][0], grads[1][0])  # dgate untouched
    assert (grads[0][1] - grads[1][1]).abs().max().item() > 0.1
