"""Tests of the varlen attention kernel itself (kernels/varlen_attention.py), its references,
control and mutants: fixed cases that serving sends, fast under the interpreter. The suite's
properties (properties/varlen_attention.py) fuzz the same op; these pin known cases."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritoncheck import backend
from tritoncheck.controls.varlen_attention import naive_torch_per_sequence
from tritoncheck.kernels.attention import attention
from tritoncheck.kernels.varlen_attention import varlen_attention
from tritoncheck.mutants import varlen_attention as mutants
from tritoncheck.references.varlen_attention import varlen_attention as ref_np
from tritoncheck.references.varlen_attention import varlen_attention_torch as ref_torch

DEVICE = backend.device()
# (Nq_b, Nk_b): an empty request, a decode step against a cache, a prefill past one block,
# a sequence of queries without keys, one of keys without queries, a square one
LENGTHS = ([0, 1, 17, 3, 0, 5], [0, 20, 17, 0, 4, 5])


def _offsets(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=DEVICE)


def _make(heads=4, kv_heads=2, d=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    lq, lk = LENGTHS
    q = torch.randn(sum(lq), heads, d, generator=g).to(dtype).to(DEVICE)
    k, v = (torch.randn(sum(lk), kv_heads, d, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    return q, k, v, _offsets(lq), _offsets(lk)


@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (False, (3, 1), 4.0), (True, (5, -1), 0.0)])
def test_matches_the_fp64_reference_forward_and_backward(causal, window, softcap):
    q, k, v, cq, ck = _make()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, lse = varlen_attention(q, k, v, cq, ck, causal, None, window, softcap)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    want_o, want_lse = ref_np(*(t.detach().double().cpu().numpy() for t in (q, k, v)), cq, ck, causal, None, window,
                              softcap)
    np.testing.assert_allclose(o.detach().cpu().numpy(), want_o, atol=2e-6)
    assert np.array_equal(np.isinf(lse.cpu().numpy()), np.isinf(want_lse))  # rows without keys: -inf exactly
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse.cpu().numpy()[finite], want_lse[finite], atol=2e-6)
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o64, _ = ref_torch(*x64, cq, ck, causal, None, window, softcap)
    for got, want in zip(grads, torch.autograd.grad(o64, x64, do.double())):
        np.testing.assert_allclose(got.cpu().numpy(), want.detach().cpu().numpy(), atol=5e-6)


def test_rows_without_keys_and_keys_without_queries_are_exact_zeros():
    q, k, v, cq, ck = _make()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, lse = varlen_attention(q, k, v, cq, ck, True)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    keyless = slice(18, 21)  # sequence 3: three queries, no key
    queryless = slice(37, 41)  # sequence 4: four keys, no query
    assert torch.equal(o[keyless], torch.zeros_like(o[keyless])) and torch.isneginf(lse[:, keyless]).all()
    assert torch.equal(dq[keyless], torch.zeros_like(dq[keyless]))
    assert torch.equal(dk[queryless], torch.zeros_like(dk[queryless]))
    assert torch.equal(dv[queryless], torch.zeros_like(dv[queryless]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_each_sequence_is_bitwise_the_dense_kernel_on_it(dtype):
    """Same blocks, same order of operations: the packed call of this kernel is the dense
    kernel run per sequence, bit for bit (bottom-right causal, GQA)."""
    q, k, v, cq, ck = _make(dtype=dtype)
    o, lse = varlen_attention(q, k, v, cq, ck, True)
    for b, (q0, q1, k0, k1) in enumerate(zip(cq.tolist(), cq.tolist()[1:], ck.tolist(), ck.tolist()[1:])):
        if q1 == q0 or k1 == k0:
            continue
        dense = [t[a:z].transpose(0, 1)[None] for t, a, z in ((q, q0, q1), (k, k0, k1), (v, k0, k1))]
        o_b, lse_b = attention(*dense, True)
        assert torch.equal(o[q0:q1], o_b[0].transpose(0, 1)), f"sequence {b}"
        assert torch.equal(lse[:, q0:q1], lse_b[0]), f"sequence {b}"


def test_strided_inputs_and_int64_offsets():
    q, k, v, cq, ck = _make()
    wide = torch.stack([q, torch.full_like(q, float("nan"))], dim=-1)[..., 0]  # q at every other element, NaN between
    o, lse = varlen_attention(wide, k.transpose(0, 1).contiguous().transpose(0, 1), v, cq.long(), ck.long())
    o2, lse2 = varlen_attention(q, k, v, cq, ck)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_the_control_matches_the_reference():
    q, k, v, cq, ck = _make()
    o, lse = naive_torch_per_sequence(q, k, v, cq, ck, True, None, (4, -1), 0.0)
    want_o, want_lse = ref_np(*(t.double().cpu().numpy() for t in (q, k, v)), cq, ck, True, None, (4, -1))
    np.testing.assert_allclose(o.cpu().numpy(), want_o, atol=2e-6)
    np.testing.assert_array_equal(np.isinf(lse.cpu().numpy()), np.isinf(want_lse))


@pytest.mark.parametrize("spoil,argument", [
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].flip(0)}, "cu_seqlens_q"),
    (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"][:-1]}, "cu_seqlens_k"),
    (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"].float()}, "cu_seqlens_k"),
    (lambda a: {**a, "k": a["k"][:, :, :4]}, "k"),
    (lambda a: {**a, "q": a["q"].double()}, "q"),
])
def test_bad_offsets_and_shapes_are_refused_naming_the_argument(spoil, argument):
    q, k, v, cq, ck = _make()
    args = spoil({"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck})
    with pytest.raises((TypeError, ValueError), match=argument):
        varlen_attention(args["q"], args["k"], args["v"], args["cu_seqlens_q"], args["cu_seqlens_k"])


def test_every_mutant_differs_from_the_kernel_where_its_bug_says():
    """Each patch applied (the snippet exists once) and changes what its bug describes."""
    q, k, v, cq, ck = _make()
    o, _ = varlen_attention(q, k, v, cq, ck, True)
    o_top, _ = mutants.top_left_causal(q, k, v, cq, ck, True)
    assert not torch.equal(o, o_top)
    o_nan, _ = mutants.keyless_rows_nan(q, k, v, cq, ck, True)
    assert torch.isnan(o_nan[18:21]).all()
    o_read, _ = mutants.packed_bound_for_keys(q, k, v, cq, ck)
    assert not torch.equal(varlen_attention(q, k, v, cq, ck)[0], o_read)


def test_the_sequence_split_of_the_large_index_check_works_at_a_small_size(monkeypatch):
    """tritoncheck/large_index.py's "sequences" split (whole sequences cut out of packed
    tensors, offsets rebuilt, o by rows and lse by columns, dq by query rows and dk, dv by
    key rows), on a few thousand elements instead of 2**31, with sequences of 5 tokens."""
    import dataclasses

    import tritoncheck.large_problem as large
    from tritoncheck import large_index, registry
    monkeypatch.setattr(large, "PAST_INT32", 3000)
    spec = registry.load()["varlen_attention"]
    small = dataclasses.replace(spec.large_problem, build=large.packed_sequences(5, 8))
    monkeypatch.setitem(registry.OPS, "varlen_attention", dataclasses.replace(spec, large_problem=small))
    kernel = registry.Implementation.of("varlen_attention", varlen_attention, kind="kernel")
    assert large_index.check("varlen_attention", kernel, torch.float16, DEVICE) >= 5
    # and a kernel that mixes up sequences fails it
    broken = registry.Implementation.of("varlen_attention", mutants.packed_bound_for_keys, kind="mutant")
    with pytest.raises(AssertionError, match="past 2\\*\\*31"):
        large_index.check("varlen_attention", broken, torch.float16, DEVICE)
