"""Smoke tests of the attention family: kernel, references, controls, mutants.

Fast (Triton interpreter on CPU, or the GPU when the suite's backend picks it). The
real tolerance rules and properties live in the suite; the bounds here are loose fixed
bounds that catch a broken kernel, not a slightly inaccurate one.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tritoncheck import backend
from tritoncheck.controls import attention as controls
from tritoncheck.kernels.attention import _dropout_keep, attention
from tritoncheck.mutants import attention as mutants
from tritoncheck.references.attention import attention as ref_np
from tritoncheck.references.attention import attention_torch as ref_torch

# the plugin chose the backend (TRITON_INTERPRET) before this module was imported
DEVICE = backend.device()


def _make(B, H, n_q, n_k, D, dtype, layout="contiguous", seed=0, h_kv=None):
    """q [B, H, n_q, D], k and v [B, h_kv (default H), n_k, D] in the given layout."""
    g = torch.Generator().manual_seed(seed)

    def one(n, heads):
        if layout == "bnhd":  # [B, N, H, D] storage seen as [B, H, N, D]
            t = torch.randn(B, n, heads, D, generator=g).to(dtype).to(DEVICE).transpose(1, 2)
        elif layout == "strided":  # every other head-dim element of a wider tensor
            t = torch.randn(B, heads, n, 2 * D, generator=g).to(dtype).to(DEVICE)[..., ::2]
        else:
            t = torch.randn(B, heads, n, D, generator=g).to(dtype).to(DEVICE)
        return t

    h_kv = H if h_kv is None else h_kv
    return one(n_q, H), one(n_k, h_kv), one(n_k, h_kv)


def _ref(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0):
    to_np = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
    return ref_np(to_np(q), to_np(k), to_np(v), causal, sm_scale, window, alibi_slopes, softcap)


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------
def _ok(shape=(1, 2, 8, 16), dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


BAD_INPUTS = [
    # (id, kwargs-builder, error type, substring that names the argument)
    ("q_not_tensor", lambda: dict(q=np.zeros((1, 1, 4, 16)), k=_ok(), v=_ok()), TypeError, "q"),
    ("k_float64", lambda: dict(q=_ok(), k=_ok().double(), v=_ok()), TypeError, "k"),
    ("v_int", lambda: dict(q=_ok(), k=_ok(), v=_ok().to(torch.int32)), TypeError, "v"),
    ("mixed_dtypes", lambda: dict(q=_ok(), k=_ok(dtype=torch.float16), v=_ok()), TypeError, "k"),
    ("q_rank3", lambda: dict(q=_ok((2, 8, 16)), k=_ok(), v=_ok()), ValueError, "q"),
    ("k_batch", lambda: dict(q=_ok(), k=_ok((2, 2, 8, 16)), v=_ok()), ValueError, "k"),
    ("v_heads", lambda: dict(q=_ok(), k=_ok(), v=_ok((1, 3, 8, 16))), ValueError, "v"),
    ("k_head_dim", lambda: dict(q=_ok(), k=_ok((1, 2, 8, 32)), v=_ok()), ValueError, "k"),
    ("v_keys", lambda: dict(q=_ok(), k=_ok(), v=_ok((1, 2, 9, 16))), ValueError, "v"),
    ("v_head_dim", lambda: dict(q=_ok(), k=_ok(), v=_ok((1, 2, 8, 32))), ValueError, "v"),
    ("head_dim_129", lambda: dict(q=_ok((1, 1, 4, 129)), k=_ok((1, 1, 4, 129)),
                                  v=_ok((1, 1, 4, 129))), ValueError, "head dim"),
    ("empty_q", lambda: dict(q=_ok((1, 2, 0, 16)), k=_ok(), v=_ok()), ValueError, "q"),
    ("kv_heads_not_dividing", lambda: dict(q=_ok((1, 3, 8, 16)), k=_ok(), v=_ok()), ValueError, "k"),
    ("v_heads_not_k", lambda: dict(q=_ok((1, 2, 8, 16)), k=_ok(), v=_ok((1, 1, 8, 16))), ValueError, "v"),
    ("window_scalar", lambda: dict(q=_ok(), k=_ok(), v=_ok(), window=4), TypeError, "window"),
    ("window_float", lambda: dict(q=_ok(), k=_ok(), v=_ok(), window=(2.0, 0)), TypeError, "window"),
    ("window_below_minus_one", lambda: dict(q=_ok(), k=_ok(), v=_ok(), window=(-2, 0)), ValueError, "window"),
    ("alibi_float16", lambda: dict(q=_ok(), k=_ok(), v=_ok(), alibi_slopes=torch.ones(2, device=DEVICE).half()),
     TypeError, "alibi_slopes"),
    ("alibi_shape", lambda: dict(q=_ok(), k=_ok(), v=_ok(), alibi_slopes=torch.ones(3, device=DEVICE)),
     ValueError, "alibi_slopes"),
    ("alibi_nan", lambda: dict(q=_ok(), k=_ok(), v=_ok(), alibi_slopes=torch.full((2,), math.nan, device=DEVICE)),
     ValueError, "alibi_slopes"),
    ("softcap_negative", lambda: dict(q=_ok(), k=_ok(), v=_ok(), softcap=-1.0), ValueError, "softcap"),
    ("softcap_str", lambda: dict(q=_ok(), k=_ok(), v=_ok(), softcap="30"), TypeError, "softcap"),
    ("scale_zero", lambda: dict(q=_ok(), k=_ok(), v=_ok(), sm_scale=0.0), ValueError, "sm_scale"),
    ("scale_negative", lambda: dict(q=_ok(), k=_ok(), v=_ok(), sm_scale=-1.0), ValueError, "sm_scale"),
    ("scale_nan", lambda: dict(q=_ok(), k=_ok(), v=_ok(), sm_scale=float("nan")), ValueError, "sm_scale"),
    ("scale_inf", lambda: dict(q=_ok(), k=_ok(), v=_ok(), sm_scale=math.inf), ValueError, "sm_scale"),
    ("scale_str", lambda: dict(q=_ok(), k=_ok(), v=_ok(), sm_scale="0.5"), TypeError, "sm_scale"),
    ("dropout_one", lambda: dict(q=_ok(), k=_ok(), v=_ok(), dropout_p=1.0), ValueError, "dropout_p"),
    ("dropout_negative", lambda: dict(q=_ok(), k=_ok(), v=_ok(), dropout_p=-0.1), ValueError, "dropout_p"),
    ("dropout_nan", lambda: dict(q=_ok(), k=_ok(), v=_ok(), dropout_p=math.nan), ValueError, "dropout_p"),
    ("dropout_bool", lambda: dict(q=_ok(), k=_ok(), v=_ok(), dropout_p=True), TypeError, "dropout_p"),
    ("seed_float", lambda: dict(q=_ok(), k=_ok(), v=_ok(), dropout_p=0.5, seed=1.5), TypeError, "seed"),
    ("seed_negative", lambda: dict(q=_ok(), k=_ok(), v=_ok(), dropout_p=0.5, seed=-1), ValueError, "seed"),
    ("seed_2_63", lambda: dict(q=_ok(), k=_ok(), v=_ok(), dropout_p=0.5, seed=2**63), ValueError, "seed"),
    ("return_keep_int", lambda: dict(q=_ok(), k=_ok(), v=_ok(), return_keep=1), TypeError, "return_keep"),
]


@pytest.mark.parametrize("name,build,exc,needle", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_validation(name, build, exc, needle):
    with pytest.raises(exc, match=needle):
        attention(**build())


def test_two_devices_rejected():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to put one tensor elsewhere")
    q = torch.randn(1, 1, 4, 16, device="cuda")
    with pytest.raises(ValueError, match="device"):
        attention(q, q.cpu(), q)


# --------------------------------------------------------------------------------------
# Fixed cases against the fp64 reference
# --------------------------------------------------------------------------------------
BOUND = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}

CASES = [
    # B, H, Nq, Nk, D, dtype, causal, layout, sm_scale
    (1, 1, 5, 10, 16, torch.float32, False, "contiguous", None),  # Nk not a block multiple
    (2, 3, 37, 21, 64, torch.float32, False, "bnhd", None),  # transposed view, ragged
    (1, 2, 40, 40, 32, torch.float32, True, "contiguous", 0.3),  # causal, 3 blocks
    (2, 2, 33, 33, 16, torch.float16, True, "bnhd", None),  # fp16 causal transposed
    (1, 2, 19, 50, 64, torch.float16, False, "strided", None),  # step-sliced head dim
    (1, 1, 3, 7, 24, torch.float32, False, "contiguous", None),  # D padded 24 -> 32
    (1, 1, 17, 17, 128, torch.float32, True, "contiguous", None),
    (1, 2, 20, 20, 32, torch.bfloat16, False, "contiguous", None),
    # B, H, Nq, Nk, D, dtype, causal, layout, sm_scale, Hkv (GQA), window
    (1, 4, 20, 37, 16, torch.float32, True, "bnhd", None, 2, (-1, -1)),  # GQA, bottom-right causal
    (2, 3, 37, 20, 16, torch.float16, True, "contiguous", None, 1, (-1, -1)),  # MQA, empty rows
    (1, 2, 33, 40, 32, torch.float32, False, "contiguous", None, 2, (5, 3)),  # sliding window
    (1, 2, 40, 33, 16, torch.float32, True, "strided", 0.5, 1, (7, -1)),  # window and causal
    # ..., ALiBi slopes ("h": [H], "bh": [B, H]), softcap
    (2, 4, 20, 37, 16, torch.float32, True, "contiguous", None, 2, (-1, -1), "bh", 0.0),  # ALiBi, bottom-right
    (1, 2, 33, 33, 32, torch.float16, False, "bnhd", None, 1, (4, 4), "h", 5.0),  # ALiBi, softcap, window
    (1, 2, 20, 20, 32, torch.bfloat16, True, "contiguous", None, 2, (-1, -1), None, 0.5),  # saturating softcap
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}x{c[3]}x{c[4]}-"
                         f"{str(c[5])[6:]}-{'causal' if c[6] else 'full'}-{c[7]}")
def test_matches_reference(case):
    B, H, n_q, n_k, D, dtype, causal, layout, sm_scale, h_kv, window, alibi, softcap = \
        case + (None, (-1, -1), None, 0.0)[len(case) - 9:]
    q, k, v = _make(B, H, n_q, n_k, D, dtype, layout, h_kv=h_kv)
    slopes = None if alibi is None else torch.rand((B, H) if alibi == "bh" else (H,)).to(DEVICE)
    inputs = [t.clone() for t in (q, k, v)]
    o, lse = attention(q, k, v, causal=causal, sm_scale=sm_scale, window=window, alibi_slopes=slopes,
                       softcap=softcap)
    assert o.dtype == dtype and o.shape == (B, H, n_q, D)
    assert lse.dtype == torch.float32 and lse.shape == (B, H, n_q)
    ro, rl = _ref(q, k, v, causal, sm_scale, window, None if slopes is None else slopes.cpu().numpy(), softcap)
    assert torch.isfinite(o).all()
    # rows that see no key: lse = -inf exactly where the reference's is
    assert np.array_equal(np.isneginf(lse.cpu().numpy()), np.isneginf(rl)) and not np.isnan(rl).any()
    assert np.abs(o.cpu().double().numpy() - ro).max() < BOUND[dtype]
    finite = np.isfinite(rl)
    assert np.abs(lse.cpu().double().numpy()[finite] - rl[finite]).max() < 1e-4
    for before, after in zip(inputs, (q, k, v)):  # inputs untouched
        assert torch.equal(before, after)


def test_deterministic_and_lse_not_differentiable():
    q, k, v = _make(1, 2, 20, 20, 16, torch.float32, seed=3)
    q.requires_grad_()
    o1, lse1 = attention(q, k, v, causal=True)
    o2, lse2 = attention(q, k, v, causal=True)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)
    assert o1.requires_grad and not lse1.requires_grad


def test_attributes():
    assert attention.supports_backward is True
    assert attention.fp32_dot_precision in ("tf32", "ieee")
    assert set(attention.dtypes) == {torch.float32, torch.float16, torch.bfloat16}


# --------------------------------------------------------------------------------------
# References and controls
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal,n_q,n_k,h_kv,window,alibi,softcap", [
    (False, 5, 9, 3, (-1, -1), False, 0.0), (True, 7, 7, 3, (-1, -1), False, 0.0),
    (True, 9, 4, 1, (-1, -1), True, 0.0), (False, 6, 11, 1, (2, 0), True, 2.0)])
def test_references_agree(causal, n_q, n_k, h_kv, window, alibi, softcap):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, n_q, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, h_kv, n_k, 8, generator=g, dtype=torch.float64) * 3
    v = torch.randn(2, h_kv, n_k, 8, generator=g, dtype=torch.float64)
    slopes = torch.rand(2, 3, generator=g) if alibi else None
    o_np, lse_np = ref_np(q.numpy(), k.numpy(), v.numpy(), causal, 0.7, window,
                          None if slopes is None else slopes.numpy(), softcap)
    o_t, lse_t = ref_torch(q, k, v, causal, 0.7, window, slopes, softcap)
    np.testing.assert_allclose(o_t.numpy(), o_np, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse_t.numpy(), lse_np, rtol=0, atol=1e-12)


def test_empty_rows_zero_with_finite_gradients():
    """Causal with Nq > Nk: rows i < Nq - Nk see no key: o = 0, lse = -inf, gradients finite
    (and zero for those rows' q), as the fp64 reference."""
    q, k, v = (t.requires_grad_() for t in _make(1, 2, 21, 6, 16, torch.float32, seed=11, h_kv=1))
    o, lse = attention(q, k, v, causal=True)
    assert torch.equal(o[..., :15, :], torch.zeros_like(o[..., :15, :]))
    assert torch.isneginf(lse[..., :15]).all() and torch.isfinite(lse[..., 15:]).all()
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(12)).to(DEVICE)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_grads = torch.autograd.grad(ref_torch(q64, k64, v64, True)[0], (q64, k64, v64), do.double())
    for got, want in zip(grads, ref_grads):
        assert torch.isfinite(got).all() and (got.double() - want).abs().max() < 1e-4
    assert torch.equal(grads[0][..., :15, :], torch.zeros_like(grads[0][..., :15, :]))


