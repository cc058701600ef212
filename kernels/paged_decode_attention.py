"""Decode attention against a paged KV cache, in Triton (forward only: decode is inference).

Contract (docs/contract.md)::

    paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None,
                           num_splits=None) -> o

    q [B, T, H, D]: the T newest tokens of each sequence (speculative or chunked decode);
        q [B, H, D] is T = 1
    k_cache, v_cache [P, page_size, Hkv, D]: P physical pages of page_size token slots
    block_table [B, max_pages] int32: logical page p of sequence b is physical page
        block_table[b, p]; entries past cdiv(seq_lens[b], page_size) are never read
    seq_lens [B] int32: sequence b's cached tokens (its queries' own keys included),
        0 .. max_pages * page_size
    num_splits: None or 1 (one pass over the keys) or S > 1 (split-K: below)
    o (q's shape, input dtype): query t of sequence b is token n - T + t (n = seq_lens[b])
        and attends to the tokens j < n - T + 1 + t at slot j % page_size of page
        block_table[b, j // page_size] (GQA: query head h reads KV head h // (H / Hkv)):
        the last T rows of the dense causal op on the gathered sequence; a row that sees
        no key (n - T + 1 + t <= 0) is 0

One program per (sequence, query head, query token) walks the keys its row sees in
blocks of BLOCK_N logical positions, gathering each position's page from the block table
(a key block may span pages; pages may lie anywhere, in any order). Online softmax as in
``kernels/attention.py``; the q . k products are fp32 elementwise products summed over D
(a single query row is below tl.dot's smallest tile); P V likewise. Slots past a row's
last key and pages the table does not name are never loaded, so a free page may hold
anything. Offsets into the cache are int64 (a cache passes 2**31 elements long before a
table does).

Split-K (flash-decoding): with num_splits = S > 1 sequence b's keys are cut into S chunks
of L = cdiv(n, S) positions (chunk c holds [c L, min((c + 1) L, n)), empty when c L >= n);
one program per (sequence, head, query token, chunk) writes the chunk's normalised
partial o_c and its lse_c (log2 units) in fp32, -inf for a chunk the row sees no key of;
a second kernel merges each row's S partials in fp32: m = max_c lse_c,
w_c = exp2(lse_c - m), o = sum_c w_c o_c / sum_c w_c (two passes over the partials, so
the sums have S terms each, in chunk order). The chunking is the contract's: the suite's
allowance for the merge (properties/paged_decode_attention_tolerance.py) is derived
chunk by chunk.
"""
from __future__ import annotations

import contextlib
import math
import numbers

import torch
import triton.language as tl

from tritoncheck.kernels.attention import _DTYPES, LOG2E, MAX_HEAD_DIM, _block_d, _interpreting
from tritoncheck.kernels.specialisation import unspecialised_jit

_INDEX_DTYPES = (torch.int32, torch.int64)


