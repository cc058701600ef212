"""A correct plain-PyTorch paged_decode_attention: gather, then T query rows of causal
attention, in one pass or split-K.

``gathered_naive_torch`` gathers each sequence's keys and values from the cache through the
block table (on the host: the table and lengths are read with ``tolist``) and computes, in
the input dtype, the scores as elementwise products summed over D (as decode reference code
writes it), the causal mask among the T query tokens (query t sees keys j < n - T + 1 + t),
a softmax, and P V. A row that sees no key gets o = 0.

With ``num_splits`` = S > 1 it splits the keys as the contract says (chunks of cdiv(n, S)
positions) and does what a flash-decoding kernel does, in PyTorch: per chunk, the softmax
and P V in the input dtype and the chunk's logsumexp in float32; then the merge in float32,
each chunk weighted by exp(lse_c - max_c lse_c) over the sum of the weights.

Why not ``q @ k^T`` (tritoncheck.controls.attention.naive_torch): on torch 2.13's CPU, the
batched matmul of one query row with 17 gathered (transposed) key rows that are equal bit for
bit gave two different scores (-1121.7600 and -1121.7596 for q of scale 1e3 with an outlier);
the dense rule (properties/attention_tolerance.py) gives keys equal to the top key bit for bit
an exact score, so the control failed matches_reference by 19 times the allowance. The
elementwise sum computes every key's score by the same reduction.
"""
from __future__ import annotations

import math

import torch


def _softmax_pv(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(s) v over the last dim of s [H, T, n] (-inf: masked), v [H, n, D]; a row
    with no finite score gives 0 (softmax alone would give NaN)."""
    seen = ~torch.isneginf(s).all(-1, keepdim=True)
    p = torch.where(seen, torch.softmax(s, dim=-1), 0.0)
    return p @ v


def _split_k(s: torch.Tensor, v: torch.Tensor, splits: int) -> torch.Tensor:
    """Flash-decoding: chunks of cdiv(n, splits) keys, each (o_c, lse_c), merged in float32."""
    n = s.shape[-1]
    size = -(-n // splits)
    parts, lses = [], []
    for lo in range(0, n, size):
        s_c = s[..., lo:lo + size]
        parts.append(_softmax_pv(s_c, v[:, lo:lo + size]).float())
        lses.append(torch.logsumexp(s_c.float(), dim=-1))  # -inf where the row sees none of the chunk
    lse = torch.stack(lses)  # [chunks, H, T]
    top = lse.amax(0)
    top = torch.where(torch.isneginf(top), 0.0, top)  # a row that sees no key: every weight 0
    w = torch.exp(lse - top)
    total = w.sum(0)
    o = (w[..., None] * torch.stack(parts)).sum(0) / torch.where(total == 0, 1.0, total)[..., None]
    return o.to(v.dtype)


def gathered_naive_torch(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None, num_splits=None):
    rows = q[:, None] if q.dim() == 3 else q  # [B, T, H, D]
    queries = rows.shape[1]
    page_size, group = k_cache.shape[1], rows.shape[2] // k_cache.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    splits = num_splits or 1
    table, lens = block_table.tolist(), seq_lens.tolist()
    out = []
    for b, n in enumerate(lens):
        if n == 0:
            out.append(torch.zeros_like(rows[b]))
            continue
        pages = table[b][: -(-n // page_size)]
        # [H, n, D]: the sequence's tokens, each KV head repeated for its group of query heads
        k, v = (c[pages].reshape(-1, *c.shape[2:])[:n].transpose(0, 1).repeat_interleave(group, dim=0)
                for c in (k_cache, v_cache))
        q_b = rows[b].transpose(0, 1)  # [H, T, D]
        s = (q_b[:, :, None, :] * k[:, None, :, :]).sum(-1) * scale  # [H, T, n]
        t = torch.arange(queries, device=s.device)[:, None]
        s = s.masked_fill(torch.arange(n, device=s.device)[None, :] >= n - queries + 1 + t, float("-inf"))
        o = _softmax_pv(s, v) if splits == 1 else _split_k(s, v, splits)
        out.append(o.transpose(0, 1))
    return torch.stack(out).reshape(q.shape)


gathered_naive_torch.uses_triton = False  # plain PyTorch: no interpreter limits apply
