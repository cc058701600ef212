"""Variable-length (packed) flash attention, forward and backward, in Triton.

Contract (docs/contract.md)::

    varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None,
                     window=(-1, -1), softcap=0.0) -> (o, lse)

    q [Tq, H, D], k and v [Tk, Hkv, D]: the tokens of B sequences packed one after another
    cu_seqlens_q, cu_seqlens_k [B + 1] int32 (or int64): sequence b's queries are rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q, its keys rows cu_seqlens_k[b] ..
    cu_seqlens_k[b + 1] - 1 of k and v; both start at 0, never decrease, and end at Tq, Tk
    o [Tq, H, D] (input dtype), lse [H, Tq] float32 (natural log)

Each sequence is the dense op (``kernels/attention.py``'s contract) on its own tokens:
GQA (query head h reads KV head h // (H / Hkv)), masks bottom-right aligned per sequence
(diag_b = Nk_b - Nq_b), causal and windows, softcap. A sequence of zero queries has no
rows; a row that sees no key (Nk_b = 0, or a band that misses every key) gets o = 0,
lse = -inf and zero gradients.

Forward: one program per (query block of a sequence, sequence, query head). A program
reads its sequence's bounds from cu_seqlens, so every sequence gets
cdiv(max_b Nq_b, BLOCK_M) programs and the ones past its own rows do nothing. The body
is the dense kernel's online softmax (the device helpers are imported from
``kernels/attention.py``: ``_mma``, ``_band_keep``, ``_scores``) with the row and key
offsets started at the sequence's first token. Token offsets are int64 (a packed batch
passes 2**31 elements long before any one sequence does).

Backward: delta = rowsum(dO * O) in fp32 (torch: one reduction of D terms), one kernel for
dq (a program per query block walks its sequence's key blocks) and one for dk, dv (a
program per key block and KV head walks the query blocks of every query head of its
group): no atomics, deterministic. Keys of a sequence without queries get dk = dv = 0.

Accepted inputs: dtypes float32, float16, bfloat16 (q, k, v one dtype), any strides of q,
k, v; head dims 1 .. 128; Hkv dividing H; B >= 1 sequences; ``window`` a pair of ints
each >= 0 or -1; ``softcap`` finite and >= 0; ``sm_scale`` None or finite and > 0. Dot
precision and block sizes are the dense kernel's (``_dot_mode``, ``_fwd_config``,
``_bwd_config``): 16 x 16 under the interpreter.
"""
from __future__ import annotations

import contextlib
import math
import numbers

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.attention import (
    _DTYPES,
    FP32_DOT_PRECISION,
    LOG2E,
    MAX_HEAD_DIM,
    _band_keep,
    _block_d,
    _bwd_config,
    _check_window,
    _dot_mode,
    _fwd_config,
    _interpreting,
    _mma,
    _scores,
)
from tritoncheck.kernels.specialisation import unspecialised_jit

_LOG2E = tl.constexpr(LOG2E)
_LN2 = tl.constexpr(0.6931471805599453)
_OFFSET_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _sequence(CU_Q, CU_K, seq):
    """(first query row, Nq, first key row, Nk) of sequence ``seq``; rows as int64."""
    q0 = tl.load(CU_Q + seq).to(tl.int64)
    k0 = tl.load(CU_K + seq).to(tl.int64)
    n_q = (tl.load(CU_Q + seq + 1).to(tl.int64) - q0).to(tl.int32)
    n_k = (tl.load(CU_K + seq + 1).to(tl.int64) - k0).to(tl.int32)
    return q0, n_q, k0, n_k


@triton.jit
def _sequence_band(n_q, n_k, LEFT, RIGHT):
    """(BAND_LO, BAND_HI) of one sequence: query i keeps keys i + BAND_LO <= j <= i + BAND_HI,
    diag = Nk - Nq; an unbounded side (-1) gets a bound past every key (kernels.attention._band)."""
    diag = n_k - n_q
    band_lo = diag - tl.where(LEFT >= 0, LEFT, n_k)
    band_hi = diag + tl.where(RIGHT >= 0, RIGHT, n_q)
    return band_lo, band_hi


