"""Smoke tests of the norms family: kernels, references, controls, mutants.

Fast (Triton interpreter on CPU, or the GPU when the suite's backend picks it). The
real tolerance rules and properties live in the suite; the bounds here are loose fixed
bounds that catch a broken kernel, not a slightly inaccurate one.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from tritoncheck import backend
from tritoncheck.controls import norms as controls
from tritoncheck.kernels import norms as kn
from tritoncheck.kernels.norms import dropout_residual_layer_norm, layer_norm
from tritoncheck.mutants import norms as mutants
from tritoncheck.references import norms as refs

# the plugin chose the backend (TRITON_INTERPRET) before this module was imported
DEVICE = backend.device()

# Loose smoke bounds on max |y - ref| / (1 + max |ref|), per dtype. bf16 allows for the
# interpreter's truncating fp32 -> bf16 store (one more bf16 unit than rounding).
BOUND = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def small_caps(monkeypatch):
    """Same block/group caps on GPU as on the interpreter, so both run the multi-block
    column loop (N > 64) and multi-row groups (M > 4) in these small cases."""
    monkeypatch.setattr(kn, "MAX_BLOCK_N_CUDA", 64)
    monkeypatch.setattr(kn, "MAX_BLOCK_N_INTERPRET", 64)
    monkeypatch.setattr(kn, "MAX_GROUPS_CUDA", 4)
    monkeypatch.setattr(kn, "MAX_GROUPS_INTERPRET", 4)


def _np(t):
    return t.detach().cpu().double().numpy()


def _rand(shape, dtype=torch.float32, seed=0, scale=1.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + offset).to(dtype).to(DEVICE)


def _layout(t, layout):
    """A view of a fresh tensor holding t's values in the given layout."""
    if layout == "contiguous":
        return t.clone()
    if layout == "transposed":  # last dim has stride != 1
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "step":  # every other column of a wider tensor
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    if layout == "offset":  # storage offset, padded rows
        buf = torch.zeros(t.shape[:-1].numel() * (t.shape[-1] + 3) + 5, dtype=t.dtype, device=t.device)
        view = buf[5:].view(*t.shape[:-1], t.shape[-1] + 3)[..., : t.shape[-1]]
        view.copy_(t)
        return view
    if layout == "permuted":  # [A, B, N] stored as [B, A, N]: leading dims do not merge
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    raise ValueError(layout)


def _err(y, ref):
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(_np(y) - ref)) / (1.0 + np.max(np.abs(ref))))


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------
def _ok(shape=(3, 8), dtype=torch.float32):
    return torch.randn(shape, device=DEVICE).to(dtype)


LN_BAD = [
    ("x_not_tensor", lambda: dict(x=np.zeros((3, 8)), weight=_ok((8,)), bias=_ok((8,))), TypeError, "x"),
    ("x_int", lambda: dict(x=_ok().to(torch.int32), weight=_ok((8,)), bias=_ok((8,))), TypeError, "x"),
    ("x_float64", lambda: dict(x=_ok().double(), weight=_ok((8,)).double(), bias=_ok((8,)).double()), TypeError, "x"),
    ("weight_dtype", lambda: dict(x=_ok(), weight=_ok((8,), torch.float16), bias=_ok((8,))), TypeError, "weight"),
    ("bias_dtype", lambda: dict(x=_ok(), weight=_ok((8,)), bias=_ok((8,), torch.bfloat16)), TypeError, "bias"),
    ("weight_shape", lambda: dict(x=_ok(), weight=_ok((7,)), bias=_ok((8,))), ValueError, "weight"),
    ("bias_shape", lambda: dict(x=_ok(), weight=_ok((8,)), bias=_ok((1, 8))), ValueError, "bias"),
    ("x_scalar", lambda: dict(x=_ok(()), weight=_ok((1,)), bias=_ok((1,))), ValueError, "x"),
    ("x_empty_row", lambda: dict(x=_ok((3, 0)), weight=_ok((0,)), bias=_ok((0,))), ValueError, "x"),
    ("weight_device", lambda: dict(x=_ok(), weight=torch.empty(8, device="meta"), bias=_ok((8,))), ValueError, "weight"),
    ("eps_zero", lambda: dict(x=_ok(), weight=_ok((8,)), bias=_ok((8,)), eps=0.0), ValueError, "eps"),
    ("eps_nan", lambda: dict(x=_ok(), weight=_ok((8,)), bias=_ok((8,)), eps=float("nan")), ValueError, "eps"),
    ("eps_str", lambda: dict(x=_ok(), weight=_ok((8,)), bias=_ok((8,)), eps="1e-5"), TypeError, "eps"),
]


