"""Smoke tests of fused linear cross-entropy: kernel, references, controls, mutants.

Fast (Triton interpreter on CPU, or the GPU when the suite's backend picks it). The
suite's derived rules and properties do the real checking; the bounds here are loose
fixed bounds that catch a broken kernel, not a slightly inaccurate one.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tritoncheck import backend
from tritoncheck.controls import linear_cross_entropy as controls
from tritoncheck.kernels import linear_cross_entropy as kl
from tritoncheck.kernels.linear_cross_entropy import linear_cross_entropy
from tritoncheck.mutants import linear_cross_entropy as mutants
from tritoncheck.mutation import Mutant
from tritoncheck.references import linear_cross_entropy as refs

# the plugin chose the backend (TRITON_INTERPRET) before this module was imported
DEVICE = backend.device()

# Loose smoke bounds on max |got - ref| / (1 + max |ref|): the kernel works in fp32 for every
# dtype; the gradients are stored in the input dtype (bf16: the interpreter truncates).
BOUND = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _rand(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tuple(shape), generator=g) * scale).to(dtype).to(DEVICE)


def _targets(n, v, seed=0, ignored=(), ignore_index=-100):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, v, (n,), generator=g)
    t[list(ignored)] = ignore_index
    return t.to(DEVICE)


def _gap(got, want) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).abs().max() / (1 + want.abs().max()))


def _ref_with_grads(x, w, t, dloss, **kw):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    loss = refs.linear_cross_entropy_torch(x64, w64, t, **kw)
    return (loss.detach(), *torch.autograd.grad(loss, (x64, w64), dloss.double()))


# ------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("change, exc, name", [
    (lambda a: {**a, "x": a["x"].tolist()}, TypeError, "x"),
    (lambda a: {**a, "weight": a["weight"].half()}, TypeError, "weight"),
    (lambda a: {**a, "weight": a["weight"][:, :3]}, ValueError, "weight"),
    (lambda a: {**a, "target": a["target"].int()}, TypeError, "target"),
    (lambda a: {**a, "target": a["target"][:2]}, ValueError, "target"),
    (lambda a: {**a, "target": torch.full_like(a["target"], 9)}, ValueError, "target"),
    (lambda a: {**a, "softcap": -1.0}, ValueError, "softcap"),
    (lambda a: {**a, "softcap": math.nan}, ValueError, "softcap"),
    (lambda a: {**a, "reduction": "avg"}, ValueError, "reduction"),
    (lambda a: {**a, "ignore_index": 1.5}, TypeError, "ignore_index"),
    (lambda a: {**a, "chunk_size": 48}, ValueError, "chunk_size"),
])
def test_bad_input_is_refused_naming_the_argument(change, exc, name):
    valid = {"x": _rand((4, 5)), "weight": _rand((9, 5), seed=1), "target": _targets(4, 9)}
    with pytest.raises(exc, match=name):
        linear_cross_entropy(**change(valid))


def test_empty_batch_follows_the_contract():
    x = _rand((0, 5)).requires_grad_()
    w = _rand((9, 5), seed=1).requires_grad_()
    t = _targets(0, 9)
    assert linear_cross_entropy(x, w, t, reduction="none").shape == (0,)
    assert float(linear_cross_entropy(x, w, t, reduction="sum").detach()) == 0.0
    loss = linear_cross_entropy(x, w, t)  # mean over no row: 0 / 0
    assert math.isnan(float(loss.detach()))
    dx, dw = torch.autograd.grad(linear_cross_entropy(x, w, t, reduction="sum"), (x, w))
    assert dx.shape == (0, 5) and torch.equal(dw, torch.zeros_like(dw))


# ------------------------------------------------------------------------------ values

CASES = [  # (N, H, V): one block of each; rows, vocabulary chunks and hidden slices past one
    (3, 5, 7), (17, 33, 70), (20, 40, 129),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n, h, v", CASES)
@pytest.mark.parametrize("softcap, reduction", [(0.0, "mean"), (2.0, "none"), (0.0, "sum")])
def test_loss_and_gradients_match_reference(n, h, v, dtype, softcap, reduction):
    x = _rand((n, h), dtype, seed=2).requires_grad_()
    w = _rand((v, h), dtype, seed=3, scale=0.5).requires_grad_()
    t = _targets(n, v, seed=4, ignored=(1,))
    kw = {"softcap": softcap, "reduction": reduction}
    loss = linear_cross_entropy(x, w, t, **kw)
    assert loss.dtype == torch.float32 and loss.shape == ((n,) if reduction == "none" else ())
    dloss = _rand(loss.shape, seed=5)
    dx, dw = torch.autograd.grad(loss, (x, w), dloss)
    want, want_dx, want_dw = _ref_with_grads(x, w, t, dloss, **kw)
    assert _gap(loss, want) < 1e-5
    assert dx.dtype == dtype and dw.dtype == dtype
    assert _gap(dx, want_dx) < BOUND[dtype] and _gap(dw, want_dw) < BOUND[dtype]
    assert torch.equal(dx[1], torch.zeros_like(dx[1]))  # the ignored row


def test_strided_inputs_are_read_in_place():
    x = _rand((9, 40), seed=6).T.contiguous().T  # column-major
    w = torch.zeros((50, 80), device=DEVICE)
    w[:, ::2] = _rand((50, 40), seed=7)
    w = w[:, ::2]
    t = _targets(9, 50, seed=8)
    assert _gap(linear_cross_entropy(x, w, t), refs.linear_cross_entropy_torch(x, w, t)) < 1e-5


def test_every_row_ignored_under_mean_is_nan_with_zero_gradients():
    x, w = _rand((3, 5)).requires_grad_(), _rand((9, 5), seed=1).requires_grad_()
    t = _targets(3, 9, ignored=(0, 1, 2))
    loss = linear_cross_entropy(x, w, t)
    assert math.isnan(float(loss)) and math.isnan(float(F.cross_entropy(x @ w.T, t)))
    dx, dw = torch.autograd.grad(loss, (x, w))
    assert not dx.any() and not dw.any()


def test_chunk_sizes_agree_and_are_deterministic():
    x, w = _rand((18, 20), seed=9), _rand((150, 20), seed=10)
    t = _targets(18, 150, seed=11, ignored=(3,))
    losses = [linear_cross_entropy(x, w, t, reduction="none", chunk_size=c) for c in kl.CHUNK_SIZES]
    assert all(_gap(a, losses[0]) < 1e-6 for a in losses[1:])
    assert torch.equal(linear_cross_entropy(x, w, t, reduction="none"), linear_cross_entropy(x, w, t, reduction="none"))


def test_references_agree():
    x, w = _rand((6, 8), seed=12).cpu().double(), _rand((20, 8), seed=13).cpu().double()
    t = _targets(6, 20, seed=14, ignored=(2,)).cpu()
    for softcap in (0.0, 3.0):
        for reduction in ("mean", "sum", "none"):
            a = refs.linear_cross_entropy(x.numpy(), w.numpy(), t.numpy(), -100, softcap, reduction)
            b = refs.linear_cross_entropy_torch(x, w, t, -100, softcap, reduction).numpy()
            c = F.cross_entropy(torch.from_numpy(refs.logits(x.numpy(), w.numpy(), softcap)), t, reduction=reduction)
            assert np.allclose(a, b, rtol=1e-13, atol=1e-13) and np.allclose(a, c.numpy(), rtol=1e-12, atol=1e-12)


def test_gradcheck_torch_reference():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 5, -100, 2])
    assert torch.autograd.gradcheck(lambda a, b: refs.linear_cross_entropy_torch(a, b, t, softcap=2.0), (x, w))


@pytest.mark.parametrize("control", [controls.torch_linear_cross_entropy, controls.chunked_torch_linear_cross_entropy])
def test_controls_agree_with_the_kernel(control):
    x, w = _rand((7, 12), seed=15), _rand((70, 12), seed=16)
    t = _targets(7, 70, seed=17, ignored=(0,))
    for reduction in ("mean", "none"):
        assert _gap(control(x, w, t, softcap=4.0, reduction=reduction),
                    linear_cross_entropy(x, w, t, softcap=4.0, reduction=reduction)) < 1e-5


# ------------------------------------------------------------------------------ mutants

# the mutants' triggers need N past one row block and V past two vocabulary chunks of the
# backend in use (16 x 32 interpreted, 64 x 128 on a GPU): sizes just past them, not fixed
# ones (at N = 20, V = 70 a GPU's single block hid three planted bugs)
_BLOCK_N, _, _BLOCK_V = kl._blocks(torch.device(DEVICE))
TRIGGER_N, TRIGGER_V = _BLOCK_N + 4, 2 * _BLOCK_V + 6


def _loss_gap(fn, n=TRIGGER_N, v=TRIGGER_V, softcap=0.0, reduction="mean", ignored=(1,)):
    x, w = _rand((n, 12), seed=18), _rand((v, 12), seed=19)
    t = _targets(n, v, seed=20, ignored=ignored)
    return _gap(fn(x, w, t, softcap=softcap, reduction=reduction), linear_cross_entropy(x, w, t, softcap=softcap,
                                                                                        reduction=reduction))


def _grad_gap(fn, n=TRIGGER_N, v=TRIGGER_V, softcap=0.0):
    x0, w0 = _rand((n, 12), seed=21), _rand((v, 12), seed=22, scale=2.0)
    t = _targets(n, v, seed=23, ignored=(2,))
    grads = []
    for f in (fn, linear_cross_entropy):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        grads.append(torch.autograd.grad(f(x, w, t, softcap=softcap, reduction="sum"), (x, w)))
    return max(_gap(a, b) for a, b in zip(*grads))


def _input_changed(fn):
    x, w, t = _rand((4, 6), seed=24), _rand((9, 6), seed=25), _targets(4, 9, seed=26)
    before = x.clone()
    fn(x, w, t)
    return float(not torch.equal(before, x))


def _second_call_differs(fn):
    x, w, t = _rand((5, 6), seed=27), _rand((100, 6), seed=28, scale=3.0), _targets(5, 100, seed=29)
    return float(sum(not torch.equal(fn(x, w, t, reduction="none"), fn(x, w, t, reduction="none")) for _ in range(3)))


def _second_backward_differs(fn):
    x, w = _rand((5, 6), seed=30).requires_grad_(), _rand((40, 6), seed=31).requires_grad_()
    loss = fn(x, w, _targets(5, 40, seed=32), reduction="sum")
    first = [g.clone() for g in torch.autograd.grad(loss, (x, w), retain_graph=True)]  # dx may alias x
    return max(_gap(a, b) for a, b in zip(first, torch.autograd.grad(loss, (x, w))))


MUTANT_TRIGGERS = {
    "dweight_last_row_block_only": (lambda f: _grad_gap(f, n=2 * _BLOCK_N + 8), 0.01),
    "chunk_boundary_overlap": (lambda f: _loss_gap(f), 1e-3),
    "ignored_rows_in_mean": (lambda f: _loss_gap(f, ignored=(1, 2, 3)), 1e-3),
    "softcap_missing_in_backward": (lambda f: _grad_gap(f, softcap=1.0), 0.01),
    "softcap_missing_in_forward": (lambda f: _loss_gap(f, softcap=1.0), 1e-3),
    "ignored_rows_in_backward": (lambda f: _grad_gap(f), 0.01),
    "target_logit_modulo_chunk": (lambda f: _loss_gap(f), 1e-3),
    "lse_into_input": (_input_changed, 0.5),
    "chunk_flips_per_call": (_second_call_differs, 0.5),
    "dx_over_saved_x": (_second_backward_differs, 0.01),
}


def test_every_mutant_has_a_trigger():
    names = {m.name for m in vars(mutants).values() if isinstance(m, Mutant)}
    assert names == set(MUTANT_TRIGGERS)


@pytest.mark.parametrize("name", sorted(MUTANT_TRIGGERS))
def test_mutant_differs_on_trigger(name):
    gap, threshold = MUTANT_TRIGGERS[name]
    assert gap(getattr(mutants, name)) > threshold
