"""Fast self-tests of the linear_attention family: kernels, references, controls, mutants.

Smoke-level bounds only (fixed, loose); the suite's derived tolerances and Hypothesis
properties live in ``properties/``. Runs on CUDA when there is a GPU, otherwise under the
Triton interpreter (CPU tensors).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritoncheck import backend
from tritoncheck.controls import linear_attention as C
from tritoncheck.kernels import linear_attention as K
from tritoncheck.references import linear_attention as R

INTERPRET = backend.current() == "interpret"
# the plugin chose the backend (TRITON_INTERPRET) before this module was imported
DEVICE = backend.device()
# loose smoke bounds, relative to max |reference| (bf16 under the interpreter truncates on store)
BOUND = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def _features(shape, dtype, gen, scale=1.0):
    """Non-negative features elu(x) + 1 of normal x, rounded to dtype."""
    x = torch.randn(shape, generator=gen) * scale
    return (torch.nn.functional.elu(x.double()) + 1).to(dtype).to(DEVICE)


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``t`` in a non-contiguous layout."""
    if layout == "contiguous":
        return t
    if layout == "transposed":  # storage [B, H, D, N], viewed as [B, H, N, D]
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided":  # every other token and feature of a bigger tensor, plus an offset
        B, H, N, D = t.shape
        big = torch.full((B, H, 2 * N + 1, 2 * D + 1), float("nan"), dtype=t.dtype, device=t.device)
        view = big[:, :, 1::2, 1::2][:, :, :N, :D]
        view.copy_(t)
        return view
    if layout == "heads_swapped":  # storage [B, N, H, D] (the usual projection layout)
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    raise ValueError(layout)


def _qkv(B, H, N, D, DV, dtype, seed=0, layout="contiguous"):
    gen = torch.Generator().manual_seed(seed)
    q = _features((B, H, N, D), dtype, gen)
    k = _features((B, H, N, D), dtype, gen)
    v = torch.randn((B, H, N, DV), generator=gen).to(dtype).to(DEVICE)
    return _layout(q, layout), _layout(k, layout), _layout(v, layout)


def _assert_close(out: torch.Tensor, ref: np.ndarray, dtype, what=""):
    got = _np(out)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    scale = max(float(np.abs(ref).max()), 1e-30)
    err = float(np.abs(got - ref).max()) / scale
    assert err <= BOUND[dtype], f"{what}: max error {err:.3g} x scale > {BOUND[dtype]:.3g}"


# ---------------------------------------------------------------- validation


def _good():
    return _qkv(1, 2, 8, 16, 16, torch.float32)


@pytest.mark.parametrize(
    "change, exc, word",
    [
        (lambda q, k, v: (q.numpy() if INTERPRET else 1.0, k, v, {}), TypeError, "q"),
        (lambda q, k, v: (q, k.double(), v, {}), TypeError, "k"),
        (lambda q, k, v: (q, k, v.half(), {}), TypeError, "dtype"),
        (lambda q, k, v: (q[0], k, v, {}), ValueError, "q"),
        (lambda q, k, v: (q, k[:, :, :4], v, {}), ValueError, "k"),
        (lambda q, k, v: (q, k, v[:, :1], {}), ValueError, "v"),
        (lambda q, k, v: (q, k, v, {"eps": 0.0}), ValueError, "eps"),
        (lambda q, k, v: (q, k, v, {"eps": -1e-6}), ValueError, "eps"),
        (lambda q, k, v: (q, k, v, {"eps": float("nan")}), ValueError, "eps"),
        (lambda q, k, v: (q, k, v, {"causal": True, "chunk_size": 48}), ValueError, "chunk_size"),
        (lambda q, k, v: (q, k, v, {"chunk_size": 128}), ValueError, "chunk_size"),
        (lambda q, k, v: (q, k, v, {"causal": "yes"}), TypeError, "causal"),
    ],
)
def test_linear_attention_validation(change, exc, word):
    q, k, v, kw = change(*_good())
    with pytest.raises(exc, match=word):
        K.linear_attention(q, k, v, **kw)


def test_linear_attention_head_dim_limits():
    gen = torch.Generator().manual_seed(0)
    q = _features((1, 1, 4, 129), torch.float32, gen)
    with pytest.raises(ValueError, match="D"):
        K.linear_attention(q, q, q[..., :16])
    q = _features((1, 1, 4, 16), torch.float32, gen)
    with pytest.raises(ValueError, match="Dv"):
        K.linear_attention(q, q, torch.zeros(1, 1, 4, 0, device=DEVICE))