def _drop_kwargs(**over):
    kw = dict(x=_ok(), residual=_ok(), weight=_ok((8,)), bias=_ok((8,)), p=0.1, seed=0)
    kw.update(over)
    return kw


DROP_BAD = [
    ("residual_shape", lambda: _drop_kwargs(residual=_ok((3, 9))), ValueError, "residual"),
    ("residual_dtype", lambda: _drop_kwargs(residual=_ok(dtype=torch.float16)), TypeError, "residual"),
    ("residual_not_tensor", lambda: _drop_kwargs(residual=1.0), TypeError, "residual"),
    ("weight_shape", lambda: _drop_kwargs(weight=_ok((9,))), ValueError, "weight"),
    ("p_one", lambda: _drop_kwargs(p=1.0), ValueError, "p"),
    ("p_negative", lambda: _drop_kwargs(p=-0.1), ValueError, "p"),
    ("p_nan", lambda: _drop_kwargs(p=float("nan")), ValueError, "p"),
    ("p_tensor", lambda: _drop_kwargs(p="0.5"), TypeError, "p"),
    ("seed_float", lambda: _drop_kwargs(seed=1.5), TypeError, "seed"),
    ("seed_bool", lambda: _drop_kwargs(seed=True), TypeError, "seed"),
    ("seed_negative", lambda: _drop_kwargs(seed=-1), ValueError, "seed"),
    ("eps_negative", lambda: _drop_kwargs(eps=-1e-5), ValueError, "eps"),
]


