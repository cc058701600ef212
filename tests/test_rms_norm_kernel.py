"""Smoke tests of the RMSNorm family: kernels, references, controls, mutants, the cast declaration.

Fast (Triton interpreter on CPU, or the GPU when the suite's backend picks it). The
suite's derived rules and properties do the real checking; the bounds here are loose
fixed bounds that catch a broken kernel, not a slightly inaccurate one.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritoncheck import backend
from tritoncheck.controls import rms_norm as controls
from tritoncheck.kernels import norms as norms_kernels
from tritoncheck.kernels import rms_norm as kn
from tritoncheck.kernels.rms_norm import add_rms_norm, rms_norm
from tritoncheck.mutants import rms_norm as mutants
from tritoncheck.mutation import Mutant
from tritoncheck.references import rms_norm as refs

# the plugin chose the backend (TRITON_INTERPRET) before this module was imported
DEVICE = backend.device()

# Loose smoke bounds on max |got - ref| / (1 + max |ref|), per dtype (bf16: the interpreter truncates stores).
BOUND = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def small_caps(monkeypatch):
    """The interpreter's block and group caps on a GPU too, so that both run the
    multi-block column loop (N > 64) and multi-row groups (M > 4) on small cases."""
    monkeypatch.setattr(norms_kernels, "MAX_BLOCK_N_CUDA", 64)  # the caps the RMSNorm launches read
    monkeypatch.setattr(norms_kernels, "MAX_GROUPS_CUDA", 4)


def _np(t):
    return t.detach().cpu().double().numpy()


def _rand(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def _layout(t, layout):
    """A view of a fresh tensor holding t's values in the given layout."""
    if layout == "contiguous":
        return t.clone()
    if layout == "transposed":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "step":
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    if layout == "permuted":  # leading dims that do not merge: the wrapper copies
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    raise ValueError(layout)


def _err(got, want):
    want = np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(_np(got) - want)) / (1.0 + np.max(np.abs(want))))


# ----------------------------------------------------------------------------- validation

def _ok(shape=(3, 8), dtype=torch.float32):
    return torch.randn(shape, device=DEVICE).to(dtype)


BAD = [
    ("x_not_tensor", lambda: (rms_norm, dict(x=np.zeros((3, 8)), weight=_ok((8,)))), TypeError, "x"),
    ("x_int", lambda: (rms_norm, dict(x=_ok().to(torch.int32), weight=_ok((8,)))), TypeError, "x"),
    ("x_float64", lambda: (rms_norm, dict(x=_ok().double(), weight=_ok((8,)).double())), TypeError, "x"),
    ("x_scalar", lambda: (rms_norm, dict(x=_ok(()), weight=_ok((1,)))), ValueError, "x"),
    ("x_empty_row", lambda: (rms_norm, dict(x=_ok((3, 0)), weight=_ok((0,)))), ValueError, "x"),
    ("weight_dtype", lambda: (rms_norm, dict(x=_ok(), weight=_ok((8,), torch.float16))), TypeError, "weight"),
    ("weight_shape", lambda: (rms_norm, dict(x=_ok(), weight=_ok((7,)))), ValueError, "weight"),
    ("weight_device", lambda: (rms_norm, dict(x=_ok(), weight=torch.empty(8, device="meta"))), ValueError, "weight"),
    ("eps_zero", lambda: (rms_norm, dict(x=_ok(), weight=_ok((8,)), eps=0.0)), ValueError, "eps"),
    ("eps_nan", lambda: (rms_norm, dict(x=_ok(), weight=_ok((8,)), eps=float("nan"))), ValueError, "eps"),
    ("eps_str", lambda: (rms_norm, dict(x=_ok(), weight=_ok((8,)), eps="1e-6")), TypeError, "eps"),
    ("residual_shape", lambda: (add_rms_norm, dict(x=_ok(), residual=_ok((3, 9)), weight=_ok((8,)))),
     ValueError, "residual"),
    ("residual_dtype", lambda: (add_rms_norm, dict(x=_ok(), residual=_ok(dtype=torch.float16), weight=_ok((8,)))),
     TypeError, "residual"),
    ("residual_not_tensor", lambda: (add_rms_norm, dict(x=_ok(), residual=1.0, weight=_ok((8,)))),
     TypeError, "residual"),
]


