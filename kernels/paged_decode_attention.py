"""Decode attention against a paged KV cache, in Triton (forward only: decode is inference).

Contract (docs/contract.md)::

    paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None) -> o

    q [B, H, D]: one query token per sequence (the newest)
    k_cache, v_cache [P, page_size, Hkv, D]: P physical pages of page_size token slots
    block_table [B, max_pages] int32: logical page p of sequence b is physical page
        block_table[b, p]; entries past cdiv(seq_lens[b], page_size) are never read
    seq_lens [B] int32: sequence b's cached tokens (its query's keys), 0 .. max_pages * page_size
    o [B, H, D] (input dtype): attention of q[b] over token j < seq_lens[b] at slot
        j % page_size of page block_table[b, j // page_size] (GQA: query head h reads KV
        head h // (H / Hkv)); the query is the sequence's last token, so it sees every key
        (the last row of the dense causal op on the gathered sequence); seq_lens[b] = 0: o = 0

One program per (sequence, query head) walks the sequence's tokens in blocks of BLOCK_N
logical positions, gathering each position's page from the block table (a key block may
span pages; pages may lie anywhere, in any order). Online softmax as in
``kernels/attention.py``; the q . k products are fp32 elementwise products summed over D
(a single query row is below tl.dot's smallest tile); P V likewise. Slots past seq_lens[b]
and pages the table does not name are never loaded, so a free page may hold anything.
Offsets into the cache are int64 (a cache passes 2**31 elements long before a table does).
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
    Q, K, V, O, TABLE, LENS,
    stride_qb, stride_qh, stride_qd,
    stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_oh, stride_od,
    stride_tb, stride_tp,
    H, GROUP, HEAD_DIM, PAGE_SIZE, qk_scale,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    n = tl.load(LENS + b).to(tl.int32)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_d * stride_qd,
                mask=d_valid, other=0.0).to(tl.float32)

    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), dtype=tl.float32), axis=0)  # fp32 scalars that
    l_i = tl.sum(tl.zeros([BLOCK_N], dtype=tl.float32), axis=0)  # the loop carries
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, n, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < n
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

    # seq_lens[b] = 0: no key, acc = 0 and l = 0: o = 0
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)
    tl.store(O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_d * stride_od,
             o.to(O.dtype.element_ty), mask=d_valid)


def _fail(error, message: str):
    raise error(f"paged_decode_attention: {message}")


def _check_inputs(q, k_cache, v_cache, block_table, seq_lens, sm_scale) -> float:
    """Validate the arguments; return the resolved sm_scale."""
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
    for name, t, rank in (("q", q, 3), ("k_cache", k_cache, 4), ("v_cache", v_cache, 4), ("block_table", block_table, 2),
                          ("seq_lens", seq_lens, 1)):
        if t.dim() != rank:
            _fail(ValueError, f"{name} must have rank {rank}, got shape {tuple(t.shape)}")
        if t.device != q.device:
            _fail(ValueError, f"{name} is on {t.device}, q on {q.device}")
    if q.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        _fail(ValueError, f"q is on {q.device}; the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1)")
    batch, heads, d = q.shape
    pages, page_size, kv_heads, _ = k_cache.shape
    if min(batch, heads, d, pages, page_size, kv_heads) < 1 or d > MAX_HEAD_DIM:
        _fail(ValueError, f"q {tuple(q.shape)} and k_cache {tuple(k_cache.shape)} need every dim >= 1, D <= 128")
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
    if sm_scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        _fail(TypeError, f"sm_scale must be a real number or None, got {sm_scale!r}")
    if not math.isfinite(float(sm_scale)) or sm_scale <= 0:
        _fail(ValueError, f"sm_scale must be finite and > 0, got {sm_scale!r}")
    return float(sm_scale)


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
    """Decode attention over a paged KV cache ``o``; see the module docstring."""
    scale = _check_inputs(q, k_cache, v_cache, block_table, seq_lens, sm_scale)
    batch, heads, d = q.shape
    o = torch.empty((batch, heads, d), dtype=q.dtype, device=q.device)
    block_n = 16 if _interpreting() else 64
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        _paged_decode_kernel[(batch, heads)](
            q, k_cache, v_cache, o, block_table, seq_lens,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), *o.stride(), *block_table.stride(),
            heads, heads // k_cache.shape[2], d, k_cache.shape[1], scale * LOG2E,
            BLOCK_N=block_n, BLOCK_D=_block_d(d), num_warps=4)
    return o


paged_decode_attention.dtypes = _DTYPES
paged_decode_attention.supports_backward = False  # decode is inference: no autograd
paged_decode_attention.fp32_dot_precision = "ieee"  # fp32 elementwise products, no tl.dot