@unspecialised_jit
def _varlen_fwd_kernel(
    Q, K, V, O, LSE,  # q [Tq, H, D], k, v [Tk, Hkv, D], o [Tq, H, D], lse [H, Tq] float32
    CU_Q, CU_K,  # [B + 1] offsets
    stride_qt, stride_qh, stride_qd,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od,
    T_Q, GROUP, HEAD_DIM,
    qk_scale, sm_scale, softcap,
    LEFT, RIGHT,  # the window's sides, causal folded into RIGHT; -1 unbounded
    IS_BANDED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    FP16_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    seq = tl.program_id(1)
    off_h = tl.program_id(2)
    off_kvh = off_h // GROUP
    q0, n_q, k0, n_k = _sequence(CU_Q, CU_K, seq)
    band_lo, band_hi = _sequence_band(n_q, n_k, LEFT, RIGHT)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < n_q
    d_valid = offs_d < HEAD_DIM
    rows = q0 + offs_m  # int64 token rows

    q = tl.load(Q + rows[:, None] * stride_qt + off_h.to(tl.int64) * stride_qh + offs_d[None, :] * stride_qd,
                mask=m_valid[:, None] & d_valid[None, :], other=0.0).to(tl.float32)
    k_base = K + k0 * stride_kt + off_kvh.to(tl.int64) * stride_kh
    v_base = V + k0 * stride_vt + off_kvh.to(tl.int64) * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if IS_BANDED:
        lo = tl.maximum(pid_m * BLOCK_M + band_lo, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum((pid_m + 1) * BLOCK_M + band_hi, n_k)
    else:
        lo = 0
        hi = n_k
    hi = tl.where(pid_m * BLOCK_M < n_q, hi, lo)  # a block past the sequence's rows reads no key

    for start_n in range(lo, hi, BLOCK_N):
        offs_kn = start_n + offs_n
        n_valid = offs_kn < n_k
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = tl.load(k_base + offs_kn[:, None].to(tl.int64) * stride_kt + offs_d[None, :] * stride_kd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_base + offs_kn[:, None].to(tl.int64) * stride_vt + offs_d[None, :] * stride_vd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        s, _ = _scores(_mma(q, tl.trans(k), FP16_DOT, DOT_PRECISION), offs_m, offs_kn, sm_scale, qk_scale,
                       softcap, 0.0, 0, HAS_SOFTCAP, False)
        # keys past the sequence's last one score -inf (the next sequence's keys are there)
        s = tl.where(n_valid[None, :], s, float("-inf"))
        if IS_BANDED:
            s = tl.where(_band_keep(offs_m, offs_kn, band_lo, band_hi), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_off = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_off)
        p = tl.exp2(s - m_off[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _mma(p, v, FP16_DOT, DOT_PRECISION)
        m_i = m_new

    # a row that saw no key (Nk = 0, or a band that misses every key): o = 0, lse = -inf
    empty = l_i == 0.0
    l_i = tl.where(empty, 1.0, l_i)
    o = acc / l_i[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_i)) * _LN2)
    tl.store(O + rows[:, None] * stride_ot + off_h.to(tl.int64) * stride_oh + offs_d[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
    tl.store(LSE + off_h.to(tl.int64) * T_Q + rows, lse, mask=m_valid)


@unspecialised_jit
def _varlen_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,  # DELTA [H, Tq] float32; DQ [Tq, H, D] contiguous
    CU_Q, CU_K,
    stride_qt, stride_qh, stride_qd,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_dot, stride_doh, stride_dod,
    stride_dqt, stride_dqh, stride_dqd,
    T_Q, GROUP, HEAD_DIM,
    qk_scale, sm_scale, softcap,
    LEFT, RIGHT,
    IS_BANDED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    FP16_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    seq = tl.program_id(1)
    off_h = tl.program_id(2)
    off_kvh = off_h // GROUP
    q0, n_q, k0, n_k = _sequence(CU_Q, CU_K, seq)
    band_lo, band_hi = _sequence_band(n_q, n_k, LEFT, RIGHT)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_nb = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < n_q
    d_valid = offs_d < HEAD_DIM
    qm_mask = m_valid[:, None] & d_valid[None, :]
    rows = q0 + offs_m

    q = tl.load(Q + rows[:, None] * stride_qt + off_h.to(tl.int64) * stride_qh + offs_d[None, :] * stride_qd,
                mask=qm_mask, other=0.0).to(tl.float32)
    do = tl.load(DO + rows[:, None] * stride_dot + off_h.to(tl.int64) * stride_doh + offs_d[None, :] * stride_dod,
                 mask=qm_mask, other=0.0).to(tl.float32)
    lse2 = tl.load(LSE + off_h.to(tl.int64) * T_Q + rows, mask=m_valid, other=0.0) * _LOG2E
    delta = tl.load(DELTA + off_h.to(tl.int64) * T_Q + rows, mask=m_valid, other=0.0)
    k_base = K + k0 * stride_kt + off_kvh.to(tl.int64) * stride_kh
    v_base = V + k0 * stride_vt + off_kvh.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if IS_BANDED:
        lo = tl.maximum(pid_m * BLOCK_M + band_lo, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum((pid_m + 1) * BLOCK_M + band_hi, n_k)
    else:
        lo = 0
        hi = n_k
    hi = tl.where(pid_m * BLOCK_M < n_q, hi, lo)

    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_nb
        n_valid = offs_n < n_k
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kt + offs_d[None, :] * stride_kd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vt + offs_d[None, :] * stride_vd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        s, t = _scores(_mma(q, tl.trans(k), FP16_DOT, DOT_PRECISION), offs_m, offs_n, sm_scale, qk_scale,
                       softcap, 0.0, 0, HAS_SOFTCAP, False)
        keep = m_valid[:, None] & n_valid[None, :]
        if IS_BANDED:
            keep = keep & _band_keep(offs_m, offs_n, band_lo, band_hi)
        # P <= 1 exactly (the clamp: kernels.attention); no s - lse outside the kept pairs
        p = tl.where(keep, tl.exp2(tl.minimum(s - lse2[:, None], 0.0)), 0.0)
        dp = _mma(do, tl.trans(v), FP16_DOT, DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq += _mma(ds, k, FP16_DOT, DOT_PRECISION)

    dq = dq * sm_scale
    tl.store(DQ + rows[:, None] * stride_dqt + off_h.to(tl.int64) * stride_dqh + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=qm_mask)


@unspecialised_jit
def _varlen_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,  # DK, DV [Tk, Hkv, D] contiguous
    CU_Q, CU_K,
    stride_qt, stride_qh, stride_qd,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_dot, stride_doh, stride_dod,
    stride_dkt, stride_dkh, stride_dkd,
    T_Q, GROUP, HEAD_DIM,
    qk_scale, sm_scale, softcap,
    LEFT, RIGHT,
    IS_BANDED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    FP16_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # one program per (key block of a sequence, sequence, KV head): the group's query heads
    # are summed here in fp32 (no atomics)
    pid_n = tl.program_id(0)
    seq = tl.program_id(1)
    off_kvh = tl.program_id(2)
    q0, n_q, k0, n_k = _sequence(CU_Q, CU_K, seq)
    band_lo, band_hi = _sequence_band(n_q, n_k, LEFT, RIGHT)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_mb = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    n_valid = offs_n < n_k
    d_valid = offs_d < HEAD_DIM
    kv_mask = n_valid[:, None] & d_valid[None, :]
    keys = k0 + offs_n

    k = tl.load(K + keys[:, None] * stride_kt + off_kvh.to(tl.int64) * stride_kh + offs_d[None, :] * stride_kd,
                mask=kv_mask, other=0.0).to(tl.float32)
    v = tl.load(V + keys[:, None] * stride_vt + off_kvh.to(tl.int64) * stride_vh + offs_d[None, :] * stride_vd,
                mask=kv_mask, other=0.0).to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    if IS_BANDED:
        lo = tl.maximum(pid_n * BLOCK_N - band_hi, 0) // BLOCK_M * BLOCK_M
        hi = tl.minimum((pid_n + 1) * BLOCK_N - band_lo, n_q)
    else:
        lo = 0
        hi = n_q
    hi = tl.where(pid_n * BLOCK_N < n_k, hi, lo)

    for g in range(0, GROUP):
        off_h = off_kvh * GROUP + g
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + offs_mb
            m_valid = offs_m < n_q
            qm_mask = m_valid[:, None] & d_valid[None, :]
            rows = q0 + offs_m
            q = tl.load(Q + rows[:, None] * stride_qt + off_h.to(tl.int64) * stride_qh
                        + offs_d[None, :] * stride_qd, mask=qm_mask, other=0.0).to(tl.float32)
            do = tl.load(DO + rows[:, None] * stride_dot + off_h.to(tl.int64) * stride_doh
                         + offs_d[None, :] * stride_dod, mask=qm_mask, other=0.0).to(tl.float32)
            lse2 = tl.load(LSE + off_h.to(tl.int64) * T_Q + rows, mask=m_valid, other=0.0) * _LOG2E
            delta = tl.load(DELTA + off_h.to(tl.int64) * T_Q + rows, mask=m_valid, other=0.0)
            s, t = _scores(_mma(q, tl.trans(k), FP16_DOT, DOT_PRECISION), offs_m, offs_n, sm_scale, qk_scale,
                           softcap, 0.0, 0, HAS_SOFTCAP, False)
            keep = m_valid[:, None] & n_valid[None, :]
            if IS_BANDED:
                keep = keep & _band_keep(offs_m, offs_n, band_lo, band_hi)
            p = tl.where(keep, tl.exp2(tl.minimum(s - lse2[:, None], 0.0)), 0.0)
            dv += _mma(tl.trans(p), do, FP16_DOT, DOT_PRECISION)
            dp = _mma(do, tl.trans(v), FP16_DOT, DOT_PRECISION)
            ds = p * (dp - delta[:, None])
            if HAS_SOFTCAP:
                ds = ds * (1.0 - t * t)
            dk += _mma(tl.trans(ds), q, FP16_DOT, DOT_PRECISION)

    dk = dk * sm_scale
    out = keys[:, None] * stride_dkt + off_kvh.to(tl.int64) * stride_dkh + offs_d[None, :] * stride_dkd
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=kv_mask)


# ----------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------
def _check_offsets(name: str, cu: object, total: int, device: torch.device) -> list[int]:
    """cu_seqlens as a list of ints: an int32 or int64 tensor [B + 1] on q's device, starting
    at 0, never decreasing, ending at the packed tensor's token count ``total``."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"varlen_attention: {name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype not in _OFFSET_DTYPES:
        raise TypeError(f"varlen_attention: {name} must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"varlen_attention: {name} must have shape [B + 1] with B >= 1, got {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"varlen_attention: {name} is on {cu.device}, q on {device}")
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"varlen_attention: {name} must start at 0, got {values[0]}")
    if any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"varlen_attention: {name} must not decrease, got {values}")
    if values[-1] != total:
        raise ValueError(f"varlen_attention: {name} ends at {values[-1]}, but the packed tensor holds {total} tokens")
    return values


def _check_inputs(q, k, v, cu_q, cu_k, causal, sm_scale, window, softcap):
    """Validate the arguments; return (sm_scale, window, offsets of q, offsets of k)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"varlen_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"varlen_attention: {name} has unsupported dtype {t.dtype}; supported: "
                            "torch.float32, torch.float16, torch.bfloat16")
        if t.dim() != 3:
            raise ValueError(f"varlen_attention: {name} must have rank 3 [T, H, D], got shape {tuple(t.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"varlen_attention: q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"varlen_attention: {name} is on {t.device}, q on {q.device}")
    if q.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"varlen_attention: q is on {q.device}; the Triton kernel needs CUDA tensors "
                         "(or TRITON_INTERPRET=1 for CPU tensors)")
    t_q, heads, d = q.shape
    if not 1 <= d <= MAX_HEAD_DIM or heads < 1:
        raise ValueError(f"varlen_attention: q's heads and head dim must be >= 1 and D <= {MAX_HEAD_DIM}, "
                         f"got shape {tuple(q.shape)}")
    if k.shape[1] < 1 or heads % k.shape[1]:
        raise ValueError(f"varlen_attention: k has {k.shape[1]} heads, which must divide q's {heads}")
    if k.shape[2] != d:
        raise ValueError(f"varlen_attention: k's head dim {k.shape[2]} differs from q's {d}")
    if v.shape != k.shape:
        raise ValueError(f"varlen_attention: v has shape {tuple(v.shape)}, k {tuple(k.shape)}; they must match")
    offsets_q = _check_offsets("cu_seqlens_q", cu_q, t_q, q.device)
    offsets_k = _check_offsets("cu_seqlens_k", cu_k, k.shape[0], q.device)
    if len(offsets_k) != len(offsets_q):
        raise ValueError(f"varlen_attention: cu_seqlens_k holds {len(offsets_k) - 1} sequences, "
                         f"cu_seqlens_q {len(offsets_q) - 1}")
    if not isinstance(causal, bool):
        raise TypeError(f"varlen_attention: causal must be a bool, got {causal!r}")
    window = _checked_window(window)
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"varlen_attention: softcap must be a real number (0 = off), got {softcap!r}")
    if not math.isfinite(float(softcap)) or softcap < 0:
        raise ValueError(f"varlen_attention: softcap must be finite and >= 0 (0 = off), got {softcap!r}")
    if sm_scale is None:
        return 1.0 / math.sqrt(d), window, offsets_q, offsets_k
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"varlen_attention: sm_scale must be a real number or None, got {sm_scale!r}")
    if not math.isfinite(float(sm_scale)) or sm_scale <= 0:
        raise ValueError(f"varlen_attention: sm_scale must be finite and > 0, got {sm_scale!r}")
    return float(sm_scale), window, offsets_q, offsets_k


def _checked_window(window) -> tuple[int, int]:
    """The dense kernel's window check, its messages naming this op."""
    try:
        return _check_window(window)
    except (TypeError, ValueError) as exc:
        raise type(exc)(str(exc).replace("attention:", "varlen_attention:", 1)) from None


def _sides(causal: bool, window: tuple[int, int]) -> tuple[bool, int, int]:
    """(IS_BANDED, LEFT, RIGHT): the band's sides with causal folded into RIGHT (<= 0)."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return causal or left >= 0 or right >= 0, left, right


def _longest(offsets: list[int]) -> int:
    return max(b - a for a, b in zip(offsets, offsets[1:]))


def _launch_args(q, sm_scale, softcap, causal, window):
    banded, left, right = _sides(causal, window)
    fp16_dot, precision = _dot_mode(q.dtype)
    scalars = (sm_scale * LOG2E, sm_scale, softcap or 1.0, left, right)
    flags = dict(IS_BANDED=banded, HAS_SOFTCAP=softcap > 0, FP16_DOT=fp16_dot, DOT_PRECISION=precision)
    return scalars, flags


def _forward(q, k, v, cu_q, cu_k, offsets_q, offsets_k, causal, sm_scale, window, softcap):
    t_q, heads, d = q.shape
    block_d = _block_d(d)
    block_m, block_n, num_warps = _fwd_config(q.dtype, block_d)
    o = torch.zeros_like(q, memory_format=torch.contiguous_format)
    lse = torch.full((heads, t_q), float("-inf"), dtype=torch.float32, device=q.device)
    longest = _longest(offsets_q)
    if longest == 0:
        return o, lse
    scalars, flags = _launch_args(q, sm_scale, softcap, causal, window)
    grid = (triton.cdiv(longest, block_m), len(offsets_q) - 1, heads)
    _varlen_fwd_kernel[grid](
        q, k, v, o, lse, cu_q, cu_k, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        t_q, heads // k.shape[1], d, *scalars, **flags,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=num_warps)
    return o, lse


def _backward(q, k, v, o, lse, do, cu_q, cu_k, offsets_q, offsets_k, causal, sm_scale, window, softcap):
    t_q, heads, d = q.shape
    block_d = _block_d(d)
    block_m, block_n, num_warps = _bwd_config(q.dtype, block_d)
    # delta_i = sum_d dO_id O_id in fp32, laid out like lse
    delta = (do.float() * o.float()).sum(-1).transpose(0, 1).contiguous()
    dq = torch.zeros((t_q, heads, d), dtype=q.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=k.dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=v.dtype, device=q.device)
    scalars, flags = _launch_args(q, sm_scale, softcap, causal, window)
    common = (cu_q, cu_k, *q.stride(), *k.stride(), *v.stride(), *do.stride())
    tail = (t_q, heads // k.shape[1], d, *scalars)
    blocks = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=num_warps)
    sequences = len(offsets_q) - 1
    if _longest(offsets_q) > 0:
        _varlen_bwd_dq_kernel[(triton.cdiv(_longest(offsets_q), block_m), sequences, heads)](
            q, k, v, do, lse, delta, dq, *common, *dq.stride(), *tail, **flags, **blocks)
    if _longest(offsets_k) > 0:
        _varlen_bwd_dkdv_kernel[(triton.cdiv(_longest(offsets_k), block_n), sequences, k.shape[1])](
            q, k, v, do, lse, delta, dk, dv, *common, *dk.stride(), *tail, **flags, **blocks)
    return dq, dk, dv


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, offsets_q, offsets_k, causal, sm_scale, window, softcap):
        o, lse = _forward(q, k, v, cu_q, cu_k, offsets_q, offsets_k, causal, sm_scale, window, softcap)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.args = (offsets_q, offsets_k, causal, sm_scale, window, softcap)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        if do.dtype != q.dtype:
            do = do.to(q.dtype)
        dq, dk, dv = _backward(q, k, v, o, lse, do, cu_q, cu_k, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None, window=(-1, -1),
                     softcap=0.0):
    """Packed variable-length flash attention ``(o, lse)``; see the module docstring."""
    scale, window, offsets_q, offsets_k = _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, sm_scale,
                                                        window, softcap)
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        return _VarlenAttention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, offsets_q, offsets_k, bool(causal), scale,
                                      window, float(softcap))


varlen_attention.dtypes = _DTYPES
varlen_attention.supports_backward = True
varlen_attention.fp32_dot_precision = FP32_DOT_PRECISION
varlen_attention.bf16_dot_upcast = True  # bf16 is upcast before every tl.dot, as in kernels/attention.py
