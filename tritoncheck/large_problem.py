"""An op's input past 2**31 elements, as its record declares it (``OpSpec.large_problem``).

``tritoncheck/large_index.py`` runs it; this module holds the declaration and the builders
that several families share, so that a family module can declare its problem without
importing the check (which imports the registry).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

PAST_INT32 = 2**31 + 2**20  # elements: past the int32 range with room to spare


@dataclass(frozen=True)
class LargeProblem:
    """How to build one op's input past 2**31 elements and cut it into slices.

    ``build(dtype, device)`` returns every tensor argument (and any scalar whose reference
    signature has no default: ``params``); the other scalars take the defaults of the op's
    fp64 reference. ``split`` is ``"rows"`` (the first dim of the tensors named in
    ``sliced``) or ``"heads"`` (the first two dims, [B, H, ...], of those tensors); every
    other argument is passed whole to each slice; or ``"sequences"``: packed tensors whose
    rows (dim 0) are the tokens of sequences delimited by offsets (``offsets`` maps each
    sliced tensor to its offsets argument), cut into whole sequences, the offsets rebuilt
    for them; an output's token axis is the one as long as the first sliced tensor's rows."""

    build: Callable[[torch.dtype, torch.device], dict[str, Any]]
    split: str
    sliced: tuple[str, ...]
    whole_sum_grads: tuple[str, ...] = ()  # gradients that sum over every slice: run, not compared
    params: Mapping[str, Any] | None = None  # scalars without a default in the reference's signature
    offsets: Mapping[str, str] | None = None  # "sequences": sliced tensor -> its offsets argument

    def __post_init__(self):
        if self.split not in ("rows", "heads", "sequences"):
            raise ValueError(f"LargeProblem: split must be 'rows', 'heads' or 'sequences', got {self.split!r}")
        if (self.split == "sequences") != bool(self.offsets) or set(self.offsets or ()) - set(self.sliced):
            raise ValueError("LargeProblem: offsets name the sliced tensors' offsets, for split 'sequences' only")
        if not self.sliced:
            raise ValueError("LargeProblem: sliced must name at least one tensor argument")

    def values(self, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        return {**(self.params or {}), **self.build(dtype, device)}


def randn(shape, dtype, device, positive=False) -> torch.Tensor:
    t = torch.randn(shape, device=device, dtype=torch.float32)
    return (t.abs() if positive else t).to(dtype)


def rows_past_int32(n: int) -> int:
    """Rows of ``n`` elements that together pass 2**31."""
    return PAST_INT32 // n + 1


def row_wise(n: int, *names: str, vectors: tuple[str, ...] = ()) -> Callable:
    """Tensors ``names`` (default ``x``) of rows of ``n`` elements, past 2**31 each, and
    ``vectors`` of ``n`` elements (a norm's weight and bias)."""
    names = names or ("x",)

    def build(dtype, device):
        m = rows_past_int32(n)
        return {**{name: randn((m, n), dtype, device) for name in names},
                **{name: randn((n,), dtype, device) for name in vectors}}
    return build


def heads(n: int, d: int, positive=False, v_dim=None) -> Callable:
    """q, k, v of [B, 16, n, d] (v: [B, 16, n, v_dim]) past 2**31 elements each."""
    batch = math.ceil(rows_past_int32(n * d) / 16)

    def build(dtype, device):
        return {"q": randn((batch, 16, n, d), dtype, device, positive),
                "k": randn((batch, 16, n, d), dtype, device, positive),
                "v": randn((batch, 16, n, v_dim or d), dtype, device)}
    return build


def packed_sequences(n: int, d: int) -> Callable:
    """q, k, v of [T, 16, d] packed from sequences of ``n`` tokens each, past 2**31 elements,
    and their offsets cu_seqlens_q = cu_seqlens_k (int32; T itself stays below 2**31)."""
    sequences = math.ceil(rows_past_int32(n * d) / 16)

    def build(dtype, device):
        offsets = torch.arange(0, sequences + 1, device=device, dtype=torch.int32) * n
        return {**{name: randn((sequences * n, 16, d), dtype, device) for name in ("q", "k", "v")},
                "cu_seqlens_q": offsets, "cu_seqlens_k": offsets.clone()}
    return build


def paged_cache(page_size: int, kv_heads: int, d: int, queries: int = 1, num_splits: int | None = None) -> Callable:
    """A paged KV cache past 2**31 elements ([P, page_size, kv_heads, d] each), its pages
    shuffled among sequences of up to 2048 pages; q [B, 4 kv_heads, d] (``queries`` 1) or
    [B, queries, 4 kv_heads, d] (the last ``queries`` tokens of each sequence), block_table
    [B, pages per sequence], seq_lens ending anywhere in each sequence's last page; and
    ``num_splits`` where given (an implementation whose signature takes none is called
    without it: ``large_index.check``)."""
    def build(dtype, device):
        pages = rows_past_int32(page_size * kv_heads * d)  # when built: PAST_INT32 as it is then
        per = min(2048, pages)
        batch = max(1, pages // per)
        q_shape = (batch, 4 * kv_heads, d) if queries == 1 else (batch, queries, 4 * kv_heads, d)
        table = torch.randperm(pages, device=device)[:batch * per].reshape(batch, per).to(torch.int32)
        lens = per * page_size - torch.arange(batch, device=device, dtype=torch.int32) % page_size
        lens = torch.clamp(lens, min=queries)
        splits = {} if num_splits is None else {"num_splits": num_splits}
        return {"q": randn(q_shape, dtype, device),
                "k_cache": randn((pages, page_size, kv_heads, d), dtype, device),
                "v_cache": randn((pages, page_size, kv_heads, d), dtype, device),
                "block_table": table, "seq_lens": lens, **splits}
    return build
