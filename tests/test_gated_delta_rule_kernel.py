"""Fast self-tests of the gated delta rule: kernel, references, controls, mutants.

Smoke-level bounds only (fixed, loose); the derived tolerances and Hypothesis properties
live in ``properties/``. Runs on CUDA when there is a GPU, otherwise under the Triton
interpreter (CPU tensors), sizes kept small there.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritoncheck import backend
from tritoncheck.controls import gated_delta_rule as C
from tritoncheck.kernels import gated_delta_rule as K
from tritoncheck.references import gated_delta_rule as R

DEVICE = backend.device()
ON_GPU = backend.current() == "cuda"
# loose smoke bounds relative to max |reference| (bf16 under the interpreter truncates on store)
BOUND = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _inputs(B, T, H, Kd, Vd, dtype=torch.float32, seed=0, decay=0.5, initial=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, Kd, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, Kd, generator=gen), dim=-1)
    v = torch.randn(B, T, H, Vd, generator=gen)
    g = -torch.rand(B, T, H, generator=gen) * decay
    beta = torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, Kd, Vd, generator=gen) if initial else None
    out = [t.to(dtype).to(DEVICE) for t in (q, k, v, g, beta)]
    return (*out, None if h0 is None else h0.to(DEVICE))


def _np(t):
    return t.detach().to("cpu", torch.float64).numpy()


def _assert_close(got, want, dtype, what=""):
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(_np(got) - want).max()) / scale
    assert err <= BOUND[dtype], f"{what}: max error {err:.3g} x scale > {BOUND[dtype]:.3g}"


def _reference(q, k, v, g, beta, scale=None, h0=None, cu=None):
    return R.gated_delta_rule(*(_np(t) for t in (q, k, v, g, beta)), scale, None if h0 is None else _np(h0),
                              None if cu is None else cu.cpu())


# ---------------------------------------------------------------- validation


def _good():
    return _inputs(1, 8, 2, 16, 16)


@pytest.mark.parametrize("change, exc, word", [
    (lambda a: {**a, "q": a["q"].numpy() if not ON_GPU else 1.0}, TypeError, "q"),
    (lambda a: {**a, "k": a["k"].double()}, TypeError, "k"),
    (lambda a: {**a, "v": a["v"].half()}, TypeError, "dtype"),
    (lambda a: {**a, "g": a["g"][..., :1]}, ValueError, "g"),
    (lambda a: {**a, "beta": a["beta"].int()}, TypeError, "beta"),
    (lambda a: {**a, "k": a["k"][:, :4]}, ValueError, "k"),
    (lambda a: {**a, "scale": -1.0}, ValueError, "scale"),
    (lambda a: {**a, "initial_state": a["initial_state"].half()}, TypeError, "initial_state"),
    (lambda a: {**a, "initial_state": a["initial_state"][:, :1]}, ValueError, "initial_state"),
    (lambda a: {**a, "cu_seqlens": torch.tensor([0, 3, 2, 8], device=DEVICE)}, ValueError, "cu_seqlens"),
    (lambda a: {**a, "cu_seqlens": torch.tensor([0.0, 8.0], device=DEVICE)}, TypeError, "cu_seqlens"),
    (lambda a: {**a, "chunk_size": 48}, ValueError, "chunk_size"),
])
def test_validation(change, exc, word):
    q, k, v, g, beta, h0 = _good()
    args = change({"q": q, "k": k, "v": v, "g": g, "beta": beta, "scale": None, "initial_state": h0})
    with pytest.raises(exc, match=word):
        K.gated_delta_rule(**args)


def test_head_dim_limits_and_empty():
    q, k, v, g, beta, _ = _inputs(1, 4, 1, 16, 16)
    with pytest.raises(ValueError, match="K"):
        K.gated_delta_rule(*(torch.zeros(1, 4, 1, 129, device=DEVICE),) * 2, v, g, beta)
    q, k, v, g, beta, h0 = _inputs(2, 0, 1, 16, 8)
    o, f = K.gated_delta_rule(q, k, v, g, beta, initial_state=h0)
    assert o.shape == (2, 0, 1, 8) and torch.equal(f, h0) and f.dtype == torch.float32


# ---------------------------------------------------------------- references


@pytest.mark.parametrize("T", [1, 5, 70])
def test_reference_forms_agree(T):
    q, k, v, g, beta, h0 = (t.double().cpu() for t in _inputs(2, T, 3, 8, 5, seed=T))
    o, f = R.gated_delta_rule(q.numpy(), k.numpy(), v.numpy(), g.numpy(), beta.numpy(), 0.7, h0.numpy())
    for form in (R.gated_delta_rule_torch, lambda *a: R.gated_delta_rule_chunked_torch(*a, chunk=16)):
        o2, f2 = form(q, k, v, g, beta, 0.7, h0)
        np.testing.assert_allclose(o2.numpy(), o, rtol=0, atol=1e-12)
        np.testing.assert_allclose(f2.numpy(), f, rtol=0, atol=1e-12)


def test_reference_closed_forms():
    """beta = 0: the initial state decayed; one token from zero: o = scale (q . k) beta v."""
    q, k, v, g, beta, h0 = (t.double().cpu().numpy() for t in _inputs(1, 6, 2, 8, 4))
    o, f = R.gated_delta_rule(q, k, v, g, np.zeros_like(beta), None, h0)
    decay = np.exp(np.cumsum(g[0], axis=0))  # [T, H]
    np.testing.assert_allclose(f[0], decay[-1][:, None, None] * h0[0], rtol=1e-14)
    np.testing.assert_allclose(o[0], 8 ** -0.5 * decay[..., None] * np.einsum("thk,hkv->thv", q[0], h0[0]), rtol=1e-12)
    o, _ = R.gated_delta_rule(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1])
    want = 8 ** -0.5 * (q[0, 0] * k[0, 0]).sum(-1)[:, None] * beta[0, 0][:, None] * v[0, 0]
    np.testing.assert_allclose(o[0, 0], want, rtol=1e-12)


def test_packed_reference_is_separate_sequences():
    q, k, v, g, beta, _ = (t.double().cpu().numpy() if t is not None else None for t in _inputs(1, 30, 2, 8, 4))
    h0 = np.random.default_rng(0).standard_normal((3, 2, 8, 4))
    cu = [0, 7, 7, 30]
    o, f = R.gated_delta_rule(q, k, v, g, beta, None, h0, cu)
    for n, (a, b) in enumerate(zip(cu, cu[1:])):
        o2, f2 = R.gated_delta_rule(*(x[:, a:b] for x in (q, k, v, g, beta)), None, h0[n:n + 1])
        np.testing.assert_array_equal(o[:, a:b], o2)
        np.testing.assert_array_equal(f[n], f2[0])


# ---------------------------------------------------------------- kernel vs reference

CASES = [  # B, T, H, K, V, dtype, layout
    (1, 1, 1, 16, 16, torch.float32, "contiguous"),
    (2, 17, 1, 20, 33, torch.float32, "strided"),
    (1, 70, 2, 16, 32, torch.float32, "contiguous"),  # past the default chunk
    (1, 33, 1, 32, 16, torch.float16, "strided"),
    (1, 24, 1, 16, 16, torch.bfloat16, "contiguous"),
    (1, 40, 1, 100, 16, torch.float32, "contiguous"),  # K past 64: chunks capped at 32
]


def _strided(t):
    big = torch.full((*t.shape[:-1], 2 * t.shape[-1] + 1), float("nan"), dtype=t.dtype, device=t.device)
    view = big[..., 1::2][..., :t.shape[-1]]
    view.copy_(t)
    return view


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}x{c[3]}x{c[4]}-{str(c[5])[6:]}-{c[6]}")
def test_matches_reference(case):
    B, T, H, Kd, Vd, dtype, layout = case
    q, k, v, g, beta, h0 = _inputs(B, T, H, Kd, Vd, dtype, seed=T)
    if layout == "strided":
        q, v = _strided(q), _strided(v)
    before = [t.clone() for t in (q, k, v, g, beta, h0)]
    o, f = K.gated_delta_rule(q, k, v, g, beta, None, h0)
    ro, rf = _reference(q, k, v, g, beta, None, h0)
    assert o.dtype == dtype and o.shape == (B, T, H, Vd) and f.dtype == torch.float32
    _assert_close(o, ro, dtype, f"o {case}")
    _assert_close(f, rf, dtype, f"final state {case}")
    for t, t0 in zip((q, k, v, g, beta, h0), before):
        assert torch.equal(t.nan_to_num(), t0.nan_to_num())
    if T > 16:  # every chunk size
        for c in K.gated_delta_rule.chunk_sizes:
            _assert_close(K.gated_delta_rule(q, k, v, g, beta, None, h0, chunk_size=c)[0], ro, dtype, f"chunk {c}")


def test_packed_sequences():
    q, k, v, g, beta, _ = _inputs(1, 40, 2, 16, 16)
    h0 = torch.randn(4, 2, 16, 16, device=DEVICE)
    cu = torch.tensor([0, 17, 17, 18, 40], dtype=torch.int64, device=DEVICE)
    o, f = K.gated_delta_rule(q, k, v, g, beta, 0.5, h0, cu, chunk_size=16)
    ro, rf = _reference(q, k, v, g, beta, 0.5, h0, cu)
    _assert_close(o, ro, torch.float32, "packed o")
    _assert_close(f, rf, torch.float32, "packed final")
    assert torch.equal(f[1], h0[1])  # a zero-length sequence keeps its state bit for bit


def test_strong_decay_and_zero_keys():
    """g down to -1000 (exp underflows within a token) and zero key rows stay finite and right."""
    q, k, v, g, beta, h0 = _inputs(1, 40, 1, 16, 16, decay=1000.0)
    k[:, ::3] = 0.0
    o, f = K.gated_delta_rule(q, k, v, g, beta, None, h0, chunk_size=16)
    ro, rf = _reference(q, k, v, g, beta, None, h0)
    assert torch.isfinite(o).all() and torch.isfinite(f).all()
    _assert_close(o, ro, torch.float32, "strong decay")


def test_gradients_match_fp64_autograd():
    xs = [t.clone().requires_grad_(True) for t in _inputs(1, 20, 2, 16, 16)]
    o, f = K.gated_delta_rule(*xs[:5], None, xs[5], chunk_size=16)
    gen = torch.Generator().manual_seed(9)
    do, dft = torch.randn(o.shape, generator=gen).to(DEVICE), torch.randn(f.shape, generator=gen).to(DEVICE)
    got = torch.autograd.grad([o, f], xs, [do, dft])
    x64 = [t.detach().double().requires_grad_(True) for t in xs]
    o2, f2 = R.gated_delta_rule_torch(*x64[:5], None, x64[5])
    want = torch.autograd.grad([o2, f2], x64, [do.double(), dft.double()])
    for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), got, want):
        _assert_close(a, _np(b), torch.float32, f"d{name}")


def test_controls_match_reference():
    q, k, v, g, beta, h0 = _inputs(1, 37, 2, 16, 8)
    ro, rf = _reference(q, k, v, g, beta, None, h0)
    for fn in (C.torch_gated_delta_rule_recurrent, lambda *a: C.torch_gated_delta_rule_chunked(*a, chunk_size=16)):
        o, f = fn(q, k, v, g, beta, None, h0)
        _assert_close(o, ro, torch.float32, "control o")
        _assert_close(f, rf, torch.float32, "control final")


@pytest.mark.skipif(not ON_GPU, reason="2**17 tokens: minutes under the interpreter; a GPU check")
def test_past_2_17_tokens():
    """One sequence of 2**17 + 5 tokens (2049 chunks): the last chunk's outputs and the final
    state against the fp64 chunked reference (SSD went wrong past ~61K tokens,
    state-spaces/mamba#1015)."""
    q, k, v, g, beta, h0 = _inputs(1, 2**17 + 5, 2, 16, 16, torch.bfloat16, decay=0.01)
    o, f = K.gated_delta_rule(q, k, v, g, beta, None, h0)
    ro, rf = R.gated_delta_rule_chunked_torch(q, k, v, g, beta, None, h0)
    _assert_close(o[:, -70:], _np(ro[:, -70:]), torch.bfloat16, "o past 2**17 tokens")
    _assert_close(f, _np(rf), torch.bfloat16, "final state past 2**17 tokens")


# ---------------------------------------------------------------- mutants


def _mutants():
    from tritoncheck.mutants import gated_delta_rule as M
    return {m.name: m for m in M.MUTANTS}


@pytest.mark.parametrize("name", ["state_carried_without_decay", "chunk_last_token_dropped",
                                  "exclusive_intra_chunk_mask", "initial_state_ignored", "beta_on_wrong_side",
                                  "first_sequence_state_for_all"])
def test_mutant_builds_and_differs(name):
    m = _mutants()[name]
    assert m.kills and m.bug
    q, k, v, g, beta, _ = _inputs(1, 20, 1, 16, 16)
    h0 = torch.randn(1, 1, 16, 16, device=DEVICE)
    args, kw = (q, k, v, g, beta, None, h0), {"chunk_size": 16}
    if name == "first_sequence_state_for_all":
        args = (q, k, v, g, beta, None, torch.randn(2, 1, 16, 16, device=DEVICE),
                torch.tensor([0, 9, 20], device=DEVICE))
    good, bad = K.gated_delta_rule(*args, **kw), m(*args, **kw)
    assert not all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(good, bad)), name