@unspecialised_jit
def _paged_decode_kernel(
    Q, K, V, O, PART_O, PART_LSE, TABLE, LENS,
    stride_qb, stride_qt, stride_qh, stride_qd,
    stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_ot, stride_oh, stride_od,
    stride_tb, stride_tp,
    QUERIES, HEADS, GROUP, HEAD_DIM, PAGE_SIZE, NUM_SPLITS, qk_scale,
    SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # axis 0 enumerates (sequence, query token, chunk), 2**31 - 1 programs (axis 1 holds only 65535)
    split = tl.program_id(0) % NUM_SPLITS
    bt = tl.program_id(0) // NUM_SPLITS
    b = bt // QUERIES
    t = bt % QUERIES
    h = tl.program_id(1)
    kvh = h // GROUP
    n = tl.load(LENS + b).to(tl.int32)
    # query t is token n - T + t: it sees the keys before it and itself (none when <= 0)
    visible = n - QUERIES + 1 + t
    chunk = (n + NUM_SPLITS - 1) // NUM_SPLITS
    lo = split * chunk
    hi = tl.minimum(lo + chunk, visible)  # hi <= lo: the row sees no key of this chunk
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    q = tl.load(Q + b.to(tl.int64) * stride_qb + t.to(tl.int64) * stride_qt + h.to(tl.int64) * stride_qh
                + offs_d * stride_qd, mask=d_valid, other=0.0).to(tl.float32)

    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), dtype=tl.float32), axis=0)  # fp32 scalars that
    l_i = tl.sum(tl.zeros([BLOCK_N], dtype=tl.float32), axis=0)  # the loop carries
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        page = tl.load(TABLE + b.to(tl.int64) * stride_tb + (pos // PAGE_SIZE) * stride_tp, mask=valid, other=0)
        slot = pos % PAGE_SIZE
        row = page.to(tl.int64) * stride_kp + slot * stride_ks + kvh.to(tl.int64) * stride_kh
        vrow = page.to(tl.int64) * stride_vp + slot * stride_vs + kvh.to(tl.int64) * stride_vh
        mask = valid[:, None] & d_valid[None, :]
        k = tl.load(K + row[:, None] + offs_d[None, :] * stride_kd, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + vrow[:, None] + offs_d[None, :] * stride_vd, mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(q[None, :] * k, axis=1) * qk_scale  # log2 units
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)  # the first block: exp2(-inf) = 0, nothing to rescale
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new

    # no key seen: acc = 0 and l = 0: o = 0
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)
    if SPLIT:
        # the partial of (b, t, h, split) in fp32 workspaces [B, T, H, S] and [B, T, H, S, D]
        part = (bt.to(tl.int64) * HEADS + h) * NUM_SPLITS + split
        lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
        tl.store(PART_LSE + part, lse)
        tl.store(PART_O + part * HEAD_DIM + offs_d, o, mask=d_valid)
    else:
        tl.store(O + b.to(tl.int64) * stride_ob + t.to(tl.int64) * stride_ot + h.to(tl.int64) * stride_oh
                 + offs_d * stride_od, o.to(O.dtype.element_ty), mask=d_valid)


@unspecialised_jit
def _merge_splits_kernel(
    PART_O, PART_LSE, O,
    stride_ob, stride_ot, stride_oh, stride_od,
    QUERIES, HEADS, HEAD_DIM, NUM_SPLITS,
    BLOCK_D: tl.constexpr,
):
    bt = tl.program_id(0)  # (sequence, query token)
    b = bt // QUERIES
    t = bt % QUERIES
    h = tl.program_id(1)
    first = (bt.to(tl.int64) * HEADS + h) * NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    m = tl.max(tl.full([BLOCK_D], float("-inf"), dtype=tl.float32), axis=0)
    for split in range(0, NUM_SPLITS):
        m = tl.maximum(m, tl.load(PART_LSE + first + split))
    m = tl.where(m == float("-inf"), 0.0, m)  # no chunk with a key: every weight below is 0
    total = tl.sum(tl.zeros([BLOCK_D], dtype=tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for split in range(0, NUM_SPLITS):
        w = tl.exp2(tl.load(PART_LSE + first + split) - m)  # a chunk without a key: exp2(-inf) = 0
        total += w
        acc += w * tl.load(PART_O + (first + split) * HEAD_DIM + offs_d, mask=d_valid, other=0.0)
    o = acc / tl.where(total == 0.0, 1.0, total)
    tl.store(O + b.to(tl.int64) * stride_ob + t.to(tl.int64) * stride_ot + h.to(tl.int64) * stride_oh
             + offs_d * stride_od, o.to(O.dtype.element_ty), mask=d_valid)


def _fail(error, message: str):
    raise error(f"paged_decode_attention: {message}")


def _check_tensors(q, k_cache, v_cache, block_table, seq_lens) -> None:
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            _fail(TypeError, f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            _fail(TypeError, f"{name} has unsupported dtype {t.dtype}; supported: float32, float16, bfloat16")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        _fail(TypeError, f"q, k_cache, v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            _fail(TypeError, f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _INDEX_DTYPES:
            _fail(TypeError, f"{name} must be int32 or int64, got {t.dtype}")
    if q.dim() not in (3, 4):
        _fail(ValueError, f"q must have rank 3 ([B, H, D]) or 4 ([B, T, H, D]), got shape {tuple(q.shape)}")
    for name, t, rank in (("k_cache", k_cache, 4), ("v_cache", v_cache, 4), ("block_table", block_table, 2),
                          ("seq_lens", seq_lens, 1)):
        if t.dim() != rank:
            _fail(ValueError, f"{name} must have rank {rank}, got shape {tuple(t.shape)}")
        if t.device != q.device:
            _fail(ValueError, f"{name} is on {t.device}, q on {q.device}")
    if q.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        _fail(ValueError, f"q is on {q.device}; the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1)")


def _check_inputs(q, k_cache, v_cache, block_table, seq_lens, sm_scale, num_splits) -> tuple[float, int]:
    """Validate the arguments; return the resolved sm_scale and split count."""
    _check_tensors(q, k_cache, v_cache, block_table, seq_lens)
    batch, queries, heads, d = q.shape if q.dim() == 4 else (q.shape[0], 1, *q.shape[1:])
    pages, page_size, kv_heads, _ = k_cache.shape
    if min(batch, queries, heads, d) < 1 or d > MAX_HEAD_DIM:
        _fail(ValueError, f"q {tuple(q.shape)} needs every dim >= 1 (T >= 1 query tokens) and D <= 128")
    if min(pages, page_size, kv_heads) < 1:
        _fail(ValueError, f"k_cache {tuple(k_cache.shape)} needs every dim >= 1")
    if heads % kv_heads:
        _fail(ValueError, f"k_cache has {kv_heads} heads, which must divide q's {heads}")
    if k_cache.shape[3] != d:
        _fail(ValueError, f"k_cache's head dim {k_cache.shape[3]} differs from q's {d}")
    if v_cache.shape != k_cache.shape:
        _fail(ValueError, f"v_cache has shape {tuple(v_cache.shape)}, k_cache {tuple(k_cache.shape)}")
    if block_table.shape[0] != batch or seq_lens.shape[0] != batch:
        _fail(ValueError, f"block_table {tuple(block_table.shape)} and seq_lens {tuple(seq_lens.shape)} need q's "
                          f"batch {batch} (block_table, seq_lens)")
    lens = seq_lens.tolist()
    if any(n < 0 or n > block_table.shape[1] * page_size for n in lens):
        _fail(ValueError, f"seq_lens must lie in [0, max_pages * page_size = {block_table.shape[1] * page_size}], "
                          f"got {lens}")
    used = [block_table[b, :-(-n // page_size)] for b, n in enumerate(lens) if n]
    if used and not all(bool(((u >= 0) & (u < pages)).all()) for u in used):
        _fail(ValueError, f"block_table names a page outside [0, {pages}) for a cached token")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral)):
        _fail(TypeError, f"num_splits must be an int or None, got {num_splits!r}")
    if num_splits is not None and num_splits < 1:
        _fail(ValueError, f"num_splits must be >= 1, got {num_splits!r}")
    splits = 1 if num_splits is None else int(num_splits)
    if sm_scale is None:
        return 1.0 / math.sqrt(d), splits
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        _fail(TypeError, f"sm_scale must be a real number or None, got {sm_scale!r}")
    if not math.isfinite(float(sm_scale)) or sm_scale <= 0:
        _fail(ValueError, f"sm_scale must be finite and > 0, got {sm_scale!r}")
    return float(sm_scale), splits


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None, num_splits=None):
    """Decode attention over a paged KV cache ``o``; see the module docstring."""
    scale, splits = _check_inputs(q, k_cache, v_cache, block_table, seq_lens, sm_scale, num_splits)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    # T = 1 as a [B, 1, H, D] view, so one kernel serves both ranks
    q4, o4 = (q, o) if q.dim() == 4 else (q.unsqueeze(1), o.unsqueeze(1))
    batch, queries, heads, d = q4.shape
    block_n = 16 if _interpreting() else 64
    common = (*q4.stride(), *k_cache.stride(), *v_cache.stride(), *o4.stride(), *block_table.stride(),
              queries, heads, heads // k_cache.shape[2], d, k_cache.shape[1], splits, scale * LOG2E)
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        if splits == 1:
            _paged_decode_kernel[(batch * queries, heads)](
                q4, k_cache, v_cache, o4, o4, o4, block_table, seq_lens, *common,
                SPLIT=False, BLOCK_N=block_n, BLOCK_D=_block_d(d), num_warps=4)
            return o
        part_o = torch.empty((batch, queries, heads, splits, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch, queries, heads, splits), dtype=torch.float32, device=q.device)
        _paged_decode_kernel[(batch * queries * splits, heads)](
            q4, k_cache, v_cache, o4, part_o, part_lse, block_table, seq_lens, *common,
            SPLIT=True, BLOCK_N=block_n, BLOCK_D=_block_d(d), num_warps=4)
        _merge_splits_kernel[(batch * queries, heads)](
            part_o, part_lse, o4, *o4.stride(), queries, heads, d, splits, BLOCK_D=_block_d(d), num_warps=4)
    return o


paged_decode_attention.dtypes = _DTYPES
paged_decode_attention.supports_backward = False  # decode is inference: no autograd
paged_decode_attention.fp32_dot_precision = "ieee"  # fp32 elementwise products, no tl.dot
