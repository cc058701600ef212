"""The gated delta rule in Triton: a chunked forward and a chunked reverse-mode backward.

Contract (``docs/contract.md``)::

    gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None)
        -> (o, final_state)

    q, k [B, T, H, K], v [B, T, H, V] (one dtype), g, beta [B, T, H] (any float dtype)
    initial_state, final_state [N, H, K, V] float32: fla's h = S^T, N = B sequences, or
    len(cu_seqlens) - 1 packed sequences (B = 1) delimited by cu_seqlens (int32/int64)

Per sequence and head, token by token (``references/gated_delta_rule.py``)::

    h'_t = exp(g_t) h_{t-1};  u_t = beta_t (v_t - h'_t^T k_t);  h_t = h'_t + k_t u_t^T;
    o_t = scale h_t^T q_t  (scale None: K ** -0.5)

Forward, chunked: one program per (sequence, head, 32-column tile of V) walks its
sequence in chunks of C tokens (``gated_delta_rule.chunk_sizes`` = 16, 32, 64; default
64) carrying the fp32 state h_0 [K, tile]. Per chunk, with G the fp32 cumulative sum of
g inside the chunk, gamma_i = exp(G_i) and R_ij = exp(G_i - G_j) (j <= i; exactly 0
above the diagonal, never exp of a positive exponent multiplied in)::

    A   = strictly_lower(beta_i (k_i . k_j) R_ij);  T = (I + A)^{-1}          [C, C]
    Y   = diag(beta) (V - diag(gamma) K h_0);       U = T Y                    [C, tile]
    O_c = scale (diag(gamma) Q h_0 + lower(Q K^T * R) U)       (inclusive: j <= i)
    h_0 <- gamma_last h_0 + K^T diag(R_last,:) U

U holds the pseudo-values u_i = beta_i (v_i - h'_i^T k_i) (row i of (I + A) U = Y is the
recurrence's step i with h'_i written through the chunk's earlier rows). T comes from
recursive block inversion (``_chunk_forms``), log2(C) levels of two products each: the
Triton interpreter pays per operation, and a row-by-row substitution cost it C times
as many. With ||k_t|| <= 1 and beta_t in [0, 1] (the contract's domain) every
(I - beta k k^T) is a contraction and |T_ij| = beta_i |k_i^T Phi k_j| <= 1 (Phi a
product of contractions): no entry grows.

Backward, chunked, in reverse chunk order: the forward saves the state at every chunk
start (fp32 [chunks, H, K, V]); the backward recomputes the chunk's T, U and scores from
it and takes the reverse mode of the four lines above, carrying the adjoint D of the
state backwards from d final_state (dU = scale P^T dO + diag(R_last,:) K D; dY = T^T dU;
dA = -dY U^T on j < i; dP = scale dO U^T on j <= i; then dq, dk, dbeta, dG through A, P,
Y and the decays, dg_t = sum_{i >= t} dG_i + dG_last; D <- gamma_last D + scale Q^T
diag(gamma) dO - K^T diag(beta gamma) dY), and d initial_state = D at the start. dq, dk,
dg, dbeta sum over V: each V tile writes its partial sums to fp32 buffers, added by
PyTorch (deterministic, no atomics).

Precision: every operand is loaded and cast to fp32; products are ``tl.dot(...,
input_precision="tf32x3")`` (``gated_delta_rule.fp32_dot_precision``) or fp32 FMA
reductions, accumulation and state in fp32; o is stored once in the input dtype. Offsets
are int64 (the batch row of a [B, T, H, K] tensor past 2**31 elements).

Sizes: any T >= 0 (T = 0, B = 0, H = 0 or a zero-length sequence launch nothing for it:
its final state is its initial state), K and V from 1 to 128 (padded to powers of two of
at least 32 with masks), any strides of q, k, v, g, beta (passed to the kernels).
"""
from __future__ import annotations

