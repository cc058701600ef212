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


def _make(dtype=torch.float32, heads=4, kv_heads=2, d=8, seed=0):
    """Shuffled pages; entries past each sequence's live pages name the free page 13, filled with NaN."""
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
    q = torch.randn(len(LENS), heads, d, generator=g).to(dtype)
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