@pytest.mark.parametrize("make,exc,name", [c[1:] for c in LN_BAD], ids=[c[0] for c in LN_BAD])
def test_layer_norm_validation(make, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        layer_norm(**make())


@pytest.mark.parametrize("make,exc,name", [c[1:] for c in DROP_BAD], ids=[c[0] for c in DROP_BAD])
def test_dropout_validation(make, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        dropout_residual_layer_norm(**make())


def test_empty_rows_follow_contract():
    x = torch.empty(0, 5, device=DEVICE)
    assert layer_norm(x, _ok((5,)), _ok((5,))).shape == (0, 5)
    y, keep = dropout_residual_layer_norm(x, x, _ok((5,)), _ok((5,)), 0.5, 1)
    assert y.shape == (0, 5) and keep.shape == (0, 5) and keep.dtype == torch.bool


# --------------------------------------------------------------------------------------
# Forward against the fp64 reference
# --------------------------------------------------------------------------------------
FWD_CASES = [
    # (shape, dtype, layout, offset): N not a power of two, N > one block (64 here),
    # N a multiple of the block, strided views, all three dtypes.
    ((5, 37), torch.float32, "contiguous", 0.0),
    ((3, 200), torch.float32, "contiguous", 3.0),
    ((2, 128), torch.float32, "transposed", 0.0),
    ((4, 3, 70), torch.float32, "permuted", -2.0),
    ((3, 45), torch.float32, "step", 0.0),
    ((3, 50), torch.float32, "offset", 1e4),
    ((1, 1), torch.float32, "contiguous", 0.0),
    ((4, 100), torch.float16, "transposed", 1.0),
    ((2, 3, 33), torch.bfloat16, "contiguous", 0.0),
    ((3, 150), torch.bfloat16, "step", 2.0),
]


@pytest.mark.parametrize("shape,dtype,layout,offset", FWD_CASES,
                         ids=[f"{c[0]}-{str(c[1])[6:]}-{c[2]}" for c in FWD_CASES])
def test_layer_norm_matches_reference(shape, dtype, layout, offset):
    n = shape[-1]
    x = _layout(_rand(shape, dtype, seed=1, offset=offset), layout)
    wide_w = _rand((2 * n,), dtype, seed=2)  # strided weight
    w = wide_w[::2]
    b = _rand((n,), dtype, seed=3)
    x_before, w_before = x.clone(), w.clone()
    y = layer_norm(x, w, b)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(x, x_before) and torch.equal(w, w_before)
    ref = refs.layer_norm(_np(x), _np(w), _np(b))
    # A large common offset: the fp32 mean itself is uncertain to ulp(1e4) ~ 1e-3, which
    # shifts every x - mean (inherent, not a kernel error); scale the bound by it.
    cond = 1.0 + abs(offset)
    assert _err(y, ref) < BOUND[dtype] * cond
    # the plain-torch control agrees too (it is what the suite must pass)
    assert _err(controls.torch_layer_norm(x, w, b), ref) < BOUND[dtype] * cond


def test_block_cap_can_be_lowered(monkeypatch):
    monkeypatch.setattr(kn, "MAX_BLOCK_N_CUDA", 16)
    monkeypatch.setattr(kn, "MAX_BLOCK_N_INTERPRET", 16)
    x, w, b = _rand((3, 37), seed=4, offset=5.0), _rand((37,), seed=5), _rand((37,), seed=6)
    assert kn.block_n_for(37, x.device) == 16
    assert _err(layer_norm(x, w, b), refs.layer_norm(_np(x), _np(w), _np(b))) < 1e-4


def test_constant_row_gives_bias_exactly():
    # corrected two-pass: the refined mean makes x - mean exactly 0 on a constant row
    for value, n in ((10000.1, 37), (10000.3, 3), (0.1, 5)):
        x = torch.full((2, n), value, device=DEVICE)
        w, b = _rand((n,), seed=7), _rand((n,), seed=8)
        assert torch.equal(layer_norm(x, w, b), b.expand(2, n))


def test_references_agree():
    x, w, b = _rand((3, 11), seed=9).double(), _rand((11,), seed=10).double(), _rand((11,), seed=11).double()
    np.testing.assert_allclose(refs.layer_norm(_np(x), _np(w), _np(b)),
                               _np(refs.layer_norm_torch(x, w, b)), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------
def test_gradcheck_torch_reference():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: refs.layer_norm_torch(*a, eps=1e-3), (x, w, b))


GRAD_CASES = [
    # (shape, dtype, layout): 6 rows -> 3 groups of 2 rows, N not a power of two;
    # a strided 3-d case with N > one block and a non-contiguous dy.
    ((6, 37), torch.float32, "contiguous"),
    ((2, 3, 100), torch.float32, "permuted"),
    ((5, 40), torch.float16, "transposed"),
]


@pytest.mark.parametrize("shape,dtype,layout", GRAD_CASES, ids=[f"{c[0]}-{str(c[1])[6:]}-{c[2]}" for c in GRAD_CASES])
def test_layer_norm_gradients(shape, dtype, layout):
    n = shape[-1]
    x = _layout(_rand(shape, dtype, seed=13, offset=1.0), layout).requires_grad_()
    w = _rand((n,), dtype, seed=14).requires_grad_()
    b = _rand((n,), dtype, seed=15).requires_grad_()
    dy = _layout(_rand(shape, dtype, seed=16), "transposed")
    layer_norm(x, w, b).backward(dy)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    refs.layer_norm_torch(xd, wd, bd).backward(dy.double())
    for got, want in ((x.grad, xd.grad), (w.grad, wd.grad), (b.grad, bd.grad)):
        assert got.dtype == dtype and got.shape == want.shape
        assert _err(got, _np(want)) < 10 * BOUND[dtype]


def test_layer_norm_deterministic():
    x0 = _rand((7, 90), seed=17, offset=2.0)
    w0, b0, dy = _rand((90,), seed=18), _rand((90,), seed=19), _rand((7, 90), seed=20)
    outs = []
    for _ in range(2):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        y = layer_norm(x, w, b)
        y.backward(dy)
        outs.append((y.detach(), x.grad, w.grad, b.grad))
    for a, c in zip(*outs):
        assert torch.equal(a, c)


# --------------------------------------------------------------------------------------
# dropout + residual + layer norm
# --------------------------------------------------------------------------------------
DROP_CASES = [
    ((5, 37), torch.float32, "contiguous", 0.3, 1),
    ((2, 2, 100), torch.float32, "step", 0.5, 2**40 + 3),
    ((4, 64), torch.float32, "transposed", 0.9, 7),
    ((3, 70), torch.float16, "contiguous", 0.2, 123),
    ((3, 33), torch.bfloat16, "offset", 0.4, 5),
]


@pytest.mark.parametrize("shape,dtype,layout,p,seed", DROP_CASES, ids=[f"{c[0]}-{str(c[1])[6:]}-{c[2]}" for c in DROP_CASES])
def test_dropout_matches_reference_given_keep(shape, dtype, layout, p, seed):
    n = shape[-1]
    x = _layout(_rand(shape, dtype, seed=21), layout)
    r = _rand(shape, dtype, seed=22, offset=2.0)
    w, b = _rand((2 * n,), dtype, seed=23)[::2], _rand((n,), dtype, seed=24)
    y, keep = dropout_residual_layer_norm(x, r, w, b, p, seed)
    assert y.dtype == dtype and y.shape == x.shape
    assert keep.dtype == torch.bool and keep.shape == x.shape
    ref = refs.dropout_residual_layer_norm_given_keep(_np(x), _np(r), _np(w), _np(b), p, _np(keep).astype(bool))
    assert _err(y, ref) < BOUND[dtype] * 4
    y2, keep2 = dropout_residual_layer_norm(x, r, w, b, p, seed)
    assert torch.equal(keep, keep2) and torch.equal(y, y2)


def test_dropout_mask_properties():
    x = _rand((8, 64), seed=25)
    w, b = torch.ones(64, device=DEVICE), torch.zeros(64, device=DEVICE)
    _, keep = dropout_residual_layer_norm(x, x, w, b, 0.25, 11)
    frac = keep.float().mean().item()
    assert abs(frac - 0.75) < 5 * np.sqrt(0.75 * 0.25 / keep.numel())
    assert not all(torch.equal(keep[0], keep[i]) for i in range(1, 8))  # rows differ
    _, other = dropout_residual_layer_norm(x, x, w, b, 0.25, 12)
    assert not torch.equal(keep, other)
    # p = 0 keeps everything and is layer_norm(x + residual)
    r = _rand((8, 64), seed=26)
    y0, keep0 = dropout_residual_layer_norm(x, r, w, b, 0.0, 11)
    assert bool(keep0.all())
    assert _err(y0, refs.layer_norm(_np(x) + _np(r), _np(w), _np(b))) < 1e-4


def test_dropout_control_runs():
    x, r = _rand((3, 37), seed=27), _rand((3, 37), seed=28)
    w, b = _rand((37,), seed=29), _rand((37,), seed=30)
    y, keep = controls.torch_dropout_residual_layer_norm(x, r, w, b, 0.3, 4)
    ref = refs.dropout_residual_layer_norm_given_keep(_np(x), _np(r), _np(w), _np(b), 0.3, _np(keep).astype(bool))
    assert _err(y, ref) < 1e-4


# --------------------------------------------------------------------------------------
# Mutants: each patch applies and each differs from the kernel on its trigger
# --------------------------------------------------------------------------------------
def _ln_fwd_gap(fn, x, n):
    w, b = _rand((n,), seed=31), _rand((n,), seed=32)
    return float((fn(x, w, b).double() - layer_norm(x, w, b).double()).abs().nan_to_num(1e9).max())


def _ln_grad_gap(fn, shape, layout="contiguous", dtype=torch.float32):
    n = shape[-1]
    x0 = _layout(_rand(shape, dtype, seed=33, offset=1.0), layout)
    w0, b0, dy = _rand((n,), dtype, seed=34), _rand((n,), dtype, seed=35), _rand(shape, dtype, seed=36)
    grads = []
    for f in (fn, layer_norm):
        x, w, b = (t.detach().clone().requires_grad_() for t in (x0, w0, b0))
        f(x, w, b).backward(dy)
        grads.append((x.grad, w.grad, b.grad))
    return max(float((a.double() - c.double()).abs().max()) for a, c in zip(*grads))


def _drop_args(shape=(6, 37), p=0.3, seed=3):
    n = shape[-1]
    return (_rand(shape, seed=37), _rand(shape, seed=38, offset=3.0), _rand((n,), seed=39),
            _rand((n,), seed=40), p, seed)


def _drop_gap(fn, p=0.3):
    args = _drop_args(p=p)
    (y, _), (yk, _) = fn(*args), dropout_residual_layer_norm(*args)
    return float((y.double() - yk.double()).abs().max())


def _keep_fraction_gap(fn):
    _, keep = fn(*_drop_args(shape=(8, 64), p=0.2))
    return abs(keep.float().mean().item() - 0.8)


def _rows_share_mask(fn):
    _, keep = fn(*_drop_args(shape=(8, 64), p=0.5))
    return float(all(torch.equal(keep[0], keep[i]) for i in range(1, 8)))


def _group_cap(fn):
    """The row-group cap of the module ``fn`` runs from (a mutant is its own module)."""
    mod = sys.modules[getattr(fn, "fn", fn).__module__]
    return mod.MAX_GROUPS_CUDA if DEVICE.type == "cuda" else mod.MAX_GROUPS_INTERPRET


# Trigger per mutant -> a gap that is ~0 for the kernel itself and > threshold for the bug.
# Mutants run with the kernel module's *default* caps (they are separate patched modules),
# so dweight_partial_rows needs M > the group cap (256 on a GPU, 4 on the interpreter).
MUTANT_TRIGGERS = {
    "one_pass_variance": (lambda f: _ln_fwd_gap(f, _rand((4, 37), seed=41, offset=1e4), 37), 1.0),
    "padded_lanes_in_variance": (lambda f: _ln_fwd_gap(f, _rand((4, 37), seed=42, offset=3.0), 37), 0.1),
    "eps_outside_sqrt": (lambda f: _ln_fwd_gap(f, _rand((4, 37), seed=43, scale=1e-3), 37), 0.1),
    "backward_missing_xhat_term": (lambda f: _ln_grad_gap(f, (3, 37)), 0.05),
    "dweight_partial_rows": (lambda f: _ln_grad_gap(f, (_group_cap(f) + 2, 8)), 0.1),
    "bf16_large_batch_param_grads_zeroed": (lambda f: _ln_grad_gap(f, (_group_cap(f) + 2, 8), dtype=torch.bfloat16), 0.1),
    "dweight_skips_last_group": (lambda f: _ln_grad_gap(f, (6, 37)), 0.1),
    "assumes_contiguous_rows": (lambda f: _ln_grad_gap(f, (4, 37), "transposed"), 0.1),
    "dropout_unscaled": (lambda f: _drop_gap(f), 0.05),
    "dropout_padded_lanes_in_variance": (lambda f: _drop_gap(f, p=0.0), 0.1),
    "dropout_keep_below_p": (_keep_fraction_gap, 0.3),
    "dropout_same_mask_every_row": (_rows_share_mask, 0.5),
}


def test_every_mutant_has_a_trigger():
    names = {m.name for m in vars(mutants).values() if isinstance(m, type(mutants.one_pass_variance))}
    assert names == set(MUTANT_TRIGGERS)
    for name in names:
        m = getattr(mutants, name)
        assert m.kills and m.bug and m.op in ("layer_norm", "dropout_residual_layer_norm")


@pytest.mark.parametrize("name", sorted(MUTANT_TRIGGERS))
def test_mutant_differs_on_trigger(name, monkeypatch):
    # the mutants carry the default caps; compare against the kernel with the same caps
    monkeypatch.undo()
    mutant = getattr(mutants, name)
    gap, threshold = MUTANT_TRIGGERS[name]
    real = {"dropout_keep_below_p": dropout_residual_layer_norm,
            "dropout_same_mask_every_row": dropout_residual_layer_norm}.get(name)
    if real is not None:  # mask statistics: the kernel itself must be near 0
        assert gap(real) < threshold / 3
    assert gap(mutant) > threshold
