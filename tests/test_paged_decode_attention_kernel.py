"""Tests of the paged decode kernel itself (kernels/paged_decode_attention.py), its
references, control and mutants: fixed serving cases, fast under the interpreter. The
suite's properties (properties/paged_decode_attention.py) fuzz the same op."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tritoncheck import backend
from tritoncheck.controls.paged_decode_attention import gathered_naive_torch
from tritoncheck.kernels.paged_decode_attention import paged_decode_attention
from tritoncheck.mutants import paged_decode_attention as mutants
from tritoncheck.references.paged_decode_attention import paged_decode_attention as ref_np

DEVICE = backend.device()
PAGE_SIZE, PAGES = 5, 14
LENS = [0, 1, 17, 10]  # a padded slot, a first token, past three pages, exactly two pages


def _numpy(args):
    return [a.double().cpu().numpy() if a.dtype.is_floating_point else a.cpu().numpy() for a in args]


def _make(dtype=torch.float32, heads=4, kv_heads=2, d=8, seed=0, queries=None):
    """Shuffled pages; entries past each sequence's live pages name the free page 13, filled with NaN.
    q [B, H, D], or [B, T, H, D] for ``queries`` = T."""
    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(PAGES, PAGE_SIZE, kv_heads, d, generator=g).to(dtype) for _ in range(2))
    order = torch.randperm(PAGES - 1, generator=g).tolist()
    table = torch.full((len(LENS), 4), PAGES - 1, dtype=torch.int32)
    taken = 0
    for b, n in enumerate(LENS):
        live = -(-n // PAGE_SIZE)
        table[b, :live] = torch.tensor(order[taken:taken + live], dtype=torch.int32)
        taken += live
    for c in (k, v):
        c[PAGES - 1] = float("nan")
    q_shape = (len(LENS), heads, d) if queries is None else (len(LENS), queries, heads, d)
    q = torch.randn(q_shape, generator=g).to(dtype)
    return (q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), table.to(DEVICE),
            torch.tensor(LENS, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_matches_the_fp64_reference_and_never_reads_the_free_page(dtype, atol):
    args = _make(dtype)
    o = paged_decode_attention(*args)
    want = ref_np(*(a.double().cpu().numpy() if a.dtype.is_floating_point else a.cpu().numpy() for a in args))
    assert not torch.isnan(o).any()  # the NaN free page is never read
    np.testing.assert_allclose(o.double().cpu().numpy(), want, atol=atol)
    assert torch.equal(o[0], torch.zeros_like(o[0]))  # seq_lens 0: exactly 0


def test_the_control_matches_the_reference():
    args = _make()
    want = ref_np(*(a.double().cpu().numpy() if a.dtype.is_floating_point else a.cpu().numpy() for a in args))
    np.testing.assert_allclose(gathered_naive_torch(*args).cpu().numpy(), want, atol=2e-6)


def test_bad_tables_and_lengths_are_refused_naming_the_argument():
    q, k, v, table, lens = _make()
    with pytest.raises(ValueError, match="block_table"):
        paged_decode_attention(q, k, v, table.masked_fill(table == table[2, 0], PAGES), lens)
    with pytest.raises(ValueError, match="seq_lens"):
        paged_decode_attention(q, k, v, table, lens + 10)
    with pytest.raises(TypeError, match="seq_lens"):
        paged_decode_attention(q, k, v, table, lens.float())


def test_every_mutant_differs_from_the_kernel_where_its_bug_says():
    args = _make()
    o = paged_decode_attention(*args)
    assert not torch.allclose(mutants.slot_by_power_of_two_mask(*args), o, equal_nan=True)
    assert not torch.allclose(mutants.contiguous_pages_assumed(*args), o, equal_nan=True)
    assert torch.isnan(mutants.whole_last_page_read(*args)).any() or \
        not torch.allclose(mutants.whole_last_page_read(*args), o)
    assert not torch.allclose(mutants.current_token_dropped(*args), o)
    assert torch.isnan(mutants.empty_sequence_nan(*args)[0]).all()
    assert torch.equal(mutants.draft_token_sees_the_next(*args), o)  # T = 1: the bug does not show
    drafts = _make(queries=3)
    assert not torch.allclose(mutants.draft_token_sees_the_next(*drafts), paged_decode_attention(*drafts))
    # 17 keys in 4 chunks of 4: the 17th falls in none
    assert not torch.allclose(mutants.chunk_remainder_dropped(*args, None, 4)[2], o[2])
    assert torch.allclose(mutants.chunk_remainder_dropped(*args, None, 5)[3], o[3])  # 10 keys: 5 divides them
    big = args[:1] + tuple(c * 40 for c in args[1:2]) + args[2:]  # scores of several hundred
    assert torch.isnan(mutants.merge_weights_without_max(*big, 2.0, 3)).any()


def test_the_large_index_row_split_works_at_a_small_size(monkeypatch):
    """The record's large problem (caches passed whole, q, block_table and seq_lens cut by
    rows), at a few thousand elements instead of 2**31."""
    import tritoncheck.large_problem as large
    from tritoncheck import large_index, registry
    monkeypatch.setattr(large, "PAST_INT32", 3000)
    spec = registry.load()["paged_decode_attention"]
    small = dataclasses.replace(spec.large_problem, build=large.paged_cache(3, 2, 8))
    monkeypatch.setitem(registry.OPS, "paged_decode_attention", dataclasses.replace(spec, large_problem=small))
    kernel = registry.Implementation.of("paged_decode_attention", paged_decode_attention, kind="kernel")
    assert large_index.check("paged_decode_attention", kernel, torch.float16, DEVICE) >= 1


@pytest.mark.parametrize("queries", [1, 3, 6])
def test_query_tokens_are_the_last_rows_causal_among_themselves(queries):
    """T query tokens: the fp64 reference's last T rows of the dense causal op; a sequence
    shorter than T (lengths 0, 1, 17, 10 against T = 3 and 6) gives 0 on the rows before
    its first token."""
    args = _make(queries=queries)
    o = paged_decode_attention(*args)
    assert o.shape == args[0].shape
    np.testing.assert_allclose(o.double().cpu().numpy(), ref_np(*_numpy(args)), atol=2e-6)
    lens = args[4].tolist()
    for b, n in enumerate(lens):
        assert torch.equal(o[b, :max(0, queries - n)], torch.zeros_like(o[b, :max(0, queries - n)]))


def test_one_query_token_is_the_same_in_either_rank():
    q, *rest = _make()
    assert torch.equal(paged_decode_attention(q[:, None], *rest)[:, 0], paged_decode_attention(q, *rest))


@pytest.mark.parametrize("splits", [2, 3, 7, 20])
def test_split_k_matches_the_reference_and_one_split_is_the_unsplit_path(splits):
    """Chunks of cdiv(n, S) keys merged in fp32; S = 20 leaves every sequence empty chunks."""
    args = _make(queries=3, heads=2, kv_heads=1)
    want = ref_np(*_numpy(args))
    o = paged_decode_attention(*args, None, splits)
    np.testing.assert_allclose(o.double().cpu().numpy(), want, atol=2e-6)
    assert torch.equal(paged_decode_attention(*args, None, 1), paged_decode_attention(*args))
    np.testing.assert_allclose(gathered_naive_torch(*args, None, splits).cpu().numpy(), want, atol=2e-6)


def test_bad_query_ranks_and_split_counts_are_refused_naming_the_argument():
    q, k, v, table, lens = _make(queries=2)
    for bad_q in (q[None], q[0, 0], q[:, :0]):
        with pytest.raises(ValueError, match="q"):
            paged_decode_attention(bad_q, k, v, table, lens)
    for splits, error in ((0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="num_splits"):
            paged_decode_attention(q, k, v, table, lens, None, splits)


def test_the_split_allowance_is_zero_where_a_row_sees_no_key_and_covers_a_far_off_chunk():
    """split_allowance on one sequence of 6 keys, T = 3 rows (its first row sees 4 keys) and
    3 chunks: positive, finite, and bounding the control's split result; on a sequence of
    one key the rows before it get exactly 0. Keys 0 and 1 score about 50 |q|^2 (~200) above
    the others for head 0 (their chunk's weight is ~1, the others' ~e^-200 and below fp32's
    smallest normal after the merge's exp: the allowance must hold there too)."""
    from tritoncheck.properties.paged_decode_attention_tolerance import chunk_edges, split_allowance
    from tritoncheck.tolerance import Precision
    assert chunk_edges(6, 3) == [(0, 2), (2, 4), (4, 6)] and chunk_edges(5, 4) == [(0, 2), (2, 4), (4, 5)]
    assert chunk_edges(2, 16) == [(0, 1), (1, 2)]
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 3, 2, 4, generator=g)
    k, v = (torch.randn(2, 3, 1, 4, generator=g) for _ in range(2))
    k[0, :2] = q[0, 0, 0] * 100
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    p = Precision.of(torch.float32, backend.current())
    q64 = q[0].double().numpy()
    k64, v64 = (c.double().numpy().reshape(6, 1, 4) for c in (k, v))
    for n in (6, 1):
        args = (q, k, v, table, torch.tensor([n], dtype=torch.int32))
        want = ref_np(*_numpy(args))
        allowed = split_allowance(q64, k64[:n], v64[:n], want[0], 0.5, p, 3)
        got = gathered_naive_torch(*args, 0.5, 3).double().numpy()
        assert np.isfinite(allowed).all() and (np.abs(got - want) <= allowed).all()
        assert (allowed[:3 - n] == 0).all() and (allowed[3 - n:] > 0).all()
