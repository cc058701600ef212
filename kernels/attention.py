"""Flash attention (forward and backward) in Triton.

Contract (docs/contract.md)::

    attention(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None,
              softcap=0.0, dropout_p=0.0, seed=0, return_keep=False) -> (o, lse) or (o, lse, keep)

    q [B, H, Nq, D], k and v [B, Hkv, Nk, D], H % Hkv == 0 (v has the same D as q)
    query head h reads KV head h // (H / Hkv)          (GQA; MQA is Hkv = 1)
    s[i, j] = sm_scale * <q_i, k_j>                   sm_scale defaults to 1/sqrt(D)
    s[i, j] = softcap * tanh(s[i, j] / softcap)        if softcap > 0
    s[i, j] -= slope[b, h] * |i + Nk - Nq - j|         ALiBi, slopes [H] or [B, H] float32
    s[i, j] = -inf  outside the band, bottom-right aligned (diag = Nk - Nq):
              causal keeps j <= i + diag; window (left, right) keeps
              i + diag - left <= j <= i + diag + right (-1: unbounded)
    lse[i]  = log(sum_j exp(s[i, j]))                  float32, natural log, [B, H, Nq]
    o[i]    = sum_j exp(s[i, j] - lse[i]) v_j          input dtype, [B, H, Nq, D]
    a row with no key in its band: o = 0, lse = -inf, zero gradients
    dropout_p > 0: o[i] = sum_j exp(s[i, j] - lse[i]) keep[i, j] / (1 - dropout_p) v_j,
              lse unchanged (dropout-free); return_keep=True also returns keep [B, H, Nq, Nk] bool

Dropout (``dropout_p`` in [0, 1), ``seed`` an int in [0, 2**63)). The softmax weights P are
dropped after the softmax, the kept ones scaled by 1 / (1 - dropout_p); lse and the
normaliser l stay dropout-free (l sums every weight, kept or not). The keep mask is drawn
by Triton's counter-based Philox 4x32-10, ``tl.rand(seed, counter) >= dropout_p`` (fp32
uniform in [0, 1); ``>=`` keeps everything at p = 0), with the counter

    counter[b, h, i, j] = ((b * H + h) * Nq + i) * Nk + j      (int64)

the flat index of (b, h, i, j) in a contiguous [B, H, Nq, Nk] mask. tl.rand splits an int64
counter into Philox's first two 32-bit counter words (low, high) and the seed into its two
key words, so the mask is a function of (seed, b, h, i, j) and the shape alone: not of the
block sizes, the strides, the launch grid or the backend (the interpreter's NumPy Philox
and the GPU's give the same bits; tests/test_attention_kernel.py recomputes the mask from
this formula in NumPy). The counter is formed in int64 because B * H * Nq * Nk passes
2**31 at realistic sizes (32 heads of 8192 x 8192 is 2**31 already); counters are distinct
for B * H * Nq * Nk < 2**64. Every program recomputes its tile's mask from the counter
(forward, both backward kernels, and the keep kernel behind return_keep all call one
helper, ``_dropout_keep``), so no mask is stored between forward and backward. The
returned keep holds the raw draw at every (i, j), pairs outside the band included (there
P = 0, so their entries do not matter to o). At dropout_p = 0 no mask is drawn: the call
is the plain kernel, bit for bit.

In the forward, the tile's P is masked before the P V product and the accumulator is
divided by l and multiplied by 1 / (1 - p) once at the end: o = acc * (scale_drop / l),
scale_drop = 1 / (1 - p) rounded once from fp64 to fp32. The backward, with M the mask
and c = 1 / (1 - p), o_i = sum_j P_ij c M_ij v_j:
    dV     = (P * M)^T dO * c
    dP'_ij = d loss / d P_ij = c M_ij dO_i . v_j          (dO V^T masked and scaled)
    dS_ij  = P_ij (dP'_ij - sum_k P_ik dP'_ik) = P_ij (dP'_ij - delta_i),
    delta_i = sum_k P_ik c M_ik dO_i . v_k = dO_i . o_i     (the same rowsum(dO * O) as
                                                             without dropout, O the dropped output)
and dq, dk from dS as before.

Forward (FlashAttention-2 style): one program per (query block, batch*head). It walks
the key blocks once, keeping per query row a running max ``m`` and a running sum
``l = sum_j exp(s_ij - m)`` and an unnormalised accumulator ``acc = sum_j exp(s_ij - m) v_j``.
When a new block raises the max from ``m`` to ``m'`` the old sums are rescaled by
``alpha = exp(m - m')`` (online softmax), and at the end ``o = acc / l``,
``lse = m + log(l)``. Scores are kept in log2 units (``log2(e)`` folded into the scale)
so the exponentials are ``exp2``; ``lse`` is converted back to natural log on store.
Causal and windowed programs walk only the key blocks their rows' bands touch; the band
is one mask (causal is its right edge at 0). Keys past ``Nk`` in the last block get the
score ``-inf`` (the identity of the max; ``exp2(-inf) = 0`` for the sums), never 0.
Query rows past ``Nq`` are loaded as zeros (finite scores, no NaN) and never stored.

Backward: ``dv = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - delta)`` with
``delta_i = sum_d dO_id O_id`` (preprocess kernel, fp32), ``dq = scale dS K``,
``dk = scale dS^T Q``. P is recomputed blockwise from the saved LSE (no N x N matrix in
memory). One kernel computes dk and dv (a program per key block and KV head walks the
query blocks of every query head of its group, so GQA's sums over a group stay in one
fp32 accumulator) and one computes dq (a program per query block walks the key blocks):
no atomics, the result is deterministic. ``lse`` is returned non-differentiable, and so
are the ALiBi slopes. With a softcap, dS is multiplied by d s_c / d s = 1 - tanh^2.

Accepted inputs:
- dtypes float32, float16, bfloat16 (all three tensors the same dtype), any strides
  (all four strides of each tensor are passed to the kernels; nothing is copied);
- head dims D = 1 .. 128 (D is padded with masks to BLOCK_D = max(16, next_pow2(D)), so
  the compiled variants are D in {16, 32, 64, 128}); v's head dim must equal q's;
- any Nq, Nk >= 1 and B, H >= 1 (empty tensors raise ValueError), Hkv dividing H;
- ``window``: a pair of ints, each >= 0 or -1; ``softcap``: finite, >= 0 (0 = off);
  ``alibi_slopes``: None or a finite float32 tensor [H] or [B, H] on q's device;
- ``sm_scale``: None or a finite real number > 0 (a softmax temperature; 0, negative,
  NaN or inf raise ValueError, a non-number TypeError);
- ``dropout_p``: a real number in [0, 1) (TypeError for a non-number or a bool,
  ValueError otherwise); ``seed``: an int in [0, 2**63); ``return_keep``: a bool.

Dot products (all accumulate in fp32):
- float32: ``tl.dot(..., input_precision="ieee")`` (full fp32 on GPU and interpreter);
  ``attention.fp32_dot_precision == "ieee"``.
- float16: fp16 tensor-core dots; P and dS are rounded to fp16 before their dots (the
  usual FlashAttention choice).
- bfloat16: loaded, upcast to fp32, and multiplied with tf32 dots. bf16 values are
  exact in tf32, so Q K^T products are exact; P and dS are rounded to tf32 on the GPU
  (kept in fp32 by the interpreter). This keeps every bf16 operand out of ``tl.dot``
  and arithmetic, so bf16 runs correctly under the Triton interpreter too (except that
  the interpreter truncates the final fp32 -> bf16 store where the GPU rounds).

Block sizes: BLOCK_M = BLOCK_N = 16 under the interpreter (TRITON_INTERPRET=1, so
fuzzed cases stay fast and a multi-block case needs only N > 16); on the GPU 64 x 64
for the forward (64 x 32 for fp32/bf16 with D = 128) and 32 x 32 (D <= 64) / 32 x 16
for the backward; the keep kernel behind return_keep 64 x 64 on both (the interpreter's
cost is per program, and the mask does not depend on blocks). No runtime argument is
specialised on (sizes, strides, the seed, pointer alignment: kernels/specialisation.py),
so fuzzing many shapes and layouts compiles one variant per (dtype class, BLOCK_D,
banded, softcap, ALiBi, dropout).
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.specialisation import unspecialised_jit

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2):   log(x) = log2(x) * LN2
# the same as constexprs, the only kind of global a compiled kernel may read
_LOG2E = tl.constexpr(LOG2E)
_LN2 = tl.constexpr(LN2)

MAX_HEAD_DIM = 128
FP32_DOT_PRECISION = "ieee"



def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# ----------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------
@triton.jit
def _mma(a, b, FP16_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a @ b with fp32 accumulation. a, b are fp32 tiles.

    FP16_DOT 1: round both operands to fp16 and use the fp16 tensor-core dot (float16
    inputs: q, k, v are exact in fp16, P and dS are rounded). FP16_DOT 2, under the
    interpreter: the same rounded operands multiplied as fp32 ("ieee"), which is the same
    arithmetic (a product of two fp16 values is exact in fp32, the sum accumulates in
    fp32) without NumPy's float16 matmul, which has no BLAS and made a float16 attention
    example cost several times a float32 one on CI. Otherwise (0) an fp32 dot with
    DOT_PRECISION ("ieee" for float32 inputs, "tf32" for bfloat16 inputs, which are
    exact in tf32).
    """
    if FP16_DOT == 1:
        r = tl.dot(a.to(tl.float16), b.to(tl.float16))
    elif FP16_DOT == 2:
        r = tl.dot(a.to(tl.float16).to(tl.float32), b.to(tl.float16).to(tl.float32), input_precision="ieee")
    else:
        r = tl.dot(a, b, input_precision=DOT_PRECISION)
    return r


