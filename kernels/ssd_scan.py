"""Mamba-2's SSD scan in Triton: a chunked forward and a chunked reverse-mode backward.

Contract (``docs/contract.md``)::

    ssd_scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0,
             dt_max=inf, initial_state=None, cu_seqlens=None) -> (y, final_state)

    x, z [B, T, H, P], B, C [B, T, G, N] (one dtype); dt [B, T, H], A, D, dt_bias [H] (any
    float dtype); initial_state, final_state [S, H, P, N] float32: S = B sequences, or
    len(cu_seqlens) - 1 packed sequences (B = 1) delimited by cu_seqlens (int32/int64)

Per sequence and head h (group g = h // (H / G)), token by token (``references/ssd_scan.py``)::

    d_t = clamp(softplus?(dt_t + dt_bias), dt_min, dt_max)
    h_t = exp(d_t A) h_{t-1} + d_t x_t B_t^T;   y_t = (h_t C_t + D x_t) silu(z_t)

Forward, chunked: one program per (sequence, head, 32-row tile of P) walks its sequence in
chunks of C tokens (``ssd_scan.chunk_sizes`` = 16, 32, 64; default 64) carrying the fp32 state h_0 [tile, N]. Per chunk, with G the fp32 cumulative sum of
d_i A inside the chunk, gamma_i = exp(G_i), R_ij = exp(G_i - G_j) on j <= i (exactly 0
above, where the positive exponents are never exponentiated)::

    L   = lower(C B^T * R * d_j)                              (inclusive: j <= i)  [C, C]
    Y   = diag(gamma) C h_0^T + L X + D X,  times silu(Z)                          [C, tile]
    h_0 <- gamma_last h_0 + X^T diag(R_last,: d) B

The step d is computed in the kernel in fp32: softplus as max(v, 0) + log1p(exp(-|v|)),
log1p(e) = 2 atanh(e / (2 + e)) by its series (s <= 1/3: eight terms reach fp32's
roundoff), accurate to a few ulps where log(1 + exp(v)) loses every bit of a small
softplus (v = -20: 2e-9, and 1 + 2e-9 is 1 in fp32).

Backward, chunked, in reverse chunk order: the forward saves the state at every chunk
start (fp32 [chunks, H, P, N]); the backward recomputes the chunk's decays, C B^T and
(with z) the ungated Y from it, and takes the reverse mode of the lines above, carrying
the adjoint of the state from d final_state (dY = dO silu(Z); dX = L^T dY + D dY +
diag(R_last,: d) B adj^T; dC = diag(gamma) dY h_0 + M B and dB = M^T C + diag(R_last,: d)
X adj with M = lower(dY X^T * R * d_j); dd from L and the write; dG through R, gamma and
the decays to the chunk's end, da_t = sum_{i >= t} dG_i + dG_last; adj <- gamma_last adj +
dY^T diag(gamma) C), d initial_state the adjoint at the start. dB, dC, dd, dA and dD sum
over P (and dB, dC over a group's heads, dA, dD over tokens): each program writes partial
sums to fp32 buffers added by PyTorch (deterministic, no atomics); the chain rule through
the clamp and softplus to dt and dt_bias runs in PyTorch on the [B, T, H] step.

Precision: every operand is loaded and cast to fp32; products are ``tl.dot(...,
input_precision="ieee")`` (``ssd_scan.fp32_dot_precision``; "tf32x3" for float16 inputs,
see ``_DOT_PRECISION``) or fp32 FMA reductions,
accumulation and state in fp32; y is stored once in the input dtype. Offsets are int64
(the batch row of a [B, T, H, P] tensor past 2**31 elements).

Shared memory (triton.compile for sm_90 on a CPU, bf16 and fp32 alike): at chunk 64 the
forward takes 32 KiB and the backward 64 KiB at N 64, 64 and 96 KiB at N 128, inside an
H100/H200 block's 227 KiB, so no head dim caps the chunk.

Sizes: any T >= 0 (an empty sequence launches nothing for itself: its final state is its
initial state), P and N from 1 to 128 (padded to powers of two of at least 16 with
masks), G dividing H, any strides.
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
_MAX_DIM = 128
_CHUNK_SIZES = (16, 32, 64)
_DEFAULT_CHUNK = 64
_P_TILE = 32  # rows of P per program: the state tile [32, N] stays in registers at N = 128
# float32 and bfloat16 inputs: IEEE fp32 products (FMA units), not "tf32x3". Its split a = tf32(a) +
# rest rounds an operand within 2**-11 of fp32's largest value up to inf (the rest -inf, the dot NaN),
# and the contract lets B reach fp32's largest value where d |B| stays finite (float32 NaN on an
# H200, 2026-11-28); and the tensor cores read fp32 subnormals (bfloat16's subnormals are fp32's) as
# 0, which the gradient rules do not charge (bfloat16 dB 1.99x over on the H200 with tf32x3, within
# the rule with IEEE dots on the same profile). float16 operands are normal fp32 values far from the
# largest, so they keep tf32x3: the IEEE form compiles 1.6-3.4x slower for sm_90 (the backward at
# N = 128: 101 s against 30 s on one CPU core).
_DOT_PRECISION = "ieee"  # the declared precision of fp32 tl.dot (float32 inputs)
_FLOAT16_DOT_PRECISION = "tf32x3"  # fp32 tl.dot of operands cast up from float16


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _softplus(v):
    """softplus(v) = max(v, 0) + log1p(e), e = exp(-|v|) in (0, 1]; log1p(e) = 2 atanh(s),
    s = e / (2 + e) <= 1/3, by its series 2 s sum_k s^2k / (2k + 1) to k = 7 (the next
    term is below 9^-8 / 17 = 1.4e-9 of the sum): no log, so no absolute error of a log
    near 1 turns into a relative error of a small result."""
    e = tl.exp(-tl.abs(v))
    s = e / (2.0 + e)
    s2 = s * s
    series = 1.0 / 15.0
    series = series * s2 + 1.0 / 13.0
    series = series * s2 + 1.0 / 11.0
    series = series * s2 + 1.0 / 9.0
    series = series * s2 + 1.0 / 7.0
    series = series * s2 + 1.0 / 5.0
    series = series * s2 + 1.0 / 3.0
    series = series * s2 + 1.0
    return tl.maximum(v, 0.0) + 2.0 * s * series


@triton.jit
def _chunk_decays(raw, bias, a_h, t_ok, rows, dt_min, dt_max, DT_SOFTPLUS):
    """One chunk's steps and decays: d (0 on padded rows), G = cumsum(d A) in fp32,
    gamma = exp(G), R_ij = exp(G_i - G_j) on j <= i (0 above, never exp of a positive
    exponent), exp(G_last - G_j) (exactly 1 for the last token, 0 on padded rows), G_last."""
    v = raw + bias
    if DT_SOFTPLUS:
        v = _softplus(v)
    d = tl.where(t_ok, tl.minimum(tl.maximum(v, dt_min), dt_max), 0.0)
    lower = rows[None, :] <= rows[:, None]
    cum = tl.cumsum(d * a_h, axis=0)
    gamma = tl.exp(cum)
    ratio = tl.where(lower, tl.exp(tl.where(lower, cum[:, None] - cum[None, :], 0.0)), 0.0)
    last = tl.sum(tl.where(rows == tl.sum(t_ok.to(tl.int32), axis=0) - 1, cum, 0.0), axis=0)
    to_end = tl.where(t_ok, tl.exp(last - cum), 0.0)
    return d, gamma, ratio, to_end, last


@unspecialised_jit
def _ssd_fwd_kernel(
    X, DT, B, C, Z,  # inputs [batch, T, *, *], any strides (DT fp32 [batch, T, H])
    A, DSKIP, DTB,  # fp32 [H]: decay rate, skip weight, step bias (zeros when absent)
    H0,  # initial state [S, H, P, N] fp32 contiguous (read when HAS_H0)
    Y,  # out: y [batch, T, H, P] in the input dtype, contiguous
    HT,  # out: final state [S, H, P, N] fp32 contiguous
    CKPT,  # out (SAVE): the state at each chunk's start [chunks, H, P, N] fp32
    SEQ,  # int64 [S, 4]: batch row, first token, end token, first chunk of each sequence
    H, HEADS_PER_GROUP, DP, DN, dt_min, dt_max,
    HAS_Z, HAS_H0, SAVE, DT_SOFTPLUS,  # runtime flags (0/1)
    sxb, sxt, sxh, sxp,  # strides of X
    sdb, sdt, sdh,  # strides of DT
    sbb, sbt, sbg, sbn,  # strides of B
    scb, sct, scg, scn,  # strides of C
    szb, szt, szh, szp,  # strides of Z
    syb, syt, syh, syp,  # strides of Y
    CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    nh = tl.program_id(0).to(tl.int64)
    n = nh // H
    h = nh % H
    grp = h // HEADS_PER_GROUP  # the group whose B and C this head reads
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    rows = tl.arange(0, CHUNK)
    p_ok = offs_p < DP
    n_ok = offs_n < DN
    pn_ok = p_ok[:, None] & n_ok[None, :]
    row = tl.load(SEQ + n * 4)  # int64: row * stride passes 2**31 in a large batch
    start = tl.load(SEQ + n * 4 + 1)
    length = tl.load(SEQ + n * 4 + 2) - start
    first_chunk = tl.load(SEQ + n * 4 + 3)
    a_h = tl.load(A + h)
    d_skip = tl.load(DSKIP + h)
    bias = tl.load(DTB + h)
    lower = rows[None, :] <= rows[:, None]  # j <= i: a token's own write reaches its output
    state_offs = offs_p[:, None] * DN + offs_n[None, :]  # [P, N] fp32 state, row-major
    state = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    if HAS_H0:
        state = tl.load(H0 + nh * DP * DN + state_offs, mask=pn_ok, other=0.0)
    for c0 in range(0, length, CHUNK):
        if SAVE:
            tl.store(CKPT + ((first_chunk + c0 // CHUNK) * H + h) * DP * DN + state_offs, state, mask=pn_ok)
        tok = start + c0 + rows  # int64 token indices
        t_ok = c0 + rows < length
        tp_ok = t_ok[:, None] & p_ok[None, :]
        tn_ok = t_ok[:, None] & n_ok[None, :]
        x = tl.load(X + row * sxb + tok[:, None] * sxt + h * sxh + offs_p[None, :] * sxp, mask=tp_ok,
                    other=0.0).to(tl.float32)
        b = tl.load(B + row * sbb + tok[:, None] * sbt + grp * sbg + offs_n[None, :] * sbn, mask=tn_ok,
                    other=0.0).to(tl.float32)
        c = tl.load(C + row * scb + tok[:, None] * sct + grp * scg + offs_n[None, :] * scn, mask=tn_ok,
                    other=0.0).to(tl.float32)
        raw = tl.load(DT + row * sdb + tok * sdt + h * sdh, mask=t_ok, other=0.0)
        d, gamma, ratio, to_end, last = _chunk_decays(raw, bias, a_h, t_ok, rows, dt_min, dt_max, DT_SOFTPLUS)
        scores = tl.where(lower, tl.dot(c, tl.trans(b), input_precision=DOT_PRECISION) * ratio * d[None, :], 0.0)
        y = gamma[:, None] * tl.dot(c, tl.trans(state), input_precision=DOT_PRECISION) \
            + tl.dot(scores, x, input_precision=DOT_PRECISION) + d_skip * x
        if HAS_Z:
            zz = tl.load(Z + row * szb + tok[:, None] * szt + h * szh + offs_p[None, :] * szp, mask=tp_ok,
                         other=0.0).to(tl.float32)
            y = y * zz * tl.sigmoid(zz)
        tl.store(Y + row * syb + tok[:, None] * syt + h * syh + offs_p[None, :] * syp, y.to(Y.dtype.element_ty),
                 mask=tp_ok)
        # carry the state past the chunk: every token's write decayed to the chunk's end
        state = tl.exp(last) * state + tl.dot(tl.trans(x * (to_end * d)[:, None]), b, input_precision=DOT_PRECISION)
    tl.store(HT + nh * DP * DN + state_offs, state, mask=pn_ok)


@unspecialised_jit
def _ssd_bwd_kernel(
    X, DT, B, C, Z,  # the forward's inputs, any strides (DT fp32)
    A, DSKIP, DTB,  # fp32 [H]
    DO,  # upstream gradient of y [batch, T, H, P], any strides
    DHT,  # upstream gradient of the final state [S, H, P, N] fp32 contiguous (HAS_DHT)
    CKPT,  # the forward's chunk-start states [chunks, H, P, N] fp32
    SEQ,  # int64 [S, 4] as in the forward
    DX_OUT, DZ_OUT,  # out: fp32 [batch, T, H, P]
    DBP, DCP,  # out: fp32 [tiles, batch, T, H, N] partial sums over this program's P tile
    DDP,  # out: fp32 [tiles, batch, T, H] partial sums of d loss / d step
    DAP, DSP,  # out: fp32 [tiles, S, H] partial sums of dA and dD
    DH0,  # out: fp32 [S, H, P, N]
    n_batch, T, H, HEADS_PER_GROUP, DP, DN, dt_min, dt_max,
    HAS_Z, HAS_DHT, DT_SOFTPLUS,  # runtime flags (0/1)
    sxb, sxt, sxh, sxp,
    sdb, sdt, sdh,
    sbb, sbt, sbg, sbn,
    scb, sct, scg, scn,
    szb, szt, szh, szp,
    sob, sot, soh, sop,  # strides of DO
    CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    nh = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1).to(tl.int64)
    n = nh // H
    h = nh % H
    grp = h // HEADS_PER_GROUP
    n_seq = tl.num_programs(0) // H
    offs_p = tile * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    rows = tl.arange(0, CHUNK)
    p_ok = offs_p < DP
    n_ok = offs_n < DN
    pn_ok = p_ok[:, None] & n_ok[None, :]
    row = tl.load(SEQ + n * 4)
    start = tl.load(SEQ + n * 4 + 1)
    length = tl.load(SEQ + n * 4 + 2) - start
    first_chunk = tl.load(SEQ + n * 4 + 3)
    a_h = tl.load(A + h)
    d_skip = tl.load(DSKIP + h)
    bias = tl.load(DTB + h)
    lower = rows[None, :] <= rows[:, None]
    state_offs = offs_p[:, None] * DN + offs_n[None, :]
    adj = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)  # the adjoint of the state at the chunk's end
    if HAS_DHT:
        adj = tl.load(DHT + nh * DP * DN + state_offs, mask=pn_ok, other=0.0)
    da_sum = 0.0
    dd_sum = 0.0
    n_chunks = (length + CHUNK - 1) // CHUNK
    for cc in range(0, n_chunks):
        c0 = (n_chunks - 1 - cc) * CHUNK
        state = tl.load(CKPT + ((first_chunk + c0 // CHUNK) * H + h) * DP * DN + state_offs, mask=pn_ok, other=0.0)
        tok = start + c0 + rows
        t_ok = c0 + rows < length
        tp_ok = t_ok[:, None] & p_ok[None, :]
        tn_ok = t_ok[:, None] & n_ok[None, :]
        x = tl.load(X + row * sxb + tok[:, None] * sxt + h * sxh + offs_p[None, :] * sxp, mask=tp_ok,
                    other=0.0).to(tl.float32)
        b = tl.load(B + row * sbb + tok[:, None] * sbt + grp * sbg + offs_n[None, :] * sbn, mask=tn_ok,
                    other=0.0).to(tl.float32)
        c = tl.load(C + row * scb + tok[:, None] * sct + grp * scg + offs_n[None, :] * scn, mask=tn_ok,
                    other=0.0).to(tl.float32)
        do = tl.load(DO + row * sob + tok[:, None] * sot + h * soh + offs_p[None, :] * sop, mask=tp_ok,
                     other=0.0).to(tl.float32)
        raw = tl.load(DT + row * sdb + tok * sdt + h * sdh, mask=t_ok, other=0.0)
        d, gamma, ratio, to_end, last = _chunk_decays(raw, bias, a_h, t_ok, rows, dt_min, dt_max, DT_SOFTPLUS)
        cb = tl.dot(c, tl.trans(b), input_precision=DOT_PRECISION)
        scores = tl.where(lower, cb * ratio * d[None, :], 0.0)
        ch0 = tl.dot(c, tl.trans(state), input_precision=DOT_PRECISION)  # C_i . h_0[p, :]
        flat = (row * T + tok) * H + h  # [batch, T, H] positions of the chunk's tokens
        dy = do
        if HAS_Z:
            zz = tl.load(Z + row * szb + tok[:, None] * szt + h * szh + offs_p[None, :] * szp, mask=tp_ok,
                         other=0.0).to(tl.float32)
            y = gamma[:, None] * ch0 + tl.dot(scores, x, input_precision=DOT_PRECISION) + d_skip * x
            sg = tl.sigmoid(zz)
            dy = do * zz * sg
            tl.store(DZ_OUT + flat[:, None] * DP + offs_p[None, :], do * y * sg * (1.0 + zz * (1.0 - sg)),
                     mask=tp_ok)
        w = to_end * d  # each write's weight at the chunk's end
        x_adj = tl.dot(x, adj, input_precision=DOT_PRECISION)  # x_j^T adj: [C, N]
        dx = tl.dot(tl.trans(scores), dy, input_precision=DOT_PRECISION) + d_skip * dy \
            + tl.dot(b * w[:, None], tl.trans(adj), input_precision=DOT_PRECISION)  # weighted first, as written
        dd_sum += tl.sum(tl.sum(dy * x, axis=1), axis=0)
        dyx = tl.dot(dy, tl.trans(x), input_precision=DOT_PRECISION)  # dY_i . X_j
        m = tl.where(lower, dyx * ratio * d[None, :], 0.0)
        dc = gamma[:, None] * tl.dot(dy, state, input_precision=DOT_PRECISION) \
            + tl.dot(m, b, input_precision=DOT_PRECISION)
        db = tl.dot(tl.trans(m), c, input_precision=DOT_PRECISION) + w[:, None] * x_adj
        q = tl.where(lower, dyx * cb * ratio, 0.0)  # d loss / d d_j through L_ij, before the sum over i
        write = tl.sum(x_adj * b, axis=1)  # x_j^T adj B_j
        d_step = tl.sum(q, axis=0) + to_end * write
        # d/dG: through R_ij = exp(G_i - G_j), gamma_i = exp(G_i), exp(G_last - G_j), exp(G_last)
        qd = q * d[None, :]
        e = w * write
        d_cum = tl.sum(qd, axis=1) - tl.sum(qd, axis=0) + tl.sum(ch0 * dy, axis=1) * gamma - e
        d_last = tl.sum(e, axis=0) + tl.exp(last) * tl.sum(tl.sum(adj * state, axis=1), axis=0)
        # G_i = sum_{t <= i} d_t A and G_last = sum_t d_t A: d(d_t A) = sum_{i >= t} dG_i + dG_last
        da = tl.where(t_ok, tl.sum(tl.where(rows[None, :] >= rows[:, None], d_cum[None, :], 0.0), axis=1) + d_last,
                      0.0)
        da_sum += tl.sum(d * da, axis=0)
        adj = tl.exp(last) * adj + tl.dot(tl.trans(dy * gamma[:, None]), c, input_precision=DOT_PRECISION)
        part = tile * n_batch * T * H + flat
        tl.store(DX_OUT + flat[:, None] * DP + offs_p[None, :], dx, mask=tp_ok)
        tl.store(DBP + part[:, None] * DN + offs_n[None, :], db, mask=tn_ok)
        tl.store(DCP + part[:, None] * DN + offs_n[None, :], dc, mask=tn_ok)
        tl.store(DDP + part, d_step + a_h * da, mask=t_ok)
    tl.store(DAP + (tile * n_seq + n) * H + h, da_sum)
    tl.store(DSP + (tile * n_seq + n) * H + h, dd_sum)
    tl.store(DH0 + nh * DP * DN + state_offs, adj, mask=pn_ok)


# ----------------------------------------------------------------------------------- host


def _tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _float_tensor(name: str, t) -> torch.Tensor:
    _tensor(name, t)
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} has unsupported dtype {t.dtype}; expected one of {_DTYPES}")
    return t


def _offsets(cu_seqlens, n_tokens: int, batch: int, device) -> list[int]:
    """cu_seqlens as a list of ints, validated (one host read: the chunk table needs it)."""
    cu = _tensor("cu_seqlens", cu_seqlens)
    if cu.dtype not in _OFFSET_DTYPES:
        raise TypeError(f"cu_seqlens must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D [S + 1] with S >= 1, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"cu_seqlens is on {cu.device}, x on {device}")
    if batch != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 (packed sequences), got {batch} (cu_seqlens)")
    values = [int(c) for c in cu.tolist()]
    if values[0] != 0 or values[-1] != n_tokens or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"cu_seqlens must start at 0, never decrease and end at T = {n_tokens}, got {values}")
    return values


def _step_bound(name: str, value, lowest: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or value < lowest:
        raise ValueError(f"{name} must be a real number >= {lowest}, got {value!r}")
    return float(value)


def _check_inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens,
                  chunk_size) -> list[tuple[int, int, int]]:
    """Validate every argument; returns (batch row, first token, end token) per sequence."""
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        _float_tensor(name, t)
    for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias)):
        if t is not None:
            _float_tensor(name, t)
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D [B, T, H, P], got shape {tuple(x.shape)}")
    n_batch, n_tok, H, P = x.shape
    for name, t in (("B", B), ("C", C)):
        if t.dtype != x.dtype:
            raise TypeError(f"{name} must have x's dtype {x.dtype}, got {t.dtype}")
        if t.dim() != 4 or t.shape[:2] != x.shape[:2]:
            raise ValueError(f"{name} must be [B, T, G, N] with x's B, T {tuple(x.shape[:2])}, got {tuple(t.shape)}")
    if C.shape != B.shape:
        raise ValueError(f"C must have B's shape {tuple(B.shape)}, got {tuple(C.shape)}")
    G, N = B.shape[2], B.shape[3]
    if G < 1 or H % G:
        raise ValueError(f"the groups G = {G} of B and C must divide the heads H = {H} of x")
    if dt.shape != x.shape[:3]:
        raise ValueError(f"dt must be [B, T, H] = {tuple(x.shape[:3])}, got {tuple(dt.shape)}")
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if t is not None and t.shape != (H,):
            raise ValueError(f"{name} must be [H] = ({H},), got {tuple(t.shape)}")
    if z is not None and (z.shape != x.shape or z.dtype != x.dtype):
        raise ValueError(f"z must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got {tuple(z.shape)} "
                         f"{z.dtype}")
    if not 1 <= P <= _MAX_DIM:
        raise ValueError(f"x head dim P = {P} is not supported (1..{_MAX_DIM})")
    if not 1 <= N <= _MAX_DIM:
        raise ValueError(f"B, C state dim N = {N} is not supported (1..{_MAX_DIM})")
    for name, t in (("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z), ("dt_bias", dt_bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}: one device")
    if x.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"x is on {x.device}; the Triton kernels need CUDA tensors "
                         "(or CPU tensors with TRITON_INTERPRET=1)")
    if not isinstance(dt_softplus, bool):
        raise TypeError(f"dt_softplus must be a bool, got {dt_softplus!r}")
    low = _step_bound("dt_min", dt_min, 0.0)
    if _step_bound("dt_max", dt_max, low) <= 0:
        raise ValueError(f"dt_max must be > 0, got {dt_max!r}")
    if low == math.inf:
        raise ValueError("dt_min must be finite, got inf")
    if chunk_size is not None and chunk_size not in _CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {_CHUNK_SIZES} (or None), got {chunk_size!r}")
    if cu_seqlens is None:
        seqs = [(b, 0, n_tok) for b in range(n_batch)]
    else:
        cu = _offsets(cu_seqlens, n_tok, n_batch, x.device)
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    if initial_state is not None:
        _tensor("initial_state", initial_state)
        if initial_state.dtype != torch.float32:
            raise TypeError(f"initial_state must be float32, got {initial_state.dtype}")
        want = (len(seqs), H, P, N)
        if tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state must be [S, H, P, N] = {want}, got {tuple(initial_state.shape)}")
        if initial_state.device != x.device:
            raise ValueError(f"initial_state is on {initial_state.device}, x on {x.device}")
    return seqs


def _sequence_table(seqs, chunk: int, device) -> tuple[torch.Tensor, int]:
    """int64 [S, 4] (batch row, first token, end token, first chunk) and the number of chunks."""
    rows, chunks = [], 0
    for b, s, e in seqs:
        rows.append((b, s, e, chunks))
        chunks += -(-(e - s) // chunk)
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(seqs), 4), chunks


def _blocks(P: int, N: int) -> tuple[int, int]:
    return min(_P_TILE, max(16, triton.next_power_of_2(P))), max(16, triton.next_power_of_2(N))


def _per_head(t, H: int, device) -> torch.Tensor:
    return torch.zeros(H, dtype=torch.float32, device=device) if t is None else t.to(torch.float32).contiguous()


class _Launch:
    """The arguments both kernels share, prepared once per call."""

    def __init__(self, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, seqs, chunk):
        self.n_batch, self.T, self.H, self.P = x.shape
        self.G, self.N = B.shape[2], B.shape[3]
        self.x, self.B, self.C, self.z = x, B, C, z
        self.dt = dt.to(torch.float32)  # one compile per input dtype, not per pair
        self.A, self.D, self.bias = (_per_head(t, self.H, x.device) for t in (A, D, dt_bias))
        self.softplus, self.dt_min, self.dt_max = dt_softplus, dt_min, dt_max
        self.seqs, self.chunk = seqs, chunk
        self.table, self.n_chunks = _sequence_table(seqs, chunk, x.device)
        self.block_p, self.block_n = _blocks(self.P, self.N)
        self.grid = (len(seqs) * self.H, triton.cdiv(self.P, self.block_p))

    def inputs(self):
        z = self.z if self.z is not None else self.x
        return (self.x, self.dt, self.B, self.C, z, self.A, self.D, self.bias)

    def strides(self):
        z = self.z if self.z is not None else self.x
        return (*self.x.stride(), *self.dt.stride(), *self.B.stride(), *self.C.stride(), *z.stride())

    def meta(self):
        precision = _FLOAT16_DOT_PRECISION if self.x.dtype == torch.float16 else _DOT_PRECISION
        return dict(CHUNK=self.chunk, BLOCK_P=self.block_p, BLOCK_N=self.block_n, DOT_PRECISION=precision,
                    num_warps=4, num_stages=1)


def _forward(run: _Launch, h0, save: bool):
    x = run.x
    S = len(run.seqs)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    final = torch.empty((S, run.H, run.P, run.N), dtype=torch.float32, device=x.device)
    ckpt = torch.empty((run.n_chunks if save else 0, run.H, run.P, run.N), dtype=torch.float32, device=x.device)
    if S * run.H == 0:
        return y, final, ckpt
    _ssd_fwd_kernel[run.grid](
        *run.inputs(), h0 if h0 is not None else final, y, final, ckpt if save else final, run.table,
        run.H, run.H // run.G, run.P, run.N, run.dt_min, run.dt_max,
        int(run.z is not None), int(h0 is not None), int(save), int(run.softplus),
        *run.strides(), *y.stride(), **run.meta(),
    )
    return y, final, ckpt


def _step_chain(run: _Launch, d_step: torch.Tensor) -> torch.Tensor:
    """d loss / d dt from d loss / d step, through the clamp (torch.clamp's subgradient: 1 on
    the closed interval) and softplus (its derivative sigmoid)."""
    v = run.dt + run.bias
    if run.softplus:
        grad = d_step * torch.sigmoid(v)
        v = torch.nn.functional.softplus(v, threshold=20.0)
    else:
        grad = d_step
    return torch.where((v >= run.dt_min) & (v <= run.dt_max), grad, 0.0)


def _backward(run: _Launch, ckpt, do, dht):
    x = run.x
    S, tiles = len(run.seqs), run.grid[1]
    f32 = dict(dtype=torch.float32, device=x.device)
    dx, dz = torch.zeros(x.shape, **f32), torch.zeros(x.shape if run.z is not None else (0,), **f32)
    dbp = torch.zeros((tiles, run.n_batch, run.T, run.H, run.N), **f32)
    dcp = torch.zeros((tiles, run.n_batch, run.T, run.H, run.N), **f32)
    ddp = torch.zeros((tiles, run.n_batch, run.T, run.H), **f32)
    dap, dsp = torch.zeros((tiles, S, run.H), **f32), torch.zeros((tiles, S, run.H), **f32)
    dh0 = torch.zeros((S, run.H, run.P, run.N), **f32)  # contiguous, whatever layout the upstream dht has
    dht = None if dht is None else dht.to(torch.float32).contiguous()
    if S * run.H > 0 and run.n_batch * run.T == 0 and dht is not None:
        dh0.copy_(dht)  # no token: the state passes through unchanged
    elif S * run.H > 0:
        _ssd_bwd_kernel[run.grid](
            *run.inputs(), do, dht if dht is not None else dh0, ckpt, run.table,
            dx, dz if run.z is not None else dx, dbp, dcp, ddp, dap, dsp, dh0,
            run.n_batch, run.T, run.H, run.H // run.G, run.P, run.N, run.dt_min, run.dt_max,
            int(run.z is not None), int(dht is not None), int(run.softplus),
            *run.strides(), *do.stride(), **run.meta(),
        )
    per_group = (run.n_batch, run.T, run.G, run.H // run.G, run.N)
    d_step = ddp.sum(0)
    return dict(x=dx, z=dz, B=dbp.sum(0).reshape(per_group).sum(3), C=dcp.sum(0).reshape(per_group).sum(3),
                step=d_step, dt=_step_chain(run, d_step), A=dap.sum((0, 1)), D=dsp.sum((0, 1)), h0=dh0)


class _SSDScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, z, dt_bias, initial_state, dt_softplus, dt_min, dt_max, seqs, chunk):
        run = _Launch(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, seqs, chunk)
        save = any(ctx.needs_input_grad)
        h0 = None if initial_state is None else initial_state.contiguous()
        y, final, ckpt = _forward(run, h0, save)
        if save:
            ctx.run, ctx.ckpt = run, ckpt
            ctx.dtypes = [None if t is None else t.dtype for t in (x, dt, A, B, C, D, z, dt_bias)]
            ctx.has_h0 = initial_state is not None
        return y, final

    @staticmethod
    def backward(ctx, dy, dht):
        run = ctx.run
        if dy is None:
            dy = torch.zeros(run.x.shape, dtype=run.x.dtype, device=run.x.device)
        g = _backward(run, ctx.ckpt, dy, dht)
        types = ctx.dtypes

        def cast(t, i):
            return None if types[i] is None else t.to(types[i])
        bias_grad = g["dt"].sum((0, 1))
        return (cast(g["x"], 0), cast(g["dt"], 1), cast(g["A"], 2), cast(g["B"], 3), cast(g["C"], 4),
                cast(g["D"], 5), cast(g["z"], 6), cast(bias_grad, 7), g["h0"] if ctx.has_h0 else None,
                None, None, None, None, None)


def ssd_scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0, dt_max=math.inf,
             initial_state=None, cu_seqlens=None, chunk_size=None):
    """The SSD scan, chunked (module docstring): returns ``(y, final_state)``.

    ``chunk_size`` (beyond the contract) picks the chunk from ``ssd_scan.chunk_sizes``; None
    means ``ssd_scan.default_chunk_size``. Autograd
    to x, dt, A, B, C, D, z, dt_bias and initial_state through the chunked Triton backward."""
    seqs = _check_inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens,
                         chunk_size)
    chunk = _DEFAULT_CHUNK if chunk_size is None else int(chunk_size)
    return _SSDScan.apply(x, dt, A, B, C, D, z, dt_bias, initial_state, dt_softplus, float(dt_min), float(dt_max),
                          seqs, chunk)


ssd_scan.dtypes = _DTYPES
ssd_scan.supports_backward = True
ssd_scan.fp32_dot_precision = _DOT_PRECISION
ssd_scan.bf16_dot_upcast = True  # every operand is cast to fp32 before tl.dot
ssd_scan.chunk_sizes = _CHUNK_SIZES
ssd_scan.default_chunk_size = _DEFAULT_CHUNK
ssd_scan.max_head_dim = _MAX_DIM