def test_feature_map_validation():
    with pytest.raises(TypeError, match="x"):
        K.elu_feature_map([1.0, 2.0])
    with pytest.raises(TypeError, match="x"):
        K.elu_feature_map(torch.zeros(3, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_empty(causal):
    q, k, v = _qkv(1, 2, 0, 16, 24, torch.float32)
    o = K.linear_attention(q, k, v, causal=causal)
    assert o.shape == (1, 2, 0, 24) and o.dtype == torch.float32


# ---------------------------------------------------------------- references


@pytest.mark.parametrize("N", [1, 5, 37])
def test_reference_forms_agree(N):
    rng = np.random.default_rng(N)
    q = R.elu_feature_map(rng.normal(size=(2, 3, N, 8)))
    k = R.elu_feature_map(rng.normal(size=(2, 3, N, 8)))
    v = rng.normal(size=(2, 3, N, 5))
    cum = R.linear_attention_causal_cumsum(q, k, v)
    rec = R.linear_attention_causal_recurrent(q, k, v)
    bi = R.linear_attention_bidirectional(q, k, v)
    np.testing.assert_allclose(cum, rec, rtol=0, atol=1e-10)
    np.testing.assert_allclose(cum[:, :, -1], bi[:, :, -1], rtol=0, atol=1e-10)
    np.testing.assert_array_equal(R.linear_attention(q, k, v, causal=True), cum)
    np.testing.assert_array_equal(R.linear_attention(q, k, v), bi)
    # bidirectional by brute force: o_i = sum_j (q_i . k_j) v_j / (sum_j q_i . k_j + eps)
    w = np.einsum("bhid,bhjd->bhij", q, k)
    brute = np.einsum("bhij,bhje->bhie", w, v) / (w.sum(-1) + 1e-6)[..., None]
    np.testing.assert_allclose(bi, brute, rtol=0, atol=1e-10)


def test_feature_map_references_agree():
    x = np.array([-1e308, -800.0, -30.0, -1.0, -1e-300, 0.0, 1e-300, 1.0, 30.0, 1e308, np.inf, -np.inf])
    y = R.elu_feature_map(x)
    yt = R.elu_feature_map_torch(torch.tensor(x)).numpy()
    np.testing.assert_array_equal(y, yt)
    assert np.isnan(R.elu_feature_map(np.nan)) and torch.isnan(R.elu_feature_map_torch(torch.tensor(np.nan)))
    xt = torch.tensor([-2.0, 0.0, 3.0], dtype=torch.float64, requires_grad=True)
    R.elu_feature_map_torch(xt).sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), [np.exp(-2.0), 1.0, 1.0], rtol=1e-15)


# ---------------------------------------------------------------- kernel vs reference