@triton.jit
def _band_keep(offs_m, offs_n, BAND_LO, BAND_HI):
    """[BLOCK_M, BLOCK_N] mask of the (query i, key j) pairs a banded call keeps:
    i + BAND_LO <= j <= i + BAND_HI. With diag = Nk - Nq (bottom-right alignment),
    BAND_LO = diag - left and BAND_HI = diag + right (causal: right = 0); an unbounded
    side gets a bound past every key (see ``_band``)."""
    return (offs_n[None, :] >= offs_m[:, None] + BAND_LO) & (offs_n[None, :] <= offs_m[:, None] + BAND_HI)


@triton.jit
def _tanh(x):
    """tanh(x) = 1 - 2 / (exp(2x) + 1) in fp32: exp(2x) = inf gives 1, exp(2x) = 0 gives -1,
    so no NaN for any finite x. Absolute error: exp's EXP_ULPS u on e = exp(2x), then +1,
    the division and 1 - y (each u): 2 / (e + 1) lies in (0, 2), so |error| <= 2 (EXP_ULPS
    + 3) u + u. Near 0 that is all of it (the relative error of a tiny tanh is large)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _scores(qk, offs_m, offs_n, sm_scale, qk_scale, softcap, slope, DIAG,
            HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Scores of a [BLOCK_M, BLOCK_N] tile of dot products qk, in log2 units, and the
    softcap's t = tanh(s / softcap) (the backward's d s_capped / d s = 1 - t^2):
        s = sm_scale qk;  softcap: s = softcap tanh(s / softcap);  ALiBi: s -= slope |i + diag - j|
    (diag = Nk - Nq: the ALiBi distance is to the row's bottom-right diagonal key). Without
    either, s log2(e) is one product with qk_scale = sm_scale log2(e), as before them."""
    if HAS_SOFTCAP or HAS_ALIBI:
        s = qk * sm_scale
        t = s
        if HAS_SOFTCAP:
            t = _tanh(s / softcap)
            s = softcap * t
        if HAS_ALIBI:
            dist = tl.abs(offs_m[:, None] + DIAG - offs_n[None, :]).to(tl.float32)  # exact below 2^24
            s = s - slope * dist
        s2 = s * _LOG2E
    else:
        s2 = qk * qk_scale
        t = qk
    return s2, t