import math
import numbers
import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.specialisation import unspecialised_jit

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_OFFSET_DTYPES = (torch.int32, torch.int64)
_MAX_HEAD_DIM = 128
_CHUNK_SIZES = (16, 32, 64)
_DEFAULT_CHUNK = 64
_V_TILE = 32  # value columns per program: the state tile [K, 32] stays in registers at K = 128
# The smallest block of K and V: 32, not tl.dot's 16, so every head dim up to 32 shares one compiled
# variant. The backward compiles for sm_90 in 38-52 s a variant (one CPU core, tf32x3); with 16 and 32
# both, a run drawing head dims on either side of 16 compiled four backward variants a dtype where it
# now compiles one (the quick profile's gradient checks took 60-80 s on an H200, nearly all compiling).
_MIN_BLOCK = 32
# K above 64 runs chunks of at most 32 tokens: compiled for sm_90, the backward at chunk 64 and
# K 128 asks for 256 KiB of shared memory (an H100/H200 block has 227 KiB), the forward 144 KiB;
# at chunk 32 and K 128 the backward takes 40 KiB, the forward 32 KiB
_WIDE_K_CHUNK = 32
_DOT_PRECISION = "tf32x3"  # 3-pass tf32: fp32-accurate products at tensor-core speed (kernels/linear_attention.py)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@unspecialised_jit
def _gdr_fwd_kernel(
    Q, K, V, G, BETA,  # inputs [B, T, H, *], any strides (G and BETA fp32)
    H0,  # initial state [N, H, K, V] fp32 contiguous (read when HAS_H0)
    O,  # out: o [B, T, H, V] in the input dtype, contiguous
    HT,  # out: final state [N, H, K, V] fp32 contiguous
    CKPT,  # out (SAVE): the state at each chunk's start [chunks, H, K, V] fp32
    SEQ,  # int64 [N, 4]: batch row, first token, end token, first chunk of each sequence
    H, DK, DV, scale,
    HAS_H0, SAVE,  # runtime flags (0/1): read H0; store the chunk-start states (a compile fewer each)
    sqb, sqt, sqh, sqd,  # strides of Q
    skb, skt, skh, skd,  # strides of K
    svb, svt, svh, svd,  # strides of V
    sgb, sgt, sgh,  # strides of G
    sbb, sbt, sbh,  # strides of BETA
    sob, sot, soh, sod,  # strides of O
    LOG_CHUNK: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    nh = tl.program_id(0).to(tl.int64)
    n = nh // H
    h = nh % H
    offs_e = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_d = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, CHUNK)
    d_ok = offs_d < DK
    e_ok = offs_e < DV
    de_ok = d_ok[:, None] & e_ok[None, :]
    row = tl.load(SEQ + n * 4)  # int64: row * stride passes 2**31 in a large batch
    start = tl.load(SEQ + n * 4 + 1)
    length = tl.load(SEQ + n * 4 + 2) - start
    first_chunk = tl.load(SEQ + n * 4 + 3)
    lower = rows[None, :] <= rows[:, None]  # j <= i: the output's intra-chunk scores (inclusive)
    state_offs = offs_d[:, None] * DV + offs_e[None, :]  # [K, V] fp32 state, row-major
    state = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    if HAS_H0:
        state = tl.load(H0 + nh * DK * DV + state_offs, mask=de_ok, other=0.0)
    for c0 in range(0, length, CHUNK):
        if SAVE:
            tl.store(CKPT + ((first_chunk + c0 // CHUNK) * H + h) * DK * DV + state_offs, state, mask=de_ok)
        tok = start + c0 + rows  # int64 token indices
        t_ok = c0 + rows < length
        q = tl.load(Q + row * sqb + tok[:, None] * sqt + h * sqh + offs_d[None, :] * sqd,
                    mask=t_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        k = tl.load(K + row * skb + tok[:, None] * skt + h * skh + offs_d[None, :] * skd,
                    mask=t_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        v = tl.load(V + row * svb + tok[:, None] * svt + h * svh + offs_e[None, :] * svd,
                    mask=t_ok[:, None] & e_ok[None, :], other=0.0).to(tl.float32)
        # padded tokens: g = 0 and beta = 0 leave the state as it is
        g = tl.load(G + row * sgb + tok * sgt + h * sgh, mask=t_ok, other=0.0).to(tl.float32)
        beta = tl.load(BETA + row * sbb + tok * sbt + h * sbh, mask=t_ok, other=0.0).to(tl.float32)
        gamma, ratio, to_end, gamma_last, kk, inv = _chunk_forms(k, g, beta, t_ok, rows, LOG_CHUNK, DOT_PRECISION)
        kh = tl.dot(k, state, input_precision=DOT_PRECISION)  # k_i^T h_0
        u = tl.dot(inv, beta[:, None] * (v - gamma[:, None] * kh), input_precision=DOT_PRECISION)
        qk = tl.where(lower, tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * ratio, 0.0)
        o = scale * (gamma[:, None] * tl.dot(q, state, input_precision=DOT_PRECISION)
                     + tl.dot(qk, u, input_precision=DOT_PRECISION))
        tl.store(O + row * sob + tok[:, None] * sot + h * soh + offs_e[None, :] * sod,
                 o.to(O.dtype.element_ty), mask=t_ok[:, None] & e_ok[None, :])
        # carry the state past the chunk: every token's write decayed to the chunk's end
        state = gamma_last * state + tl.dot(tl.trans(k * to_end[:, None]), u, input_precision=DOT_PRECISION)
    tl.store(HT + nh * DK * DV + state_offs, state, mask=de_ok)


@triton.jit
def _chunk_forms(k, g, beta, t_ok, rows, LOG_CHUNK: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One chunk's decays and WY inverse (the forward's and the backward's, computed alike):
    G (fp32 cumulative log decay), gamma = exp(G), R_ij = exp(G_i - G_j) on j <= i (exactly
    0 above, where the positive exponents are never exponentiated: no overflow to mask),
    exp(G_last - G_j) (0 on padded rows), exp(G_last), K K^T and T = (I + A)^{-1} with
    A_ij = beta_i (k_i . k_j) R_ij on j < i. T by recursive block inversion: for
    s = 1, 2, 4, .. the inverse of each diagonal block of 2s rows from those of s rows,
    [[T1, 0], [-T2 A21 T1, T2]]; every intermediate is a block of the final inverse, whose
    entries are at most 1 in the contract's domain (kernel docstring)."""
    lower = rows[None, :] <= rows[:, None]
    cum = tl.cumsum(g, axis=0)
    gamma = tl.exp(cum)
    ratio = tl.where(lower, tl.exp(tl.where(lower, cum[:, None] - cum[None, :], 0.0)), 0.0)
    last = tl.sum(tl.where(rows == tl.sum(t_ok.to(tl.int32), axis=0) - 1, cum, 0.0), axis=0)  # G at the last token
    to_end = tl.where(t_ok, tl.exp(last - cum), 0.0)  # exactly 1 for the last token
    kk = tl.dot(k, tl.trans(k), input_precision=DOT_PRECISION)
    a = tl.where(rows[None, :] < rows[:, None], beta[:, None] * kk * ratio, 0.0)
    inv = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for level in tl.static_range(LOG_CHUNK):
        s = 1 << level
        lower_half = ((rows[:, None] // s) % 2 == 1) & ((rows[None, :] // s) % 2 == 0) \
            & (rows[:, None] // (2 * s) == rows[None, :] // (2 * s))
        coupling = tl.dot(tl.where(lower_half, a, 0.0), inv, input_precision=DOT_PRECISION)
        inv = inv - tl.dot(inv, coupling, input_precision=DOT_PRECISION)
    return gamma, ratio, to_end, tl.exp(last), kk, inv


@unspecialised_jit
def _gdr_bwd_kernel(
    Q, K, V, G, BETA,  # the forward's inputs, any strides
    DO,  # upstream gradient of o [B, T, H, V], any strides
    DHT,  # upstream gradient of the final state [N, H, K, V] fp32 contiguous (HAS_DHT)
    CKPT,  # the forward's chunk-start states [chunks, H, K, V] fp32
    SEQ,  # int64 [N, 4] as in the forward
    DQP, DKP,  # out: fp32 [tiles, B, T, H, K] partial sums over this program's V tile
    DGP, DBP,  # out: fp32 [tiles, B, T, H] partial sums
    DV_OUT,  # out: fp32 [B, T, H, V]
    DH0,  # out: fp32 [N, H, K, V]
    B, T, H, DK, DV, scale,
    HAS_DHT,  # runtime flag (0/1): read DHT
    sqb, sqt, sqh, sqd,
    skb, skt, skh, skd,
    svb, svt, svh, svd,
    sgb, sgt, sgh,
    sbb, sbt, sbh,
    sdb, sdt, sdh, sdd,  # strides of DO
    LOG_CHUNK: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    nh = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1).to(tl.int64)
    n = nh // H
    h = nh % H
    offs_e = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_d = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, CHUNK)
    d_ok = offs_d < DK
    e_ok = offs_e < DV
    de_ok = d_ok[:, None] & e_ok[None, :]
    row = tl.load(SEQ + n * 4)
    start = tl.load(SEQ + n * 4 + 1)
    length = tl.load(SEQ + n * 4 + 2) - start
    first_chunk = tl.load(SEQ + n * 4 + 3)
    lower = rows[None, :] <= rows[:, None]
    strictly_lower = rows[None, :] < rows[:, None]
    state_offs = offs_d[:, None] * DV + offs_e[None, :]
    adj = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)  # the adjoint of the state at the chunk's end
    if HAS_DHT:
        adj = tl.load(DHT + nh * DK * DV + state_offs, mask=de_ok, other=0.0)
    n_chunks = (length + CHUNK - 1) // CHUNK
    for cc in range(0, n_chunks):
        c0 = (n_chunks - 1 - cc) * CHUNK
        state = tl.load(CKPT + ((first_chunk + c0 // CHUNK) * H + h) * DK * DV + state_offs, mask=de_ok, other=0.0)
        tok = start + c0 + rows
        t_ok = c0 + rows < length
        tk_ok = t_ok[:, None] & d_ok[None, :]
        tv_ok = t_ok[:, None] & e_ok[None, :]
        q = tl.load(Q + row * sqb + tok[:, None] * sqt + h * sqh + offs_d[None, :] * sqd, mask=tk_ok,
                    other=0.0).to(tl.float32)
        k = tl.load(K + row * skb + tok[:, None] * skt + h * skh + offs_d[None, :] * skd, mask=tk_ok,
                    other=0.0).to(tl.float32)
        v = tl.load(V + row * svb + tok[:, None] * svt + h * svh + offs_e[None, :] * svd, mask=tv_ok,
                    other=0.0).to(tl.float32)
        do = tl.load(DO + row * sdb + tok[:, None] * sdt + h * sdh + offs_e[None, :] * sdd, mask=tv_ok,
                     other=0.0).to(tl.float32)
        g = tl.load(G + row * sgb + tok * sgt + h * sgh, mask=t_ok, other=0.0).to(tl.float32)
        beta = tl.load(BETA + row * sbb + tok * sbt + h * sbh, mask=t_ok, other=0.0).to(tl.float32)
        gamma, ratio, to_end, gamma_last, kk, inv = _chunk_forms(k, g, beta, t_ok, rows, LOG_CHUNK, DOT_PRECISION)
        # the forward's chunk again: Y = diag(beta) (V - diag(gamma) K h_0), U = T Y, P = lower(Q K^T * R)
        kh = tl.dot(k, state, input_precision=DOT_PRECISION)
        resid = v - gamma[:, None] * kh
        u = tl.dot(inv, beta[:, None] * resid, input_precision=DOT_PRECISION)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p = tl.where(lower, qk * ratio, 0.0)
        # reverse mode, from dO and the adjoint of h_end = gamma_last h_0 + K^T diag(to_end) U
        du = scale * tl.dot(tl.trans(p), do, input_precision=DOT_PRECISION) \
            + tl.dot(k * to_end[:, None], adj, input_precision=DOT_PRECISION)
        dy = tl.dot(tl.trans(inv), du, input_precision=DOT_PRECISION)  # U = T Y
        da = tl.where(strictly_lower, -tl.dot(dy, tl.trans(u), input_precision=DOT_PRECISION), 0.0)  # dT -> dA
        dp = tl.where(lower, scale * tl.dot(do, tl.trans(u), input_precision=DOT_PRECISION), 0.0)
        dpr = dp * ratio
        dar = da * ratio * beta[:, None]  # d(K K^T) from A
        dq = tl.dot(dpr, k, input_precision=DOT_PRECISION) \
            + scale * gamma[:, None] * tl.dot(do, tl.trans(state), input_precision=DOT_PRECISION)
        dk = tl.dot(dar + tl.trans(dar), k, input_precision=DOT_PRECISION) \
            + tl.dot(tl.trans(dpr), q, input_precision=DOT_PRECISION) \
            - (beta * gamma)[:, None] * tl.dot(dy, tl.trans(state), input_precision=DOT_PRECISION) \
            + to_end[:, None] * tl.dot(u, tl.trans(adj), input_precision=DOT_PRECISION)
        db = tl.sum(da * kk * ratio, axis=1) + tl.sum(dy * resid, axis=1)
        # d/dG: through R_ij = exp(G_i - G_j), gamma_i = exp(G_i), to_end_j = exp(G_last - G_j)
        d_ratio = (da * beta[:, None] * kk + dp * qk) * ratio
        d_gamma = scale * tl.sum(tl.dot(q, state, input_precision=DOT_PRECISION) * do, axis=1) \
            - tl.sum(beta[:, None] * dy * kh, axis=1)
        d_end = tl.sum(tl.dot(k, adj, input_precision=DOT_PRECISION) * u, axis=1) * to_end
        d_cum = tl.sum(d_ratio, axis=1) - tl.sum(d_ratio, axis=0) + d_gamma * gamma - d_end
        d_last = tl.sum(d_end, axis=0) + gamma_last * tl.sum(tl.sum(adj * state, axis=1), axis=0)
        # G_i = sum_{t <= i} g_t and G_last = sum_t g_t: dg_t = sum_{i >= t} dG_i + dG_last
        dg = tl.sum(tl.where(rows[None, :] >= rows[:, None], d_cum[None, :], 0.0), axis=1) + d_last
        adj = gamma_last * adj + scale * tl.dot(tl.trans(q * gamma[:, None]), do, input_precision=DOT_PRECISION) \
            - tl.dot(tl.trans(k * (beta * gamma)[:, None]), dy, input_precision=DOT_PRECISION)
        flat = (row * T + tok) * H + h  # [B, T, H] positions of the chunk's tokens
        part = tile * B * T * H + flat
        tl.store(DQP + part[:, None] * DK + offs_d[None, :], dq, mask=tk_ok)
        tl.store(DKP + part[:, None] * DK + offs_d[None, :], dk, mask=tk_ok)
        tl.store(DGP + part, dg, mask=t_ok)
        tl.store(DBP + part, db, mask=t_ok)
        tl.store(DV_OUT + flat[:, None] * DV + offs_e[None, :], beta[:, None] * dy, mask=tv_ok)
    tl.store(DH0 + nh * DK * DV + state_offs, adj, mask=de_ok)


# ----------------------------------------------------------------------------------- host


def _check_device(name: str, t: torch.Tensor) -> None:
    if t.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"{name} is on {t.device}; the Triton kernels need CUDA tensors "
                         "(or CPU tensors with TRITON_INTERPRET=1)")


def _tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _offsets(cu_seqlens, n_tokens: int, batch: int, device) -> list[int]:
    """cu_seqlens as a list of ints, validated (one host read: the chunk table needs it)."""
    cu = _tensor("cu_seqlens", cu_seqlens)
    if cu.dtype not in _OFFSET_DTYPES:
        raise TypeError(f"cu_seqlens must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D [N + 1] with N >= 1, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"cu_seqlens is on {cu.device}, q on {device}")
    if batch != 1:
        raise ValueError(f"with cu_seqlens the batch B must be 1 (packed sequences), got B = {batch} "
                         "(cu_seqlens)")
    values = [int(c) for c in cu.tolist()]
    if values[0] != 0 or values[-1] != n_tokens or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"cu_seqlens must start at 0, never decrease and end at T = {n_tokens}, got {values}")
    return values


def _check_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_size) -> list[tuple[int, int, int]]:
    """Validate every argument; returns (batch row, first token, end token) per sequence."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _tensor(name, t)
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} has unsupported dtype {t.dtype}; expected one of {_DTYPES}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, T, H, *], got shape {tuple(t.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, V] with q's B, T, H {tuple(q.shape[:3])}, got {tuple(v.shape)}")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != q.shape[:3]:
            raise ValueError(f"{name} must be [B, T, H] = {tuple(q.shape[:3])}, got {tuple(t.shape)}")
    if not 1 <= q.shape[3] <= _MAX_HEAD_DIM:
        raise ValueError(f"q, k head dim K = {q.shape[3]} is not supported (1..{_MAX_HEAD_DIM})")
    if not 1 <= v.shape[3] <= _MAX_HEAD_DIM:
        raise ValueError(f"v head dim V = {v.shape[3]} is not supported (1..{_MAX_HEAD_DIM})")
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: one device")
    _check_device("q", q)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
                              or not math.isfinite(scale) or scale <= 0):
        raise ValueError(f"scale must be None or a finite float > 0, got {scale!r}")
    if chunk_size is not None and chunk_size not in _CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {_CHUNK_SIZES} (or None), got {chunk_size!r}")
    B, T, H, DK = q.shape
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = _offsets(cu_seqlens, T, B, q.device)
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    if initial_state is not None:
        _tensor("initial_state", initial_state)
        if initial_state.dtype != torch.float32:
            raise TypeError(f"initial_state must be float32, got {initial_state.dtype}")
        want = (len(seqs), H, DK, v.shape[3])
        if tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state must be [N, H, K, V] = {want}, got {tuple(initial_state.shape)}")
        if initial_state.device != q.device:
            raise ValueError(f"initial_state is on {initial_state.device}, q on {q.device}")
    return seqs


def _sequence_table(seqs, chunk: int, device) -> tuple[torch.Tensor, int]:
    """int64 [N, 4] (batch row, first token, end token, first chunk) and the number of chunks."""
    rows, chunks = [], 0
    for b, s, e in seqs:
        rows.append((b, s, e, chunks))
        chunks += -(-(e - s) // chunk)
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(seqs), 4), chunks


def _blocks(DK: int, DV: int) -> tuple[int, int]:
    return max(_MIN_BLOCK, triton.next_power_of_2(DK)), min(_V_TILE, max(_MIN_BLOCK, triton.next_power_of_2(DV)))


def _forward(q, k, v, g, beta, scale, h0, seqs, chunk, save):
    B, T, H, DK = q.shape
    DV = v.shape[3]
    N = len(seqs)
    o = torch.empty((B, T, H, DV), dtype=q.dtype, device=q.device)
    final = torch.empty((N, H, DK, DV), dtype=torch.float32, device=q.device)
    table, n_chunks = _sequence_table(seqs, chunk, q.device)
    ckpt = torch.empty((n_chunks if save else 0, H, DK, DV), dtype=torch.float32, device=q.device)
    if N * H == 0:
        return o, final, table, ckpt
    block_k, block_v = _blocks(DK, DV)
    _gdr_fwd_kernel[(N * H, triton.cdiv(DV, block_v))](
        q, k, v, g, beta, h0 if h0 is not None else final, o, final, ckpt if save else final, table,
        H, DK, DV, scale, int(h0 is not None), int(save),
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(), *o.stride(),
        LOG_CHUNK=chunk.bit_length() - 1,
        CHUNK=chunk, BLOCK_K=block_k, BLOCK_V=block_v, DOT_PRECISION=_DOT_PRECISION,
        num_warps=4, num_stages=1,
    )
    return o, final, table, ckpt


def _backward(q, k, v, g, beta, scale, table, ckpt, do, dht, chunk):
    B, T, H, DK = q.shape
    DV = v.shape[3]
    N = table.shape[0]
    block_k, block_v = _blocks(DK, DV)
    tiles = triton.cdiv(DV, block_v)
    f32 = dict(dtype=torch.float32, device=q.device)
    dqp, dkp = torch.zeros((tiles, B, T, H, DK), **f32), torch.zeros((tiles, B, T, H, DK), **f32)
    dgp, dbp = torch.zeros((tiles, B, T, H), **f32), torch.zeros((tiles, B, T, H), **f32)
    dv = torch.zeros((B, T, H, DV), **f32)
    dh0 = torch.zeros((N, H, DK, DV), **f32)  # contiguous, whatever layout the upstream dht has
    dht = None if dht is None else dht.to(torch.float32).contiguous()
    if N * H > 0 and B * T == 0 and dht is not None:
        dh0.copy_(dht)  # no token: the state passes through unchanged
    elif N * H > 0:
        _gdr_bwd_kernel[(N * H, tiles)](
            q, k, v, g, beta, do, dht if dht is not None else dh0, ckpt, table,
            dqp, dkp, dgp, dbp, dv, dh0, B, T, H, DK, DV, scale, int(dht is not None),
            *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(), *do.stride(),
            LOG_CHUNK=chunk.bit_length() - 1, CHUNK=chunk, BLOCK_K=block_k,
            BLOCK_V=block_v, DOT_PRECISION=_DOT_PRECISION, num_warps=4, num_stages=1,
        )
    return dqp.sum(0).to(q.dtype), dkp.sum(0).to(k.dtype), dv.to(v.dtype), dgp.sum(0), dbp.sum(0), dh0


class _GatedDeltaRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, seqs, chunk):
        h0 = None if initial_state is None else initial_state.contiguous()
        save = any(ctx.needs_input_grad)
        # the gates in fp32 (a [B, T, H] copy at most): one compile per input dtype, not per pair
        g32, beta32 = g.to(torch.float32), beta.to(torch.float32)
        o, final, table, ckpt = _forward(q, k, v, g32, beta32, scale, h0, seqs, chunk, save)
        if save:
            ctx.save_for_backward(q, k, v, g32, beta32, table, ckpt)
            ctx.scale, ctx.chunk, ctx.has_h0, ctx.gate_dtypes = scale, chunk, initial_state is not None, \
                (g.dtype, beta.dtype)
        return o, final

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, table, ckpt = ctx.saved_tensors
        if do is None:
            do = torch.zeros(q.shape[:3] + (v.shape[3],), dtype=q.dtype, device=q.device)
        dq, dk, dv, dg, db, dh0 = _backward(q, k, v, g, beta, ctx.scale, table, ckpt, do, dht, ctx.chunk)
        return (dq, dk, dv, dg.to(ctx.gate_dtypes[0]), db.to(ctx.gate_dtypes[1]), None,
                dh0 if ctx.has_h0 else None, None, None)


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_size=None):
    """The gated delta rule, chunked (module docstring): returns ``(o, final_state)``.

    ``chunk_size`` (beyond the contract) picks the chunk from ``gated_delta_rule.chunk_sizes``;
    None means ``gated_delta_rule.default_chunk_size``; K above 64 caps it at 32 (shared memory). Autograd to q, k, v, g, beta and
    initial_state through the chunked Triton backward."""
    seqs = _check_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_size)
    chunk = _DEFAULT_CHUNK if chunk_size is None else int(chunk_size)
    if _blocks(q.shape[3], v.shape[3])[0] > 64:
        chunk = min(chunk, _WIDE_K_CHUNK)
    scale = q.shape[3] ** -0.5 if scale is None else float(scale)
    return _GatedDeltaRule.apply(q, k, v, g, beta, scale, initial_state, seqs, chunk)


gated_delta_rule.dtypes = _DTYPES
gated_delta_rule.supports_backward = True
gated_delta_rule.fp32_dot_precision = _DOT_PRECISION
gated_delta_rule.bf16_dot_upcast = True  # every operand is cast to fp32 before tl.dot
gated_delta_rule.chunk_sizes = _CHUNK_SIZES
gated_delta_rule.default_chunk_size = _DEFAULT_CHUNK
gated_delta_rule.max_head_dim = _MAX_HEAD_DIM