CASES = [
    # B, H, N, D, DV, dtype, layout
    (1, 1, 1, 16, 16, torch.float32, "contiguous"),
    (1, 2, 65, 16, 32, torch.float32, "contiguous"),  # just past the default chunk (64)
    (2, 1, 17, 20, 33, torch.float32, "transposed"),  # padded head dims, just past chunk 16
    (1, 2, 40, 16, 32, torch.float32, "strided"),
    (2, 2, 33, 32, 16, torch.float16, "heads_swapped"),
    (1, 1, 70, 64, 64, torch.float16, "strided"),
    (1, 2, 30, 16, 16, torch.bfloat16, "transposed"),
    (1, 1, 9, 128, 128, torch.float32, "contiguous"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}x{c[3]}x{c[4]}-{str(c[5])[6:]}-{c[6]}")
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_linear_attention_matches_reference(case, causal):
    B, H, N, D, DV, dtype, layout = case
    q, k, v = _qkv(B, H, N, D, DV, dtype, seed=N, layout=layout)
    before = [t.clone() for t in (q, k, v)]
    o = K.linear_attention(q, k, v, causal=causal)
    assert o.dtype == dtype and o.shape == (B, H, N, DV) and o.device == q.device
    ref = R.linear_attention(_np(q), _np(k), _np(v), causal=causal)
    _assert_close(o, ref, dtype, f"{case} causal={causal}")
    for t, t0 in zip((q, k, v), before):  # inputs unchanged
        assert torch.equal(t, t0)
    if causal:  # every chunk size, too (N past the chunk for some of them)
        for c in K.linear_attention.chunk_sizes:
            _assert_close(K.linear_attention(q, k, v, causal=True, chunk_size=c), ref, dtype, f"chunk {c}")


def test_chunk_sizes_agree_and_deterministic():
    q, k, v = _qkv(1, 2, 100, 16, 16, torch.float32, seed=3)
    outs = [K.linear_attention(q, k, v, causal=True, chunk_size=c) for c in K.linear_attention.chunk_sizes]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(K.linear_attention(q, k, v, causal=True), K.linear_attention(q, k, v, causal=True))
    assert torch.equal(K.linear_attention(q, k, v), K.linear_attention(q, k, v))


def test_last_causal_row_equals_bidirectional():
    q, k, v = _qkv(2, 1, 77, 16, 16, torch.float32, seed=5)
    oc = K.linear_attention(q, k, v, causal=True)
    ob = K.linear_attention(q, k, v, causal=False)
    torch.testing.assert_close(oc[:, :, -1], ob[:, :, -1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("future", ["finite", "inf", "nan"])
def test_causal_future_does_not_change_past(future):
    """o_i is bitwise unchanged when k, v at j > i change, even to inf/NaN in the same chunk."""
    q, k, v = _qkv(1, 1, 50, 16, 16, torch.float32, seed=7)
    o = K.linear_attention(q, k, v, causal=True, chunk_size=64)
    k2, v2 = k.clone(), v.clone()
    i = 20
    gen = torch.Generator().manual_seed(1)
    k2[:, :, i + 1:] = _features(k2[:, :, i + 1:].shape, torch.float32, gen, scale=3.0)
    v2[:, :, i + 1:] = torch.randn(v2[:, :, i + 1:].shape, generator=gen).to(DEVICE) * 100
    if future != "finite":
        v2[0, 0, i + 3, 2] = float(future)
        v2[0, 0, i + 9, 5] = -float("inf")
    o2 = K.linear_attention(q, k2, v2, causal=True, chunk_size=64)
    assert torch.equal(o[:, :, : i + 1], o2[:, :, : i + 1])
    # and the non-finite values reach exactly the outputs the fp64 reference says they reach
    ref = R.linear_attention(_np(q), _np(k2), _np(v2), causal=True)
    np.testing.assert_array_equal(np.isfinite(_np(o2)), np.isfinite(ref))


def test_tiny_features_use_eps():
    """q . z comparable to eps: the output is num / (den + eps), not num / max(den, eps)."""
    q, k, v = _qkv(1, 1, 20, 16, 16, torch.float32, seed=9)
    q, k = q * 1e-4, k * 1e-4
    for causal in (False, True):
        ref = R.linear_attention(_np(q), _np(k), _np(v), causal=causal)
        _assert_close(K.linear_attention(q, k, v, causal=causal), ref, torch.float32, f"causal={causal}")


def test_controls_match_reference():
    q, k, v = _qkv(1, 2, 33, 16, 24, torch.float32, seed=11)
    for causal in (False, True):
        ref = R.linear_attention(_np(q), _np(k), _np(v), causal=causal)
        _assert_close(C.torch_linear_attention(q, k, v, causal=causal), ref, torch.float32, "control")
    x = torch.randn(5, 7, device=DEVICE)
    np.testing.assert_allclose(_np(C.torch_elu_feature_map(x)), R.elu_feature_map(_np(x)), rtol=1e-6)


# ---------------------------------------------------------------- feature map


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_feature_map_values_and_positivity(dtype):
    info = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-3, -1e-3, -10.0, -15.0, -80.0, info.max, -info.max,
                            info.tiny, -info.tiny, float("inf"), -float("inf")], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([special, torch.randn(3000, generator=gen, dtype=torch.float64) * 4]).to(dtype).to(DEVICE)
    y = K.elu_feature_map(x)
    assert y.dtype == dtype and y.shape == x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        ref = R.elu_feature_map(_np(x))
    ref_rounded = torch.from_numpy(ref).to(dtype).double().numpy()
    got = _np(y)
    finite = np.isfinite(_np(x))
    assert np.all(np.isfinite(got[finite])) and np.all(got[finite] >= 0)
    assert np.all(got[finite & (ref_rounded > 0)] > 0)
    ulp = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
    # a few ulps; fp32 exp on the GPU is ex2.approx(x log2 e): relative error ~ |x| 2^-24
    # (no x below -87 here: the interpreter's fp32 -> bf16 cast garbles fp32 subnormals)
    xf, rf, gf = _np(x)[finite], ref[finite], got[finite]
    tol = 4 * ulp * rf + (np.abs(xf) * 2.0**-23 * rf if dtype == torch.float32 else 0)
    np.testing.assert_array_less(np.abs(gf - rf), tol + info.tiny)
    assert np.isnan(_np(K.elu_feature_map(torch.tensor([float("nan")], dtype=dtype, device=DEVICE)))).all()


def test_feature_map_layouts():
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(3, 4, 5, 6, 7, generator=gen).to(DEVICE)
    for x in (base[0].transpose(0, 2), base[:, ::2, 1:, ::3, 0], base, base[1, 2, 3, 4, 5], base[..., 0].permute(3, 1, 0, 2)):
        y = K.elu_feature_map(x)
        assert y.shape == x.shape
        np.testing.assert_allclose(_np(y), R.elu_feature_map(_np(x)), rtol=1e-6, atol=1e-30)
    assert K.elu_feature_map(torch.empty(0, 3, device=DEVICE)).shape == (0, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_feature_map_gradient(dtype):
    gen = torch.Generator().manual_seed(2)
    x0 = torch.cat([torch.tensor([0.0, -0.0, 2.0, -3.0]), torch.randn(500, generator=gen) * 3]).to(dtype)
    x = x0.reshape(4, 126).t().to(DEVICE).requires_grad_(True)  # non-contiguous leaf
    dy = torch.randn(126, 8, generator=gen).to(dtype).to(DEVICE)[:, ::2]  # non-contiguous upstream grad
    K.elu_feature_map(x).backward(dy)
    xr = x.detach().to("cpu", torch.float64).requires_grad_(True)
    R.elu_feature_map_torch(xr).backward(dy.to("cpu", torch.float64))
    scale = {torch.float32: 1e-6, torch.float16: 2e-3}[dtype]
    np.testing.assert_allclose(_np(x.grad), xr.grad.numpy(), rtol=scale, atol=scale * float(dy.abs().max()))


# ---------------------------------------------------------------- mutants


def _mutants():
    from tritoncheck.mutants import linear_attention as M

    return {m.name: m for m in M.MUTANTS}


def _trigger(name):
    """An input on which mutant ``name`` differs from the kernel, and the kwargs to call with."""
    if name in ("relu_plus_one_feature_map", "elu_grad_exp_everywhere"):
        return (torch.linspace(-3, 3, 50, device=DEVICE),), {}
    if name == "eps_as_max":
        q, k, v = _qkv(1, 1, 10, 16, 16, torch.float32, seed=1)
        return (q * 1e-4, k * 1e-4, v), {"causal": False}
    q, k, v = _qkv(1, 1, 40, 16, 16, torch.float32, seed=1)
    return (q, k, v), {"causal": True, "chunk_size": 16}


@pytest.mark.parametrize(
    "name",
    ["state_not_carried", "exclusive_causal_sum", "eps_as_max", "state_updated_before_query",
     "relu_plus_one_feature_map", "elu_grad_exp_everywhere"],
)
def test_mutant_builds_and_differs(name):
    m = _mutants()[name]
    assert m.kills and m.bug
    args, kw = _trigger(name)
    kernel = getattr(K, m.op)
    if name == "elu_grad_exp_everywhere":
        grads = []
        for fn in (kernel, m):
            x = args[0].clone().requires_grad_(True)
            fn(x).sum().backward()
            grads.append(x.grad)
        assert torch.equal(kernel(args[0]), m(args[0]))  # forward is untouched
        assert not torch.allclose(grads[0], grads[1])
        return
    good, bad = kernel(*args, **kw), m(*args, **kw)
    assert not torch.allclose(good, bad, rtol=1e-3, atol=1e-6), f"{name} does not differ on its trigger"


def test_mutant_eps_as_max_also_bites_causal():
    m = _mutants()["eps_as_max"]
    q, k, v = _qkv(1, 1, 10, 16, 16, torch.float32, seed=1)
    q, k = q * 1e-4, k * 1e-4
    assert not torch.allclose(K.linear_attention(q, k, v, causal=True), m(q, k, v, causal=True), rtol=1e-3)


def test_mutant_state_not_carried_exact_within_one_chunk():
    m = _mutants()["state_not_carried"]
    q, k, v = _qkv(1, 1, 16, 16, 16, torch.float32, seed=2)
    assert torch.equal(K.linear_attention(q, k, v, causal=True, chunk_size=16), m(q, k, v, causal=True, chunk_size=16))