@triton.jit
def _dropout_keep(seed, off_b, off_h, H, offs_m, offs_n, N_Q, N_K, drop_p):
    """[BLOCK_M, BLOCK_N] keep mask of query rows offs_m and keys offs_n of head (off_b, off_h):
    Philox uniform(seed, ((b H + h) Nq + i) Nk + j) >= p, the counter in int64 (module docstring).
    Padded rows and keys get some other element's draw; their P is 0."""
    counter = ((off_b.to(tl.int64) * H + off_h) * N_Q + offs_m[:, None]) * N_K + offs_n[None, :]
    return tl.rand(seed, counter) >= drop_p


@triton.jit
def _kv_head(off_h, H, GROUP):
    """The KV head a query head reads (GQA): query heads h of one group of GROUP = H / Hkv
    consecutive heads share KV head h // GROUP."""
    return off_h // GROUP


# ----------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------
@unspecialised_jit
def _attn_fwd_kernel(
    Q,  # *[B, H, Nq, D] queries, any strides
    K,  # *[B, Hkv, Nk, D] keys, any strides
    V,  # *[B, Hkv, Nk, D] values, any strides
    O,  # *[B, H, Nq, D] output (input dtype), any strides
    LSE,  # *[B, H, Nq] float32 natural-log logsumexp, contiguous
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H,  # number of query heads
    GROUP,  # query heads per KV head, H / Hkv
    N_Q,  # number of query rows
    N_K,  # number of keys
    HEAD_DIM,  # D (<= BLOCK_D)
    qk_scale,  # sm_scale * log2(e): scores in log2 units
    BAND_LO,  # banded calls keep keys i + BAND_LO <= j <= i + BAND_HI
    BAND_HI,
    ALIBI,  # *[B, H] float32 ALiBi slopes (stride_ab 0 for [H]); unused without HAS_ALIBI
    stride_ab, stride_ah,
    sm_scale,  # natural-units scale (the softcap and ALiBi path)
    softcap,  # > 0 with HAS_SOFTCAP
    DIAG,  # Nk - Nq, the ALiBi distance's origin
    seed,  # Philox seed of the dropout mask; unused without HAS_DROPOUT
    drop_p,  # dropout probability, 0 < p < 1 with HAS_DROPOUT
    drop_scale,  # 1 / (1 - drop_p), rounded once to fp32
    IS_BANDED: tl.constexpr,  # causal or a window: the band mask and loop bounds apply
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    FP16_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = pid_bh // H
    off_h = pid_bh % H
    off_kvh = _kv_head(off_h, H, GROUP)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < N_Q
    d_valid = offs_d < HEAD_DIM

    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh

    # Padded query rows and padded head-dim lanes load as 0: their scores are finite.
    q = tl.load(
        q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=m_valid[:, None] & d_valid[None, :], other=0.0,
    ).to(tl.float32)

    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(ALIBI + off_b * stride_ab + off_h * stride_ah)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # running sum of exp2(s - m_i) v

    if IS_BANDED:
        # the block's rows i0 .. i1 - 1 see keys i0 + BAND_LO .. i1 - 1 + BAND_HI at most;
        # the loop starts at the key block holding the first of them
        lo = tl.maximum(pid_m * BLOCK_M + BAND_LO, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum((pid_m + 1) * BLOCK_M + BAND_HI, N_K)
    else:
        lo = 0
        hi = N_K

    for start_n in range(lo, hi, BLOCK_N):
        offs_kn = start_n + offs_n
        n_valid = offs_kn < N_K
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = tl.load(
            k_base + offs_kn[:, None] * stride_kn + offs_d[None, :] * stride_kd,
            mask=kv_mask, other=0.0,
        ).to(tl.float32)
        v = tl.load(
            v_base + offs_kn[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=kv_mask, other=0.0,
        ).to(tl.float32)

        s, _ = _scores(_mma(q, tl.trans(k), FP16_DOT, DOT_PRECISION), offs_m, offs_kn, sm_scale, qk_scale,
                       softcap, slope, DIAG, HAS_SOFTCAP, HAS_ALIBI)
        # keys past N_K score -inf: the identity of the max, weight exp2(-inf) = 0
        s = tl.where(n_valid[None, :], s, float("-inf"))
        if IS_BANDED:
            s = tl.where(_band_keep(offs_m, offs_kn, BAND_LO, BAND_HI), s, float("-inf"))

        # online softmax: new max, rescale factor of the old sums, this block's weights
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # a row whose scores so far are all -inf keeps offset 0 so that no -inf - -inf NaN
        # appears (its l stays 0 until it sees a key)
        m_off = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_off)
        p = tl.exp2(s - m_off[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)  # the normaliser sums every weight: lse is dropout-free
        if HAS_DROPOUT:
            p = tl.where(_dropout_keep(seed, off_b, off_h, H, offs_m, offs_kn, N_Q, N_K, drop_p), p, 0.0)
        acc = acc * alpha[:, None] + _mma(p, v, FP16_DOT, DOT_PRECISION)
        m_i = m_new

    # A row that saw a key has l >= 1 (its top key adds exp2(0)). A row that saw none (a
    # band that misses every key, e.g. causal rows i < Nq - Nk) has acc = 0 and l = 0: it
    # returns o = 0 and lse = log(0) = -inf, the identity of the LSE merge, not 0/0.
    empty = l_i == 0.0
    l_i = tl.where(empty, 1.0, l_i)
    if HAS_DROPOUT:
        o = acc * (drop_scale / l_i)[:, None]  # kept weights scaled by 1 / (1 - p), folded into 1 / l
    else:
        o = acc / l_i[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_i)) * _LN2)  # natural log
    o_ptrs = O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh \
        + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
    tl.store(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=m_valid)


# ----------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------
@unspecialised_jit
def _attn_bwd_preprocess_kernel(
    O,  # *[B, H, Nq, D] forward output, any strides
    DO,  # *[B, H, Nq, D] gradient of o, any strides (may be an expanded view)
    DELTA,  # *[B, H, Nq] float32 output: delta_i = sum_d dO_id O_id, contiguous
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    H,
    N_Q,
    HEAD_DIM,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = pid_bh // H
    off_h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < N_Q
    mask = m_valid[:, None] & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(
        O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
        + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
        mask=mask, other=0.0,
    ).to(tl.float32)
    do = tl.load(
        DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
        + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
        mask=mask, other=0.0,
    ).to(tl.float32)
    delta = tl.sum(o * do, axis=1)  # masked lanes are 0, the identity of the sum
    tl.store(DELTA + pid_bh.to(tl.int64) * N_Q + offs_m, delta, mask=m_valid)


@unspecialised_jit
def _attn_bwd_dkdv_kernel(
    Q,  # *[B, H, Nq, D] queries, any strides
    K,  # *[B, Hkv, Nk, D] keys, any strides
    V,  # *[B, Hkv, Nk, D] values, any strides
    DO,  # *[B, H, Nq, D] gradient of o, any strides
    LSE,  # *[B, H, Nq] float32 natural-log logsumexp from the forward, contiguous
    DELTA,  # *[B, H, Nq] float32 rowsum(dO * O), contiguous
    DK,  # *[B, Hkv, Nk, D] output dk (input dtype), contiguous
    DV,  # *[B, Hkv, Nk, D] output dv (input dtype), contiguous
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    H,  # number of query heads
    GROUP,  # query heads per KV head, H / Hkv
    N_Q,
    N_K,
    HEAD_DIM,
    sm_scale,  # natural-units scale (for dk)
    qk_scale,  # sm_scale * log2(e)
    BAND_LO,  # banded calls keep keys i + BAND_LO <= j <= i + BAND_HI
    BAND_HI,
    ALIBI,  # *[B, H] float32 ALiBi slopes (stride_ab 0 for [H]); unused without HAS_ALIBI
    stride_ab, stride_ah,
    softcap,  # > 0 with HAS_SOFTCAP
    DIAG,  # Nk - Nq, the ALiBi distance's origin
    seed,  # Philox seed of the dropout mask; unused without HAS_DROPOUT
    drop_p,  # dropout probability, 0 < p < 1 with HAS_DROPOUT
    drop_scale,  # 1 / (1 - drop_p), rounded once to fp32
    IS_BANDED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    FP16_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # one program per (key block, batch * KV head): dk and dv of a KV head shared by a
    # group of query heads are sums over the group, accumulated here in fp32 (no atomics)
    pid_n = tl.program_id(0)
    pid_bkv = tl.program_id(1)
    H_KV = H // GROUP
    off_b = pid_bkv // H_KV
    off_kvh = pid_bkv % H_KV

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_mb = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    n_valid = offs_n < N_K
    d_valid = offs_d < HEAD_DIM
    kv_mask = n_valid[:, None] & d_valid[None, :]

    k = tl.load(
        K + off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
        + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
        mask=kv_mask, other=0.0,
    ).to(tl.float32)
    v = tl.load(
        V + off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh
        + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
        mask=kv_mask, other=0.0,
    ).to(tl.float32)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    if IS_BANDED:
        # rows that can see a key j0 .. j1 - 1 of this block: j1 - 1 - BAND_HI <= ... i.e.
        # i >= j0 - BAND_HI and i <= j1 - 1 - BAND_LO; start at the query block holding the first
        lo = tl.maximum(pid_n * BLOCK_N - BAND_HI, 0) // BLOCK_M * BLOCK_M
        hi = tl.minimum((pid_n + 1) * BLOCK_N - BAND_LO, N_Q)
    else:
        lo = 0
        hi = N_Q

    for g in range(0, GROUP):
        off_h = off_kvh * GROUP + g  # the query heads of this KV head's group
        row0 = (off_b * H + off_h).to(tl.int64) * N_Q  # this head's rows of LSE and DELTA
        q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        do_base = DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
        slope = 0.0
        if HAS_ALIBI:
            slope = tl.load(ALIBI + off_b * stride_ab + off_h * stride_ah)
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + offs_mb
            m_valid = offs_m < N_Q
            qm_mask = m_valid[:, None] & d_valid[None, :]
            q = tl.load(
                q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=qm_mask, other=0.0,
            ).to(tl.float32)
            do = tl.load(
                do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                mask=qm_mask, other=0.0,
            ).to(tl.float32)
            lse2 = tl.load(LSE + row0 + offs_m, mask=m_valid, other=0.0) * _LOG2E
            delta = tl.load(DELTA + row0 + offs_m, mask=m_valid, other=0.0)

            # P recomputed from the saved LSE; padded rows and keys, and pairs outside the
            # band, get P = 0 (a row without any key has lse = -inf: s - lse is never formed
            # there, -inf - -inf would be NaN)
            st, tt = _scores(_mma(q, tl.trans(k), FP16_DOT, DOT_PRECISION), offs_m, offs_n, sm_scale, qk_scale,
                             softcap, slope, DIAG, HAS_SOFTCAP, HAS_ALIBI)
            keep = m_valid[:, None] & n_valid[None, :]
            if IS_BANDED:
                keep = keep & _band_keep(offs_m, offs_n, BAND_LO, BAND_HI)
            # P <= 1 exactly; the clamp keeps the rounding of a huge lse (u(fp32) |lse| > 128
            # past |s| ~ 1e9) from recomputing P as exp2(+big) = inf and the gradients as NaN
            p = tl.where(keep, tl.exp2(tl.minimum(st - lse2[:, None], 0.0)), 0.0)  # [BLOCK_M, BLOCK_N]

            dp = _mma(do, tl.trans(v), FP16_DOT, DOT_PRECISION)
            if HAS_DROPOUT:
                # the forward's mask, recomputed from the seed: dV = (P * M)^T dO c (c at the
                # end), dP' = c M dO V^T; delta = rowsum(dO * O) already holds the dropped O
                kept = _dropout_keep(seed, off_b, off_h, H, offs_m, offs_n, N_Q, N_K, drop_p)
                dv += _mma(tl.trans(tl.where(kept, p, 0.0)), do, FP16_DOT, DOT_PRECISION)
                dp = tl.where(kept, dp * drop_scale, 0.0)
            else:
                dv += _mma(tl.trans(p), do, FP16_DOT, DOT_PRECISION)
            ds = p * (dp - delta[:, None])
            if HAS_SOFTCAP:
                ds = ds * (1.0 - tt * tt)  # d softcap tanh(s / softcap) / d s
            dk += _mma(tl.trans(ds), q, FP16_DOT, DOT_PRECISION)

    dk = dk * sm_scale  # d s / d k = sm_scale * q
    if HAS_DROPOUT:
        dv = dv * drop_scale  # the kept weights' 1 / (1 - p)
    out_off = off_b.to(tl.int64) * stride_dkb + off_kvh.to(tl.int64) * stride_dkh \
        + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
    tl.store(DK + out_off, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out_off, dv.to(DV.dtype.element_ty), mask=kv_mask)


@unspecialised_jit
def _attn_bwd_dq_kernel(
    Q,  # *[B, H, Nq, D] queries, any strides
    K,  # *[B, Hkv, Nk, D] keys, any strides
    V,  # *[B, Hkv, Nk, D] values, any strides
    DO,  # *[B, H, Nq, D] gradient of o, any strides
    LSE,  # *[B, H, Nq] float32 natural-log logsumexp from the forward, contiguous
    DELTA,  # *[B, H, Nq] float32 rowsum(dO * O), contiguous
    DQ,  # *[B, H, Nq, D] output dq (input dtype), contiguous
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H,  # number of query heads
    GROUP,  # query heads per KV head, H / Hkv
    N_Q,
    N_K,
    HEAD_DIM,
    sm_scale,  # natural-units scale (for dq)
    qk_scale,  # sm_scale * log2(e)
    BAND_LO,  # banded calls keep keys i + BAND_LO <= j <= i + BAND_HI
    BAND_HI,
    ALIBI,  # *[B, H] float32 ALiBi slopes (stride_ab 0 for [H]); unused without HAS_ALIBI
    stride_ab, stride_ah,
    softcap,  # > 0 with HAS_SOFTCAP
    DIAG,  # Nk - Nq, the ALiBi distance's origin
    seed,  # Philox seed of the dropout mask; unused without HAS_DROPOUT
    drop_p,  # dropout probability, 0 < p < 1 with HAS_DROPOUT
    drop_scale,  # 1 / (1 - drop_p), rounded once to fp32
    IS_BANDED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    FP16_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = pid_bh // H
    off_h = pid_bh % H
    off_kvh = _kv_head(off_h, H, GROUP)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_nb = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < N_Q
    d_valid = offs_d < HEAD_DIM
    qm_mask = m_valid[:, None] & d_valid[None, :]

    q = tl.load(
        Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=qm_mask, other=0.0,
    ).to(tl.float32)
    do = tl.load(
        DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
        + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
        mask=qm_mask, other=0.0,
    ).to(tl.float32)
    lse2 = tl.load(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, mask=m_valid, other=0.0) * _LOG2E
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * N_Q + offs_m, mask=m_valid, other=0.0)

    k_base = K + off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(ALIBI + off_b * stride_ab + off_h * stride_ah)

    if IS_BANDED:
        lo = tl.maximum(pid_m * BLOCK_M + BAND_LO, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum((pid_m + 1) * BLOCK_M + BAND_HI, N_K)
    else:
        lo = 0
        hi = N_K

    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_nb
        n_valid = offs_n < N_K
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = tl.load(
            k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
            mask=kv_mask, other=0.0,
        ).to(tl.float32)
        v = tl.load(
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=kv_mask, other=0.0,
        ).to(tl.float32)

        sq, tq = _scores(_mma(q, tl.trans(k), FP16_DOT, DOT_PRECISION), offs_m, offs_n, sm_scale, qk_scale,
                         softcap, slope, DIAG, HAS_SOFTCAP, HAS_ALIBI)
        keep_q = m_valid[:, None] & n_valid[None, :]
        if IS_BANDED:
            keep_q = keep_q & _band_keep(offs_m, offs_n, BAND_LO, BAND_HI)
        # P <= 1 exactly; the clamp keeps the rounding of a huge lse (u(fp32) |lse| > 128 past
        # |s| ~ 1e9) from recomputing P as exp2(+big) = inf and the gradients as NaN; pairs
        # outside the band get P = 0 without forming s - lse (-inf - -inf on an empty row)
        p = tl.where(keep_q, tl.exp2(tl.minimum(sq - lse2[:, None], 0.0)), 0.0)

        dp = _mma(do, tl.trans(v), FP16_DOT, DOT_PRECISION)
        if HAS_DROPOUT:  # dP' = c M dO V^T, the forward's mask from the seed
            kept_q = _dropout_keep(seed, off_b, off_h, H, offs_m, offs_n, N_Q, N_K, drop_p)
            dp = tl.where(kept_q, dp * drop_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - tq * tq)  # d softcap tanh(s / softcap) / d s
        dq += _mma(ds, k, FP16_DOT, DOT_PRECISION)

    dq = dq * sm_scale  # d s / d q = sm_scale * k
    tl.store(
        DQ + off_b.to(tl.int64) * stride_dqb + off_h.to(tl.int64) * stride_dqh
        + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
        dq.to(DQ.dtype.element_ty), mask=qm_mask,
    )


@unspecialised_jit
def _dropout_keep_kernel(
    KEEP,  # *[B, H, Nq, Nk] uint8 view of the bool keep mask, contiguous
    H,
    N_Q,
    N_K,
    seed,
    drop_p,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """return_keep: the mask the forward and backward draw (``_dropout_keep``), at every (i, j)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2)
    off_b = pid_bh // H
    off_h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = _dropout_keep(seed, off_b, off_h, H, offs_m, offs_n, N_Q, N_K, drop_p)
    ptrs = KEEP + (pid_bh.to(tl.int64) * N_Q + offs_m[:, None]) * N_K + offs_n[None, :]
    tl.store(ptrs, keep.to(tl.int8), mask=(offs_m[:, None] < N_Q) & (offs_n[None, :] < N_K))


# ----------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _qkv_strides(t: torch.Tensor) -> tuple[int, int, int, int]:
    """The four strides (batch, head, row, dim) of an input q, k or v, taken from the tensor."""
    return tuple(t.stride())


def _dot_mode(dtype: torch.dtype) -> tuple[int, str]:
    """(FP16_DOT, DOT_PRECISION) for an input dtype; see ``_mma`` and the module docstring."""
    if dtype == torch.float16:
        return (2 if _interpreting() else 1), "tf32"  # precision applies to fp32 operands only
    if dtype == torch.bfloat16:
        return 0, "tf32"  # bf16 values are exact in tf32
    return 0, FP32_DOT_PRECISION


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


# float32's "ieee" tl.dot has no tensor-core form: it is FMA code, unrolled per thread, of
# BLOCK_M BLOCK_N BLOCK_D / (32 num_warps) multiply-adds a dot, and LLVM and ptxas time grow
# with it. Eight warps halve each thread's share: compiling one float32 kernel for sm_90
# (triton.compile on a CPU, Triton 3.9) took forward, BLOCK_D 64: 5.6 s at 4 warps, 2.0 s
# at 8; dK/dV: 3.6 -> 1.4 s; dQ: 2.6 -> 1.0 s; a cold quick run compiles about a hundred
# float32 keys (docs/speed.md). The blocks, and so every sum's order, stay as they were.
_FP32_WARPS = 8


def _fwd_config(dtype: torch.dtype, block_d: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the forward kernel."""
    if _interpreting():
        return 16, 16, 1
    if block_d >= 128 and dtype != torch.float16:
        return 64, 32, 8
    if dtype == torch.float32:
        return 64, 64, _FP32_WARPS
    return 64, 64, 4 if block_d <= 64 else 8


def _bwd_config(dtype: torch.dtype, block_d: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the two backward kernels."""
    if _interpreting():
        return 16, 16, 1
    warps = _FP32_WARPS if dtype == torch.float32 else 4
    if block_d >= 128 and dtype != torch.float16:
        return 32, 16, warps
    return 32, 32, warps


def _check_inputs(q, k, v, causal, sm_scale, window, alibi_slopes, softcap) -> tuple[float, tuple[int, int]]:
    """Validate the arguments of ``attention``; return the resolved sm_scale and window."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise TypeError(
                f"attention: {name} has unsupported dtype {t.dtype}; supported: "
                "torch.float32, torch.float16, torch.bfloat16"
            )
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(
            f"attention: q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"attention: {name} must have rank 4 [B, H, N, D], got shape {tuple(t.shape)}"
            )
    if k.device != q.device or v.device != q.device:
        raise ValueError(
            f"attention: q, k, v must be on one device, got q on {q.device}, k on {k.device}, "
            f"v on {v.device}"
        )
    if q.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(
            f"attention: q is on {q.device}; the Triton kernel needs CUDA tensors "
            "(or TRITON_INTERPRET=1 for CPU tensors)"
        )
    B, H, n_q, D = q.shape
    if k.shape[0] != B:
        raise ValueError(f"attention: k's batch dim {k.shape[0]} differs from q's {B}")
    if v.shape[0] != B:
        raise ValueError(f"attention: v's batch dim {v.shape[0]} differs from q's {B}")
    if k.shape[1] < 1 or H % k.shape[1]:
        raise ValueError(
            f"attention: k has {k.shape[1]} heads, which must divide q's {H} (grouped-query attention)"
        )
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"attention: v has {v.shape[1]} heads (dim 1) but k has {k.shape[1]}; they must match")
    if k.shape[3] != D:
        raise ValueError(f"attention: k's head dim {k.shape[3]} differs from q's {D}")
    if v.shape[2] != k.shape[2]:
        raise ValueError(
            f"attention: v has {v.shape[2]} keys (dim 2) but k has {k.shape[2]}; they must match"
        )
    if v.shape[3] != D:
        raise ValueError(
            f"attention: v's head dim {v.shape[3]} differs from q's {D} (this kernel needs "
            "the same head dim for v)"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() == 0:
            raise ValueError(f"attention: {name} is empty, shape {tuple(t.shape)}")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"attention: q's head dim D={D} is not supported (1 <= D <= {MAX_HEAD_DIM})")
    if not isinstance(causal, (bool, int)) or isinstance(causal, float):
        raise TypeError(f"attention: causal must be a bool, got {causal!r}")
    window = _check_window(window)
    _check_alibi(alibi_slopes, q)
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"attention: softcap must be a real number (0 = off), got {softcap!r}")
    if not math.isfinite(float(softcap)) or softcap < 0:
        raise ValueError(f"attention: softcap must be finite and >= 0 (0 = off), got {softcap!r}")
    if sm_scale is None:
        return 1.0 / math.sqrt(D), window
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"attention: sm_scale must be a real number or None, got {sm_scale!r}")
    sm_scale = float(sm_scale)
    if not math.isfinite(sm_scale) or sm_scale <= 0.0:
        raise ValueError(f"attention: sm_scale must be finite and > 0, got {sm_scale!r}")
    return sm_scale, window


def _check_window(window) -> tuple[int, int]:
    """``window`` as a pair of ints (left, right), each >= 0 or -1 (unbounded)."""
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"attention: window must be a pair (left, right) of ints, got {window!r}")
    for side in window:
        if isinstance(side, bool) or not isinstance(side, numbers.Integral):
            raise TypeError(f"attention: window must be a pair (left, right) of ints, got {window!r}")
        if side < -1:
            raise ValueError(f"attention: window sides must be >= 0 or -1 (unbounded), got {window!r}")
    return int(window[0]), int(window[1])


def _check_dropout(dropout_p, seed, return_keep) -> tuple[float, int]:
    """``dropout_p`` a real number in [0, 1), ``seed`` an int in [0, 2**63), ``return_keep`` a bool."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"attention: dropout_p must be a real number in [0, 1), got {dropout_p!r}")
    if not 0.0 <= float(dropout_p) < 1.0:  # NaN fails both comparisons
        raise ValueError(f"attention: dropout_p must satisfy 0 <= dropout_p < 1, got {dropout_p!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"attention: seed must be an int, got {seed!r}")
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"attention: seed must satisfy 0 <= seed < 2**63, got {seed!r}")
    if not isinstance(return_keep, bool):
        raise TypeError(f"attention: return_keep must be a bool, got {return_keep!r}")
    return float(dropout_p), int(seed)


def _check_alibi(slopes, q) -> None:
    """ALiBi slopes: None, or a float32 tensor [H] or [B, H] on q's device, finite."""
    if slopes is None:
        return
    if not isinstance(slopes, torch.Tensor):
        raise TypeError(f"attention: alibi_slopes must be a torch.Tensor or None, got {type(slopes).__name__}")
    if slopes.dtype != torch.float32:
        raise TypeError(f"attention: alibi_slopes must be float32, got {slopes.dtype}")
    B, H = q.shape[:2]
    if tuple(slopes.shape) not in ((H,), (B, H)):
        raise ValueError(f"attention: alibi_slopes must have shape [H] = [{H}] or [B, H] = [{B}, {H}], "
                         f"got {tuple(slopes.shape)}")
    if slopes.device != q.device:
        raise ValueError(f"attention: alibi_slopes is on {slopes.device}, q on {q.device}")
    if not bool(torch.isfinite(slopes).all()):
        raise ValueError("attention: alibi_slopes must be finite")


def _alibi_args(slopes, fallback) -> tuple:
    """(pointer, stride_ab, stride_ah) of the ALiBi slopes; [H] has batch stride 0. Without
    slopes a pointer that is never read (HAS_ALIBI False)."""
    if slopes is None:
        return fallback, 0, 0
    if slopes.dim() == 1:
        return slopes, 0, slopes.stride(0)
    return slopes, slopes.stride(0), slopes.stride(1)


def _band(n_q: int, n_k: int, causal: bool, window: tuple[int, int]) -> tuple[bool, int, int]:
    """(IS_BANDED, BAND_LO, BAND_HI): query i keeps keys i + BAND_LO <= j <= i + BAND_HI.

    Masks align to the bottom right (flash-attention >= 2.1): row i's diagonal key is
    i + diag, diag = Nk - Nq. window = (left, right) keeps diag - left .. diag + right
    around it, causal caps right at 0. An unbounded side (-1) gets a bound past every
    key: j >= i + diag - Nk holds for every j >= 0 since i + diag - Nk <= Nq - 1 - Nq < 0,
    and j <= i + diag + Nq holds for every j < Nk since i + diag + Nq >= Nk."""
    diag = n_k - n_q
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    banded = causal or left >= 0 or right >= 0
    band_lo = diag - (left if left >= 0 else n_k)
    band_hi = diag + (right if right >= 0 else n_q)
    return banded, band_lo, band_hi


def _dropout_args(dropout_p: float, seed: int) -> tuple[int, float, float, bool]:
    """(seed, drop_p, drop_scale, HAS_DROPOUT) for the kernels. At dropout_p = 0 no mask is
    drawn: the kernels run their plain path (o = acc / l), bit for bit the call without dropout."""
    has_dropout = dropout_p > 0
    if not has_dropout:
        return 0, 0.0, 1.0, False
    return seed, float(dropout_p), 1.0 / (1.0 - float(dropout_p)), True


def _keep_mask(q, k, dropout_p: float, seed: int) -> torch.Tensor:
    """The keep mask [B, H, Nq, Nk] (bool) of a call: every entry True at dropout_p = 0."""
    B, H, n_q, _ = q.shape
    n_k = k.shape[2]
    keep = torch.empty((B, H, n_q, n_k), dtype=torch.bool, device=q.device)
    seed, drop_p, _, _ = _dropout_args(dropout_p, seed)
    # 64 x 64 on both backends: the interpreter's cost is per program (a tl.rand is about
    # 18 ms whatever the tile), and the mask does not depend on the blocks
    block = 64
    _dropout_keep_kernel[(triton.cdiv(n_q, block), triton.cdiv(n_k, block), B * H)](
        keep.view(torch.uint8), H, n_q, n_k, seed, drop_p, BLOCK_M=block, BLOCK_N=block,
    )
    return keep


def _forward(q, k, v, causal: bool, sm_scale: float, window: tuple[int, int], alibi_slopes, softcap: float,
             dropout_p: float = 0.0, seed: int = 0):
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    block_d = _block_d(D)
    block_m, block_n, num_warps = _fwd_config(q.dtype, block_d)
    fp16_dot, precision = _dot_mode(q.dtype)
    banded, band_lo, band_hi = _band(n_q, n_k, causal, window)
    drop = _dropout_args(dropout_p, seed)
    o = torch.empty((B, H, n_q, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n_q, block_m), B * H)
    _attn_fwd_kernel[grid](
        q, k, v, o, lse,
        *_qkv_strides(q), *_qkv_strides(k), *_qkv_strides(v), *o.stride(),
        H, H // k.shape[1], n_q, n_k, D, sm_scale * LOG2E, band_lo, band_hi,
        *_alibi_args(alibi_slopes, lse), sm_scale, softcap or 1.0, n_k - n_q, *drop[:3],
        IS_BANDED=banded, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None, HAS_DROPOUT=drop[3],
        FP16_DOT=fp16_dot, DOT_PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=num_warps,
    )
    return o, lse


def _backward(q, k, v, o, lse, do, causal: bool, sm_scale: float, window: tuple[int, int], alibi_slopes,
              softcap: float, dropout_p: float = 0.0, seed: int = 0):
    B, H, n_q, D = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    block_d = _block_d(D)
    block_m, block_n, num_warps = _bwd_config(q.dtype, block_d)
    fp16_dot, precision = _dot_mode(q.dtype)
    banded, band_lo, band_hi = _band(n_q, n_k, causal, window)
    drop = _dropout_args(dropout_p, seed)

    delta = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    pre_m = 16 if _interpreting() else 64
    _attn_bwd_preprocess_kernel[(triton.cdiv(n_q, pre_m), B * H)](
        o, do, delta, *o.stride(), *do.stride(), H, n_q, D,
        BLOCK_M=pre_m, BLOCK_D=block_d,
    )

    dq = torch.empty((B, H, n_q, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((B, h_kv, n_k, D), dtype=k.dtype, device=q.device)
    dv = torch.empty((B, h_kv, n_k, D), dtype=v.dtype, device=q.device)
    strides = (*_qkv_strides(q), *_qkv_strides(k), *_qkv_strides(v), *do.stride())
    _attn_bwd_dkdv_kernel[(triton.cdiv(n_k, block_n), B * h_kv)](
        q, k, v, do, lse, delta, dk, dv,
        *strides, *dk.stride(),
        H, H // h_kv, n_q, n_k, D, sm_scale, sm_scale * LOG2E, band_lo, band_hi,
        *_alibi_args(alibi_slopes, lse), softcap or 1.0, n_k - n_q, *drop[:3],
        IS_BANDED=banded, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None, HAS_DROPOUT=drop[3],
        FP16_DOT=fp16_dot, DOT_PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=num_warps,
    )
    _attn_bwd_dq_kernel[(triton.cdiv(n_q, block_m), B * H)](
        q, k, v, do, lse, delta, dq,
        *strides, *dq.stride(),
        H, H // h_kv, n_q, n_k, D, sm_scale, sm_scale * LOG2E, band_lo, band_hi,
        *_alibi_args(alibi_slopes, lse), softcap or 1.0, n_k - n_q, *drop[:3],
        IS_BANDED=banded, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None, HAS_DROPOUT=drop[3],
        FP16_DOT=fp16_dot, DOT_PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=num_warps,
    )
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, window, alibi_slopes, softcap, dropout_p, seed):
        o, lse = _forward(q, k, v, causal, sm_scale, window, alibi_slopes, softcap, dropout_p, seed)
        ctx.save_for_backward(q, k, v, o, lse, alibi_slopes)
        ctx.causal = causal
        ctx.sm_scale = sm_scale
        ctx.window = window
        ctx.softcap = softcap
        ctx.dropout = (dropout_p, seed)  # the backward redraws the mask from the seed
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, alibi_slopes = ctx.saved_tensors
        if do.dtype != q.dtype:
            do = do.to(q.dtype)
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale, ctx.window, alibi_slopes,
                               ctx.softcap, *ctx.dropout)
        return dq, dk, dv, None, None, None, None, None, None, None


def attention(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0,
              dropout_p=0.0, seed=0, return_keep=False):
    """Flash attention ``(o, lse)``, or ``(o, lse, keep)`` with ``return_keep=True``; see the
    module docstring for the math, the dropout mask's counter and the limits.

    The ALiBi slopes are not differentiated (no gradient is returned for them)."""
    scale, window = _check_inputs(q, k, v, causal, sm_scale, window, alibi_slopes, softcap)
    dropout_p, seed = _check_dropout(dropout_p, seed, return_keep)
    args = (q, k, v, bool(causal), scale, window, alibi_slopes, float(softcap), dropout_p, seed)
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        o, lse = _FlashAttention.apply(*args)
        if return_keep:
            return o, lse, _keep_mask(q, k, dropout_p, seed)
    return o, lse


attention.dtypes = _DTYPES
attention.supports_backward = True
attention.fp32_dot_precision = FP32_DOT_PRECISION
# bf16 inputs are loaded and upcast to fp32 before any arithmetic or tl.dot (tf32 dots on
# fp32 tiles), so the Triton interpreter's bf16 tl.dot limit does not apply to this kernel.
attention.bf16_dot_upcast = True