@pytest.mark.parametrize("make,exc,name", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_is_refused_naming_the_argument(make, exc, name):
    fn, kwargs = make()
    with pytest.raises(exc, match=rf"\b{name}\b"):
        fn(**kwargs)


def test_empty_batch_follows_the_contract():
    x = torch.empty(0, 5, device=DEVICE)
    assert rms_norm(x, _ok((5,))).shape == (0, 5)
    y, h = add_rms_norm(x, x, _ok((5,)))
    assert y.shape == h.shape == (0, 5)


# ------------------------------------------------------------------------------ forward

FWD_CASES = [
    # N not a power of two, N past one block (64 here), a multiple of it, strided views, dtypes
    ((5, 37), torch.float32, "contiguous"),
    ((3, 200), torch.float32, "transposed"),
    ((4, 3, 70), torch.float32, "permuted"),
    ((3, 45), torch.float32, "step"),
    ((1, 1), torch.float32, "contiguous"),
    ((2, 128), torch.float16, "transposed"),
    ((2, 3, 33), torch.bfloat16, "contiguous"),
    ((3, 150), torch.bfloat16, "step"),
]


@pytest.mark.parametrize("shape,dtype,layout", FWD_CASES, ids=[f"{c[0]}-{str(c[1])[6:]}-{c[2]}" for c in FWD_CASES])
def test_forward_matches_reference(shape, dtype, layout):
    n = shape[-1]
    x = _layout(_rand(shape, dtype, seed=1, scale=3.0), layout)
    r = _layout(_rand(shape, dtype, seed=2), layout)
    w = _rand((2 * n,), dtype, seed=3)[::2]  # a strided weight
    before = [t.clone() for t in (x, r, w)]
    y = rms_norm(x, w)
    assert y.dtype == dtype and y.shape == x.shape
    assert _err(y, refs.rms_norm(_np(x), _np(w))) < BOUND[dtype]
    y2, h = add_rms_norm(x, r, w)
    assert torch.equal(h, x + r) and h.dtype == dtype  # the sum as torch rounds it, bf16 included
    assert _err(y2, refs.rms_norm(_np(h), _np(w))) < BOUND[dtype]
    assert all(torch.equal(a, b) for a, b in zip(before, (x, r, w)))
    for control in (controls.torch_rms_norm_llama, controls.torch_rms_norm_fp32):
        assert _err(control(x, w), refs.rms_norm(_np(x), _np(w))) < BOUND[dtype]


def test_long_rows_take_many_blocks():
    x, w = _rand((2, 1000), seed=4), _rand((1000,), seed=5)
    assert kn.block_n_for(1000, x.device) == 64
    assert _err(rms_norm(x, w), refs.rms_norm(_np(x), _np(w))) < 1e-5


def test_after_weight_rounds_once():
    """The project kernel rounds y once: in fp16 every element is the correctly rounded
    fp32 result of x * rstd * w (the fp32 control's), never the Llama double rounding."""
    x, w = _rand((4, 40), torch.float16, seed=6), _rand((40,), torch.float16, seed=7, scale=3.0)
    fp32, llama = controls.torch_rms_norm_fp32(x, w), controls.torch_rms_norm_llama(x, w)
    y = rms_norm(x, w)
    ulp = torch.finfo(torch.float16).eps * fp32.double().abs().clamp(min=1e-4)
    assert float(((y.double() - fp32.double()).abs() / ulp).max()) <= 1.0
    assert not torch.equal(fp32, llama)  # the two modes differ on this input: the test can tell them apart


def test_references_agree():
    x, w = _rand((3, 11), seed=8).double(), _rand((11,), seed=9).double()
    np.testing.assert_allclose(refs.rms_norm(_np(x), _np(w)), _np(refs.rms_norm_torch(x, w)), rtol=1e-13)


# ------------------------------------------------------------------------------ gradients

def test_gradcheck_torch_references():
    g = torch.Generator().manual_seed(10)
    x, r, w = (torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in ((3, 5), (3, 5), (5,)))
    assert torch.autograd.gradcheck(lambda *a: refs.rms_norm_torch(*a, eps=1e-3), (x, w))
    assert torch.autograd.gradcheck(lambda *a: refs.add_rms_norm_torch(*a, eps=1e-3), (x, r, w))


GRAD_CASES = [
    ((6, 37), torch.float32, "contiguous"),  # 6 rows: 3 groups of 2
    ((2, 3, 100), torch.float32, "permuted"),  # N past one block
    ((5, 40), torch.float16, "transposed"),
]


@pytest.mark.parametrize("shape,dtype,layout", GRAD_CASES, ids=[f"{c[0]}-{str(c[1])[6:]}-{c[2]}" for c in GRAD_CASES])
def test_gradients_match_reference(shape, dtype, layout):
    n = shape[-1]
    x = _layout(_rand(shape, dtype, seed=11), layout).requires_grad_()
    r = _rand(shape, dtype, seed=12).requires_grad_()
    w = _rand((n,), dtype, seed=13).requires_grad_()
    dy, dh = _layout(_rand(shape, dtype, seed=14), "transposed"), _rand(shape, dtype, seed=15)
    y, h = add_rms_norm(x, r, w)
    got = torch.autograd.grad((y, h), (x, r, w), (dy, dh))
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    # the kernel normalises the rounded h: so does this reference
    h64 = (x64 + r64).to(dtype).double() + 0 * (x64 + r64)
    want = torch.autograd.grad((refs.rms_norm_torch(h64, w64), h64), (x64, r64, w64), (dy.double(), dh.double()))
    for a, b in zip(got, want):
        assert a.dtype == dtype and a.shape == b.shape
        assert _err(a, _np(b)) < 10 * BOUND[dtype]
    gx, gw = torch.autograd.grad(rms_norm(x, w), (x, w), dy)
    wx, ww = torch.autograd.grad(refs.rms_norm_torch(x64, w64), (x64, w64), dy.double())
    assert _err(gx, _np(wx)) < 10 * BOUND[dtype] and _err(gw, _np(ww)) < 10 * BOUND[dtype]


def test_deterministic_and_batch_invariant():
    x0, w0, dy = _rand((7, 90), seed=16), _rand((90,), seed=17), _rand((7, 90), seed=18)
    outs = []
    for _ in range(2):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = rms_norm(x, w)
        y.backward(dy)
        outs.append((y.detach(), x.grad, w.grad))
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    assert rms_norm.batch_invariant and torch.equal(rms_norm(x0[2:3], w0)[0], outs[0][0][2])


# ------------------------------------------------------------------------------ mutants

def _fwd_gap(fn, x, w):
    return float((fn(x, w).double() - rms_norm(x, w).double()).abs().nan_to_num(1e9).max())


def _grad_gap(fn, shape):
    x0, w0, dy = _rand(shape, seed=19), _rand(shape[-1:], seed=20), _rand(shape, seed=21)
    grads = []
    for f in (fn, rms_norm):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        grads.append(torch.autograd.grad(f(x, w), (x, w), dy))
    return max(float((a.double() - b.double()).abs().max()) for a, b in zip(*grads))


def _add_gap(fn, dtype=torch.float32, grads=False):
    x0, r0, w0 = _rand((6, 37), dtype, seed=22), _rand((6, 37), dtype, seed=23), _rand((37,), dtype, seed=24)
    dy, dh = _rand((6, 37), dtype, seed=25), _rand((6, 37), dtype, seed=26)
    outs = []
    for f in (fn, add_rms_norm):
        x, r, w = (t.clone().requires_grad_() for t in (x0, r0, w0))
        y, h = f(x, r, w)
        if h.dtype != dtype:
            return float("inf")
        outs.append(torch.autograd.grad((y, h), (x, r, w), (dy, dh)) if grads else (y, h))
    return max(float((a.double() - b.double()).abs().max()) for a, b in zip(*outs))


def _batch_gap(fn, *extra):
    """Elements of y that differ between 5-row calls and each of their rows called alone
    (a sum taken in another order rounds differently in about a third of such rows)."""
    first = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731
    differ = 0
    for seed in range(4):
        rows = [_rand((5, 100), seed=27 + seed)] + [_rand((5, 100), seed=40 + seed) for _ in extra]
        w = _rand((100,), seed=29)
        whole = first(fn(*rows, w))
        differ += sum(int((whole[i] != first(fn(*(t[i:i + 1] for t in rows), w))[0]).sum()) for i in range(5))
    return float(differ)


_PAST_ONE_BLOCK = (norms_kernels.MAX_BLOCK_N_CUDA if DEVICE.type == "cuda" else norms_kernels.MAX_BLOCK_N_INTERPRET) + 36
MUTANT_TRIGGERS = {
    "rstd_without_eps": (lambda f: _fwd_gap(f, _rand((3, 37), seed=30, scale=1e-4), _rand((37,), seed=31)), 0.1),
    "mean_over_n_minus_1": (lambda f: _fwd_gap(f, _rand((3, 4), seed=32), _rand((4,), seed=33)), 0.1),
    "dweight_first_group_only": (lambda f: _grad_gap(f, (6, 37)), 0.1),
    "cast_before_weight": (lambda f: _fwd_gap(f, _rand((4, 40), torch.float16, seed=34),
                                              _rand((40,), torch.float16, seed=35, scale=3.0)), 1e-4),
    "eps_outside_sqrt": (lambda f: _fwd_gap(f, _rand((3, 37), seed=36, scale=1e-3), _rand((37,), seed=37)), 1e-3),
    # rows past one column block: the GPU's blocks hold 4096 columns, the interpreter's 64
    "weight_at_block_offset": (lambda f: _fwd_gap(f, _rand((2, _PAST_ONE_BLOCK), seed=38),
                                                 _rand((_PAST_ONE_BLOCK,), seed=39)), 0.1),
    "batch_dependent_block": (lambda f: _batch_gap(f), 0.5),
    "add_residual_returned_in_fp32": (lambda f: _add_gap(f, torch.float16), 1.0),
    "add_dresidual_missing_dh": (lambda f: _add_gap(f, grads=True), 0.1),
    "add_batch_dependent_block": (lambda f: _batch_gap(f, "residual"), 0.5),
    "add_dweight_first_group_only": (lambda f: _add_gap(f, grads=True), 0.1),
}


def test_every_mutant_has_a_trigger():
    names = {m.name for m in vars(mutants).values() if isinstance(m, Mutant)}
    assert names == set(MUTANT_TRIGGERS)
    assert all(getattr(mutants, n).op in ("rms_norm", "add_rms_norm") for n in names)


@pytest.mark.parametrize("name", sorted(MUTANT_TRIGGERS))
def test_mutant_differs_on_trigger(name, monkeypatch):
    monkeypatch.undo()  # the mutants carry the default caps: compare with the kernel's defaults
    gap, threshold = MUTANT_TRIGGERS[name]
    assert gap(getattr(mutants, name)) > threshold


# ------------------------------------------------------------------------------ declared cast

def test_the_declared_cast_decides_the_tolerance():
    """The Llama control passes as declared ("before_weight") and fails the same check
    when it claims one rounding ("after_weight"): the allowance follows the declaration."""
    from tritoncheck import registry, selfcheck

    op = registry.load()["rms_norm"]
    check = next(c for c in op.checks if c.name == "matches_reference")

    def llama_claiming_one_rounding(x, weight, eps=1e-6):
        return controls.torch_rms_norm_llama(x, weight, eps)
    llama_claiming_one_rounding.rms_norm_cast = "after_weight"

    honest = registry.Implementation.of("rms_norm", controls.torch_rms_norm_llama, kind="control")
    wrong = registry.Implementation.of("rms_norm", llama_claiming_one_rounding, kind="control")
    assert not selfcheck.hunt(op, honest, check, torch.float16, 30).failed
    assert selfcheck.hunt(op, wrong, check, torch.float16, 30).failed