@pytest.mark.parametrize("causal", [False, True])
def test_reference_gradcheck(causal):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: ref_torch(a, b, c, causal)[0], (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_naive_torch_dropout(dtype):
    """naive_torch's dropout: o matches fp64 with its returned mask, the same seed the same mask,
    seeds differing above bit 31 other masks (torch's CPU generator alone keeps 32 bits)."""
    q, k, v = _make(1, 2, 9, 13, 16, dtype, seed=4, h_kv=1)
    o, _, keep = controls.naive_torch(q, k, v, True, None, (-1, -1), None, 0.0, 0.5, 2**40 + 1, True)
    ro, _ = ref_np(*(t.cpu().double().numpy() for t in (q, k, v)), True, dropout_p=0.5, keep=keep.cpu().numpy())
    assert np.abs(o.cpu().double().numpy() - ro).max() < 10 * BOUND[dtype]
    _, _, again = controls.naive_torch(q, k, v, True, None, (-1, -1), None, 0.0, 0.5, 2**40 + 1, True)
    _, _, other = controls.naive_torch(q, k, v, True, None, (-1, -1), None, 0.0, 0.5, 1, True)
    assert torch.equal(keep, again) and not torch.equal(keep, other)


@pytest.mark.parametrize("control", ["sdpa", "naive_torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_controls(control, dtype):
    fn = getattr(controls, control)
    # (Nq, Nk, Hkv, causal, window, ALiBi, softcap): MHA, GQA with bottom-right causal and empty
    # rows, a window, ALiBi with a softcap
    for n_q, n_k, h_kv, causal, window, alibi, softcap in (
            (9, 9, 2, False, (-1, -1), False, 0.0), (9, 9, 2, True, (-1, -1), False, 0.0),
            (12, 7, 1, True, (-1, -1), False, 0.0), (7, 12, 1, False, (2, 1), False, 0.0),
            (9, 13, 1, True, (-1, -1), True, 3.0)):
        q, k, v = _make(1, 2, n_q, n_k, 16, dtype, seed=4, h_kv=h_kv)
        slopes = torch.tensor([0.5, 0.25], device=DEVICE) if alibi else None
        o, lse = fn(q, k, v, causal=causal, window=window, alibi_slopes=slopes, softcap=softcap)
        ro, rl = _ref(q, k, v, causal, None, window, None if slopes is None else slopes.cpu().numpy(), softcap)
        assert o.dtype == dtype and lse.dtype == torch.float32
        assert np.abs(o.detach().cpu().double().numpy() - ro).max() < 10 * BOUND[dtype]
        got = lse.detach().cpu().double().numpy()
        assert np.array_equal(np.isneginf(got), np.isneginf(rl))
        # naive_torch's lse comes from scores rounded to the input dtype
        finite = np.isfinite(rl)
        assert np.abs(got[finite] - rl[finite]).max() < BOUND[dtype]


# --------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------
GRAD_CASES = [
    (2, 2, 23, 37, 32, torch.float32, False, "bnhd", 1e-4),
    (1, 2, 35, 35, 16, torch.float16, True, "contiguous", 2e-2),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=["fp32-full-bnhd", "fp16-causal"])
def test_gradients_match_reference(case):
    B, H, n_q, n_k, D, dtype, causal, layout, bound = case
    q, k, v = (t.requires_grad_() for t in _make(B, H, n_q, n_k, D, dtype, layout, seed=5))
    do = torch.randn(B, H, n_q, D, generator=torch.Generator().manual_seed(6)).to(dtype).to(DEVICE)
    o, _ = attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64, _ = ref_torch(q64, k64, v64, causal)
    ref_grads = torch.autograd.grad(o64, (q64, k64, v64), do.double())
    for name, got, want, inp in zip("qkv", grads, ref_grads, (q, k, v)):
        assert got.dtype == dtype and got.shape == inp.shape, name
        err = (got.double() - want).abs().max().item()
        assert err < bound * max(1.0, want.abs().max().item()), (name, err)


def test_gradient_of_expanded_grad_output():
    """o.sum() backpropagates an expanded (stride 0) grad_output."""
    q, k, v = (t.requires_grad_() for t in _make(1, 1, 9, 12, 16, torch.float32, seed=7))
    attention(q, k, v)[0].sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_torch(q64, k64, v64)[0].sum().backward()
    for a, b in ((q, q64), (k, k64), (v, v64)):
        assert (a.grad.double() - b.grad).abs().max() < 1e-4


# --------------------------------------------------------------------------------------
# Dropout
# --------------------------------------------------------------------------------------
def _philox_uniform(seed: int, counter: np.ndarray) -> np.ndarray:
    """tl.rand(seed, counter) in NumPy: Philox4x32-10 on the counter words (counter mod 2**32,
    counter >> 32, 0, 0) and key (seed mod 2**32, seed >> 32), the first output word as an int32
    folded to [0, 2**31) and scaled to [0, 1) in fp32."""
    m32 = np.uint64(0xFFFFFFFF)
    c0, c1 = (counter & 0xFFFFFFFF).astype(np.uint64), (counter >> 32).astype(np.uint64)
    c2, c3 = np.zeros_like(c0), np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0, p1 = np.uint64(0xCD9E8D57) * c2, np.uint64(0xD2511F53) * c0  # exact: both < 2**64
        c0, c1, c2, c3 = (p0 >> np.uint64(32)) ^ c1 ^ k0, p0 & m32, (p1 >> np.uint64(32)) ^ c3 ^ k1, p1 & m32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m32, (k1 + np.uint64(0xBB67AE85)) & m32
    x = c0.astype(np.uint32).view(np.int32).astype(np.int64)
    return np.where(x < 0, ~x, x).astype(np.float32) * np.float32(4.6566127342e-10)


def _documented_keep(seed: int, p: float, B: int, H: int, n_q: int, n_k: int) -> np.ndarray:
    """The module docstring's mask: uniform(seed, ((b H + h) Nq + i) Nk + j) >= p."""
    b, h = np.arange(B)[:, None, None, None], np.arange(H)[None, :, None, None]
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    return _philox_uniform(seed, ((b * H + h) * n_q + i) * n_k + j) >= np.float32(p)


@pytest.mark.parametrize("seed", [7, 2**40 + 3, 2**63 - 1])
def test_dropout_mask_is_the_documented_counter(seed):
    """The keep mask is Philox of the documented counter, whatever the layout of q, k, v."""
    for layout in ("contiguous", "bnhd"):
        q, k, v = _make(2, 3, 20, 37, 16, torch.float32, layout, seed=13, h_kv=1)
        _, _, keep = attention(q, k, v, True, None, (5, -1), None, 0.0, 0.3, seed, True)
        assert keep.dtype == torch.bool and keep.shape == (2, 3, 20, 37)
        assert np.array_equal(keep.cpu().numpy(), _documented_keep(seed, 0.3, 2, 3, 20, 37))


@triton.jit
def _draw_keep(OUT, seed, off_b, off_h, H, N_Q, N_K, row0, drop_p, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    keep = _dropout_keep(seed, off_b, off_h, H, row0 + offs, offs, N_Q, N_K, drop_p)
    tl.store(OUT + offs[:, None] * BLOCK + offs[None, :], keep.to(tl.int8))


def test_dropout_counter_past_2_to_32():
    """The counter is formed in int64: a head whose rows start past 2**32 draws the documented mask."""
    out = torch.empty(16, 16, dtype=torch.int8, device=DEVICE)
    b, h, heads, n_q, n_k, row0 = 3, 5, 7, 100_000, 100_000, 99_000
    _draw_keep[(1,)](out, 11, b, h, heads, n_q, n_k, row0, 0.5, BLOCK=16)
    counter = ((b * heads + h) * n_q + row0 + np.arange(16)[:, None]) * n_k + np.arange(16)[None, :]
    assert counter.min() > 2**32
    assert np.array_equal(out.cpu().numpy().astype(bool), _philox_uniform(11, counter) >= np.float32(0.5))


def test_dropout_zero_is_the_plain_call():
    q, k, v = _make(1, 2, 20, 37, 16, torch.float32, seed=14)
    o, lse = attention(q, k, v, True)
    o0, lse0, keep = attention(q, k, v, True, None, (-1, -1), None, 0.0, 0.0, 123, True)
    assert torch.equal(o, o0) and torch.equal(lse, lse0) and bool(keep.all())


@pytest.mark.parametrize("dtype,causal,window,h_kv,p", [
    (torch.float32, True, (-1, -1), 1, 0.3), (torch.float32, False, (5, 3), 2, 0.9),
    (torch.float16, True, (-1, -1), 2, 0.5), (torch.bfloat16, False, (-1, -1), 2, 0.1)])
def test_dropout_matches_reference_with_its_mask(dtype, causal, window, h_kv, p):
    """o and the gradients match fp64 with the returned mask; lse is the dropout-free one, bitwise."""
    q, k, v = (t.requires_grad_() for t in _make(1, 2, 33, 40, 16, dtype, seed=15, h_kv=h_kv))
    o, lse, keep = attention(q, k, v, causal, None, window, None, 0.0, p, 99, True)
    assert torch.equal(lse, attention(q, k, v, causal, None, window)[1])
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(16)).to(dtype).to(DEVICE)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64, lse64 = ref_torch(q64, k64, v64, causal, None, window, dropout_p=p, keep=keep)
    ref_grads = torch.autograd.grad(o64, (q64, k64, v64), do.double())
    scale = o64.abs().max().item()
    assert (o.double() - o64).abs().max().item() < BOUND[dtype] * max(1.0, scale)
    for name, got, want in zip("qkv", grads, ref_grads):
        err = (got.double() - want).abs().max().item()
        assert err < 10 * BOUND[dtype] * max(1.0, want.abs().max().item()), (name, err)


def test_dropout_keep_fraction_and_heads():
    """A loose sanity check of the mask's law (the suite's checks are the real test)."""
    q, k, v = _make(2, 4, 64, 64, 16, torch.float32, seed=17)
    _, _, keep = attention(q, k, v, False, None, (-1, -1), None, 0.0, 0.25, 5, True)
    assert abs(keep.float().mean().item() - 0.75) < 0.02
    assert (keep[:, 0] == keep[:, 1]).float().mean().item() < 0.7  # independent heads agree 62.5% of the time


# --------------------------------------------------------------------------------------
# Mutants: each builds and differs from the kernel on an input that triggers it
# --------------------------------------------------------------------------------------
# name -> (B, H, N_q, N_k, D, causal, layout, sm_scale[, Hkv[, window[, "alibi", a softcap, or
# dropout keywords]]])
TRIGGERS = {
    "padded_keys_scored_zero": (1, 1, 5, 10, 16, False, "contiguous", None),
    "accumulator_not_rescaled": (1, 2, 8, 150, 16, False, "contiguous", None),  # > 1 block on GPU too
    "causal_off_by_one": (1, 1, 8, 8, 16, True, "contiguous", None),
    "causal_future_key_visible": (1, 1, 8, 8, 16, True, "contiguous", None),
    "lse_in_log2_units": (1, 1, 4, 8, 16, False, "contiguous", None),
    "strides_assumed_contiguous": (1, 2, 8, 8, 16, False, "bnhd", None),
    "lse_ignores_batch_index": (2, 1, 4, 8, 16, False, "contiguous", None),
    "dk_missing_scale": (1, 1, 4, 8, 16, False, "contiguous", None),
    "dkdv_causal_mask_missing": (1, 1, 8, 8, 16, True, "contiguous", None),
    "kv_head_interleaved": (1, 4, 8, 8, 16, False, "contiguous", None, 2),  # H = 4, Hkv = 2
    "causal_top_left": (1, 1, 5, 12, 16, True, "contiguous", None),  # Nq < Nk
    "window_left_edge_off_by_one": (1, 1, 8, 8, 16, False, "contiguous", None, 1, (3, -1)),
    "window_zero_as_unbounded": (1, 1, 8, 8, 16, True, "contiguous", None),
    "unbounded_left_sized_by_queries": (1, 1, 4, 20, 16, True, "contiguous", None),  # Nk > 2 Nq
    "alibi_sign_flipped": (1, 2, 8, 8, 16, False, "contiguous", None, 2, (-1, -1), "alibi"),
    "alibi_distance_top_left": (1, 2, 5, 12, 16, True, "contiguous", None, 2, (-1, -1), "alibi"),
    "softcap_before_scale": (1, 1, 8, 8, 16, False, "contiguous", None, 1, (-1, -1), 2.0),
    "scale_dropped_with_modifiers": (1, 1, 8, 8, 16, False, "contiguous", None, 1, (-1, -1), 30.0),
    "dropout_not_rescaled": (1, 2, 8, 20, 16, False, "contiguous", None, 2, (-1, -1), {"dropout_p": 0.5, "seed": 3}),
    "lse_after_dropout": (1, 2, 8, 20, 16, True, "contiguous", None, 2, (-1, -1), {"dropout_p": 0.5, "seed": 3}),
    "heads_share_dropout_mask": (1, 2, 8, 20, 16, False, "contiguous", None, 2, (-1, -1), {"dropout_p": 0.5, "seed": 3}),
    "keep_probability_inverted": (1, 1, 8, 20, 16, False, "contiguous", None, 1, (-1, -1),
                                  {"dropout_p": 0.25, "seed": 3}),
    "dropout_path_at_p_zero": (1, 2, 8, 20, 16, False, "contiguous", None, 2, (-1, -1), {"dropout_p": 0.0, "seed": 3}),
    "zero_dropout_means_default": (1, 2, 8, 20, 16, False, "contiguous", None, 2, (-1, -1), {"dropout_p": 0.0}),
    "seed_truncated_to_32_bits": (1, 1, 8, 20, 16, False, "contiguous", None, 1, (-1, -1),
                                  {"dropout_p": 0.5, "seed": 2**40 + 3}),
    "backward_mask_shifted": (1, 2, 8, 20, 16, True, "contiguous", None, 1, (-1, -1), {"dropout_p": 0.5, "seed": 3}),
    # the trigger calls without return_keep: the training call
    "dropout_only_with_keep": (1, 2, 8, 20, 16, False, "contiguous", None, 2, (-1, -1), {"dropout_p": 0.5, "seed": 3}),
    "dropout_backward_unscaled": (1, 2, 8, 20, 16, True, "contiguous", None, 1, (-1, -1),
                                  {"dropout_p": 0.5, "seed": 3}),
}


def test_every_mutant_has_a_trigger():
    assert {m.name for m in mutants.MUTANTS} == set(TRIGGERS)
    for m in mutants.MUTANTS:
        assert getattr(mutants, m.name) is m and m.op == "attention" and m.kills


def _run_with_grads(fn, q, k, v, causal, sm_scale, do, window=(-1, -1), **extra):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, lse = fn(q, k, v, causal=causal, sm_scale=sm_scale, window=window, **extra)
    grads = torch.autograd.grad(o, (q, k, v), do)
    return (o.detach(), lse.detach(), *grads)


@pytest.mark.parametrize("name", sorted(TRIGGERS))
def test_mutant_differs_on_trigger(name):
    absent = getattr(mutants, name).absent_on(backend.current())
    if absent:
        pytest.skip(absent)
    B, H, n_q, n_k, D, causal, layout, sm_scale, *rest = TRIGGERS[name]
    h_kv, window, modifier = (rest + [None, (-1, -1), None][len(rest):])[:3]
    q, k, v = _make(B, H, n_q, n_k, D, torch.float32, layout, seed=8, h_kv=h_kv)
    extra = {}
    if modifier == "alibi":
        extra["alibi_slopes"] = torch.tensor([0.5, 0.125] * H, device=DEVICE)[:H]
    elif isinstance(modifier, dict):
        extra.update(modifier)
    elif modifier is not None:
        extra["softcap"] = modifier
        q = q * 3  # scores reach the cap's curved part
    do = torch.randn(B, H, n_q, D, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    good = _run_with_grads(attention, q, k, v, causal, sm_scale, do, window, **extra)
    bad = _run_with_grads(getattr(mutants, name), q, k, v, causal, sm_scale, do, window, **extra)
    labels = ("o", "lse", "dq", "dk", "dv")
    forward_only = name in ("dk_missing_scale", "dkdv_causal_mask_missing", "backward_mask_shifted",
                            "dropout_backward_unscaled")
    differs = [lab for lab, a, b in zip(labels, good, bad) if not torch.equal(a, b)]
    assert differs, f"mutant {name} matches the kernel on its trigger input"
    if forward_only:  # backward-only bugs leave the forward bitwise intact
        assert differs[0] in ("dq", "dk", "dv"), differs
