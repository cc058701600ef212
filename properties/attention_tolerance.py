"""Tolerance rules of the attention family: o and lse of attention, and its gradients.

Pieces and notation: :mod:`tritoncheck.tolerance`. Evaluated in float64 torch on the
suite's device, over blocks of query rows (the N x N intermediates of long sequences
stay within ROW_BLOCK_ELEMENTS per array); a query row's quantities depend on its own
scores only, except the per-key gradient sums (dk, dv), added up over the blocks.
Arguments NumPy arrays or tensors, results NumPy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tritoncheck import backend
from tritoncheck.oracle import to_numpy
from tritoncheck.references.attention import alibi_bias_torch as _alibi_bias
from tritoncheck.references.attention import visible_pairs_torch
from tritoncheck.tolerance import (
    DOT_READ_FLOOR,
    EXP_ULPS,
    SAFETY,
    Precision,
    float64_on,
    sum_error,
    unit_roundoff,
)

# elements of one [B, H, rows, Nk] float64 intermediate (128 MiB); a block of rows holds
# about twenty of them at once
ROW_BLOCK_ELEMENTS = 2**24


def _device() -> torch.device:
    return backend.device()


def _row_blocks(heads: int, n_q: int, n_k: int):
    rows = max(1, ROW_BLOCK_ELEMENTS // max(1, heads * n_k))
    for r0 in range(0, n_q, rows):
        yield slice(r0, min(n_q, r0 + rows))


def attention_scores(q, k, causal: bool, scale: float, window=(-1, -1), alibi_slopes=None, softcap: float = 0.0,
                     rows: slice | None = None, n_q: int | None = None):
    """fp64 scores (scaled, softcapped, ALiBi-biased: tritoncheck.references.attention), -inf at masked
    (i, j) (causal and window, bottom-right aligned); and the mask of kept pairs. k has q's
    heads (GQA: see :func:`_repeat_kv`). ``q`` holds query rows ``rows`` of ``n_q`` (default: all)."""
    n_q = q.shape[-2] if n_q is None else n_q
    rows = slice(0, q.shape[-2]) if rows is None else rows
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + _alibi_bias(alibi_slopes, n_q, k.shape[-2], rows)
    visible = visible_pairs_torch(n_q, k.shape[-2], causal, tuple(window), q.device, rows).expand(s.shape)
    return s.masked_fill(~visible, float("-inf")), visible


def _repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """k or v [B, Hkv, N, D] with each KV head repeated for its group of query heads."""
    return t.repeat_interleave(heads // t.shape[-3], dim=-3)


def _visible_max(prefix_max: torch.Tensor, whole_max: torch.Tensor, rows: slice, n_q: int, causal: bool,
                 window) -> torch.Tensor:
    """[..., rows, D]: per query row, the largest x_j over the keys j it sees: the running
    max at its last key where it sees a prefix (causal or right-bounded), else the max over
    all keys ([..., 1, D], an upper bound where the band has a lower edge). A row that
    sees no key reads key 0 (its o is exactly 0)."""
    n_k = prefix_max.shape[-2]
    left, right = window
    if left >= 0 or (not causal and right < 0):
        return whole_max
    if causal:
        right = 0 if right < 0 else min(right, 0)
    last = (torch.arange(rows.start, rows.stop, device=prefix_max.device) + (n_k - n_q) + right).clamp(0, n_k - 1)
    return prefix_max[..., last, :]


def _group_sum(x, kv_heads: int):
    """[B, H, N, D] per query head -> [B, Hkv, N, D]: the sum over each KV head's group."""
    b, h = x.shape[:2]
    return x.reshape(b, kv_heads, h // kv_heads, *x.shape[2:]).sum(2)


def attention_score_error(q, k, s, visible, scale: float, p: Precision, alibi_slopes=None, softcap: float = 0.0,
                          rows: slice | None = None, n_q: int | None = None):
    """Bound (SAFETY included) on the absolute error of each score s_ij, in natural units,
    as an exponent error of p_ij: eps_ij.

    The dot q_i . k_j of D exact products accumulates in fp32: (p.dot + sum_error(D))
    scale sum_d |q_id k_jd|; the scaling (the scale's rounding, log2(e) folded in) adds
    2 u(fp32) |s_ij|. Plain PyTorch forms q @ k^T and the sm_scale product in the input
    dtype: 2 u(dtype) |s_ij| more, allowed (as softmax allows x / T in the input dtype;
    slack of about u(dtype) |s| for a kernel). The exponent s_ij - m (m <= the row max;
    running maxima only get closer to s_ij) rounds (u |s_ij - m|), exp/exp2 adds
    EXP_ULPS u. Operands below the smallest normal: DOT_READ_FLOOR scale (sum_d |q_id| + |k_jd|).

    Softcap (s_c = c tanh(r / c), raw score r = scale q.k): r's error e_r as above (plus
    u |r| for r / c in fp32 and u(dtype) |r| in the dtype) passes through the cap with
    derivative 1 - tanh^2 at a point between r and r + e_r: at most
    g = 1 - tanh(max(0, |r| - e_r) / c)^2 (a saturated score barely moves). Then tanh's
    own absolute error (2 EXP_ULPS + 7) u (``kernels.attention._tanh``) times c; the
    product c t, the log2(e) product and the scale path's conversion, u |s_c| each; in the
    dtype, torch.tanh and the products: 3 u(dtype) |s_c|.
    ALiBi (s = s_c - slope |i + Nk - Nq - j|, slopes exact in fp32): slope * distance and
    the subtraction round, u (|bias| + |s|) in fp32 and again in the dtype for plain
    PyTorch; the reference takes the same fp32 slopes exactly, so their rounding does not count.
    """
    d = q.shape[-1]
    kt = k.transpose(-1, -2)
    a = scale * (q.abs() @ kt.abs())
    reads = scale * DOT_READ_FLOOR * (q.abs().sum(-1)[..., :, None] + k.abs().sum(-1)[..., None, :])
    u_in = unit_roundoff(p.dtype)
    m = s.amax(-1, keepdim=True)
    if not softcap and alibi_slopes is None:
        eps = SAFETY * ((p.dot + sum_error(d, p.compute)) * a + reads + 2 * (u_in + p.compute) * s.abs()
                        + p.compute * ((s - m).abs() + EXP_ULPS))
        return torch.where(visible, eps, 0.0)
    raw = (q @ kt).abs() * scale
    e_raw = (p.dot + sum_error(d, p.compute)) * a + reads + 2 * (u_in + p.compute) * raw
    if alibi_slopes is None:
        bias = torch.zeros_like(raw)
    else:
        rows = slice(0, q.shape[-2]) if rows is None else rows
        bias = _alibi_bias(alibi_slopes, q.shape[-2] if n_q is None else n_q, k.shape[-2], rows).abs().expand(raw.shape)
    after = 2 * p.compute * s.abs() + (p.compute + u_in) * (bias + s.abs())
    if softcap:
        e_raw = e_raw + (p.compute + u_in) * raw
        g = 1.0 - torch.tanh((raw - SAFETY * e_raw).clamp(min=0.0) / softcap) ** 2
        capped = torch.where(visible, s, 0.0).abs() + bias  # |s_c| <= |s| + |bias|
        e_raw = g * e_raw
        after = after + p.compute * (softcap * (2 * EXP_ULPS + 7) + 2 * capped) + 3 * u_in * capped
    eps = SAFETY * (e_raw + after + p.compute * ((s - m).abs() + EXP_ULPS))
    return torch.where(visible, eps, 0.0)


def _attention_parts(p: Precision):
    """(u_p, p_floor): the relative rounding of P (and dS) before their products, and the
    absolute rounding of a P or dS entry in the subnormal range.

    FlashAttention kernels and plain PyTorch round P and dS to the input dtype for fp16 /
    bf16 (this kernel for bf16: tf32 on the GPU, <= 2 u(tf32) with truncation, fp32 in
    the interpreter, both within u(bf16)); fp32 products carry p.dot. p_floor: the
    dtype's subnormal spacing, or tiny(fp32) where a GPU flushes.
    """
    info = torch.finfo(p.dtype)
    u_p = unit_roundoff(p.dtype) if p.dtype in (torch.float16, torch.bfloat16) else p.dot
    p_floor = max(float(info.tiny) * float(info.eps), float(torch.finfo(torch.float32).tiny))
    return u_p, p_floor


def attention_floor(p: Precision) -> float:
    """p.floor, doubled under the interpreter for bfloat16: its fp32 -> bf16 store maps
    fp32 subnormals to wrong values up to about tiny(bf16) away (Triton 3.9:
    -1.42e-39 -> -1.10e-38), just past p.floor = tiny alone."""
    if p.backend == "interpret" and p.dtype == torch.bfloat16:
        return 2 * p.floor
    return p.floor


def _key_ids(k: torch.Tensor) -> torch.Tensor:
    """[..., Nk] int64: ids of the distinct rows of k, bit for bit, per batch and head."""
    bits = k.contiguous().view(torch.int64)
    ids = torch.empty(k.shape[:-1], dtype=torch.int64, device=k.device)
    for b in range(k.shape[0]):
        for h in range(k.shape[1]):
            ids[b, h] = torch.unique(bits[b, h], dim=0, return_inverse=True)[1]
    return ids


def _same_key_as(ids: torch.Tensor, jstar: torch.Tensor) -> torch.Tensor:
    """[..., rows, Nk]: whether key j's row of k equals, bit for bit, the row of key
    jstar[..., i] (``ids`` from :func:`_key_ids`, so memory stays rows x Nk)."""
    rows_ids = ids[..., None, :].expand(*jstar.shape[:-1], ids.shape[-1])
    return rows_ids == torch.gather(rows_ids, -1, jstar)


def _log_weights(s: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """log p_ij = (s_ij - m_i) - log sum_j exp(s_ij - m_i), -inf where masked. Not s - lse:
    for scores >= 1e16, lse = m + log(sum) rounds to m in fp64 (equal scores: weights 1)."""
    m = s.masked_fill(~visible, float("-inf")).amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0.0)
    d = torch.where(visible, s - m, float("-inf"))
    return d - torch.log(torch.exp(d).sum(-1, keepdim=True))


@dataclass
class _Problem:
    """One attention call's fp64 tensors on the rule's device (k, v repeated per query
    head), and what every block of query rows needs from all the keys."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    lse: torch.Tensor
    causal: bool
    scale: float
    p: Precision
    window: tuple[int, int]
    alibi_slopes: torch.Tensor | None
    softcap: float

    @classmethod
    def of(cls, q, k, v, o, lse, causal, scale, p, window, alibi_slopes, softcap) -> "_Problem":
        dev = _device()
        q = float64_on(q, dev)
        k, v = (_repeat_kv(float64_on(t, dev), q.shape[-3]) for t in (k, v))
        slopes = None if alibi_slopes is None else float64_on(alibi_slopes, dev)
        return cls(q, k, v, float64_on(o, dev), float64_on(lse, dev), bool(causal), float(scale), p, tuple(window), slopes,
                   float(softcap))

    def __post_init__(self):
        v = self.v
        # the midrange of each value column: a centre c for |v_j - o| <= |v_j - c| + |o - c|
        c = (v.amax(-2, keepdim=True) + v.amin(-2, keepdim=True)) / 2
        self.centre = torch.where(torch.isfinite(c), c, 0.0)
        self.dv_c = (v - self.centre).abs()
        self.av = v.abs()
        # running maxima over the keys (a row's visible prefix) and over all keys
        self.dv_c_max = (self.dv_c.cummax(-2).values, self.dv_c.amax(-2, keepdim=True))
        self.av_max = (self.av.cummax(-2).values, self.av.amax(-2, keepdim=True))
        self.key_ids = _key_ids(self.k) if self.alibi_slopes is None else None

    @property
    def n_q(self) -> int:
        return self.q.shape[-2]

    def blocks(self):
        return _row_blocks(self.q.shape[0] * self.q.shape[1], self.n_q, self.k.shape[-2])


@dataclass
class _Block:
    """A block of query rows: their scores and weights, and their forward allowances."""

    rows: slice
    s: torch.Tensor
    visible: torch.Tensor
    eps: torch.Tensor
    logp: torch.Tensor
    pr: torch.Tensor
    o_allowed: torch.Tensor
    lse_allowed: torch.Tensor


def _forward_block(pb: _Problem, rows: slice, keep: torch.Tensor | None = None, c: float = 1.0) -> _Block:
    """:func:`attention`'s rule for query rows ``rows``; with the keep mask of those rows
    and the dropout factor c = 1 / (1 - p), :func:`attention_dropout`'s o."""
    p = pb.p
    q, k = pb.q[..., rows, :], pb.k
    s, visible = attention_scores(q, k, pb.causal, pb.scale, pb.window, pb.alibi_slopes, pb.softcap, rows, pb.n_q)
    eps = attention_score_error(q, k, s, visible, pb.scale, p, pb.alibi_slopes, pb.softcap, rows, pb.n_q)
    o, lse = pb.o[..., rows, :], pb.lse[..., rows]
    logp = _log_weights(s, visible)
    pr = torch.where(visible, torch.exp(logp), 0.0)
    # keys each row sees; a row that sees none counts 1 (its pr is 0, o exactly 0)
    n = visible.sum(-1, keepdim=True).clamp(min=1).to(torch.float64)
    nb = torch.ceil(n / 16)
    jstar = s.argmax(-1, keepdim=True)
    eps_star = torch.gather(eps, -1, jstar)
    top = torch.arange(s.shape[-1], device=s.device) == jstar
    # A key whose row of k is the top key's, bit for bit, shares every rounding of its score
    # but the dot's own (the old rule gave it no error at all, wrongly): a GEMM may sum its columns in other orders (PyTorch's CPU matmul
    # gave the last of five equal keys a score one ulp of 3.8e19 lower, so weight 0), two
    # orders differ by at most twice the dot's error bound, (p.dot + sum_error(d)) scale
    # sum_d |q_d k_d| each. Not with ALiBi: the bias, and its rounding, differ per key position.
    twin = _same_key_as(pb.key_ids, jstar) if pb.key_ids is not None else torch.zeros_like(visible)
    k_star = torch.gather(k, -2, jstar.expand(*jstar.shape[:-1], k.shape[-1]))
    a_star = pb.scale * (q.abs() * k_star.abs()).sum(-1, keepdim=True)
    e_twin = SAFETY * 2 * (p.dot + sum_error(q.shape[-1], p.compute)) * a_star
    big_e = torch.where(visible & ~top, torch.where(twin, e_twin, eps + eps_star), 0.0)
    # p_j (e^{E_j} - 1) in the log domain (p_j may underflow where the product does not);
    # exponents clipped at 300, where the allowance is capped anyway
    w = torch.where(visible, torch.exp((logp + big_e).clamp(max=300.0)), 0.0) - pr
    # z bounds the perturbed normaliser from below, with p_max >= 1/n: for scores near
    # 1e76, fp64's p_max can come out 0, and 1/n keeps the bound finite and true
    z = torch.maximum(torch.maximum(torch.gather(pr, -1, jstar), 1.0 / n),
                      (pr * torch.exp(-big_e)).sum(-1, keepdim=True))
    if keep is None:
        o_allowed = _plain_o_allowed(pb, rows, o, visible, pr, w, z, n, nb)
    else:
        o_allowed = _dropout_o_allowed(pb, rows, o, keep & visible, c, pr, w, z, n, nb)

    t = torch.where(visible, s + eps, float("-inf"))
    mt = t.amax(-1, keepdim=True)
    lse_score = (mt + torch.log(torch.exp(t - mt).sum(-1, keepdim=True)))[..., 0] - lse
    m = s.amax(-1)
    s_min = torch.where(visible, s, float("inf")).amin(-1)
    n, nb = n[..., 0], nb[..., 0]
    lse_allowed = lse_score.clamp(min=0.0) + SAFETY * (
        sum_error(n, p.compute) + nb * p.compute * (EXP_ULPS + 2) + p.compute * (m - s_min)
        + p.compute * (2 * m.abs() + lse.abs() + (lse - m).abs() + EXP_ULPS)) \
        + float(torch.finfo(torch.float32).tiny)
    # a row that sees no key is exact (o = 0, lse = -inf): allowance 0, not the NaN of
    # -inf - -inf above, so sums of allowances stay finite
    sees = visible.any(-1)
    o_allowed = torch.where(sees[..., None], o_allowed, 0.0)
    lse_allowed = torch.where(sees, lse_allowed, 0.0)
    return _Block(rows, s, visible, eps, logp, pr, o_allowed, lse_allowed)


def _plain_o_allowed(pb: _Problem, rows: slice, o, visible, pr, w, z, n, nb) -> torch.Tensor:
    """The o part of :func:`attention`'s rule for a block of rows (derivation there)."""
    p = pb.p
    u_p, p_floor = _attention_parts(p)
    tiny = float(torch.finfo(p.dtype).tiny)
    av, ao = pb.av, o.abs()
    pv = pr @ av
    # |v_j - o| <= |v_j - c| + |o - c|, c each column's midrange (docstring)
    do_c = (o - pb.centre).abs()
    w_sum = w.sum(-1, keepdim=True)
    # c = 0 gives a bound too (values spread around 0): the smaller holds
    score_part = torch.minimum(w @ pb.dv_c + w_sum * do_c, w @ av + w_sum * ao) / z
    # the weights' perturbation alone keeps o' a convex combination of the visible v_j
    vdev = _visible_max(*pb.dv_c_max, rows, pb.n_q, pb.causal, pb.window)
    score_part = torch.minimum(score_part, 2 * (vdev + do_c))
    sub = (visible & (pr < 4 * tiny)).to(torch.float64)
    rounding = u_p * pv + p_floor * (sub @ av) + (sum_error(n, p.compute) + 2 * nb * p.compute) * (pv + ao) \
        + p.compute * ao + DOT_READ_FLOOR
    vmax = _visible_max(*pb.av_max, rows, pb.n_q, pb.causal, pb.window)
    return torch.minimum(score_part + SAFETY * rounding, 2 * (vmax + ao)) + p.store * ao + attention_floor(p)


def _dropout_o_allowed(pb: _Problem, rows: slice, o, kept, c: float, pr, w, z, n, nb) -> torch.Tensor:
    """The o part of :func:`attention_dropout` for a block of rows (derivation there)."""
    p = pb.p
    ao = o.abs()
    u_p, p_floor = _attention_parts(p)
    tiny = float(torch.finfo(p.dtype).tiny)
    pv = c * ((pr * kept) @ pb.av)
    w_sum = w.sum(-1, keepdim=True)
    score_part = (c * ((w * kept) @ pb.av) + w_sum * ao) / z
    # centred at the column midrange c0 (docstring): the smaller bound holds
    off_mass = (w * (c * kept.to(torch.float64) - 1.0).abs()).sum(-1, keepdim=True)
    centred = (c * ((w * kept) @ pb.dv_c) + off_mass * pb.centre.abs() + w_sum * (o - pb.centre).abs()) / z
    score_part = torch.minimum(score_part, centred)
    sub = torch.where(kept & (pr < 4 * tiny), c, 0.0).to(torch.float64)
    rounding = u_p * pv + p_floor * (sub @ pb.av) + (sum_error(n, p.compute) + 2 * nb * p.compute) * (pv + ao) \
        + p.compute * ao + 2 * (p.compute + unit_roundoff(p.dtype)) * (pv + ao) + DOT_READ_FLOOR
    cap = 2 * (c * _visible_max(*pb.av_max, rows, pb.n_q, pb.causal, pb.window) + ao)
    return torch.minimum(score_part + SAFETY * rounding, cap) + p.store * ao + attention_floor(p)


def attention(q, k, v, o, lse, causal: bool, scale: float, p: Precision, window=(-1, -1), alibi_slopes=None,
              softcap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Allowed absolute errors of (o, lse) of attention, from the fp64 inputs and reference.

    GQA: each query head attends to its KV head's k, v (repeated here per group): the
    per-head rule. A row that sees no key is exactly o = 0, lse = -inf.

    Scores: s_ij errs by at most eps_ij (:func:`attention_score_error`), multiplying key
    j's weight by e^{eta_j}, |eta_j| <= eps_ij. Against the row's top key j* (softmax sees
    only differences), zeta_j = eta_j - eta_j* is bounded by E_j = eps_ij + eps_ij*
    (E_j* = 0), and exactly
        o' - o = sum_j p_j (e^{zeta_j} - 1)(v_j - o) / Z,   Z = sum_j p_j e^{zeta_j}
    so |o' - o| <= (sum_j p_j expm1(E_j) |v_j - o|) / max(p_j*, sum_j p_j e^{-E_j}), with
    |v_j - o| <= |v_j - c| + |o - c| for c = 0 and for c each value column's midrange, the
    smaller bound. A key whose k row equals the top key's bit for bit shares every rounding
    but the dot's summation order, which a GEMM may vary by column: E_j = twice the dot's
    bound, 2 (dot + sum_error(D)) scale sum_d |q_d k_d| (a constant k's weights are exact
    but for that; past about 1e5 of score that is no longer small). Not first-order: it stays
    a bound for large E and vanishes for a row dominated by one key. For lse,
    |lse' - lse| <= log sum_j p_j e^{eps_ij} = logsumexp(s + eps) - lse.

    Roundings that do not cancel between acc = sum_j p_j v_j and l = sum_j p_j: P rounded
    before P V (u_p sum_j p_j |v_j|, plus p_floor sum |v_j| over keys whose p_j is
    subnormal); the two sums of n terms (sum_error(n)); the rescaling by alpha once per
    key block (one fp32 product each for acc and l, nb = ceil(n / 16) blocks, the
    interpreter's smallest block); the division. lse adds l's sum (sum_error(n)), each
    alpha's exp2 (EXP_ULPS + 2 u per block, plus u times the running max's total rise
    <= m - min s), m + log2(l) and the LN2 / LOG2E conversions (u (2 |m| + |lse| + log l)).
    Stored o: p.store |o| + p.floor. A convex combination of the v_j is within
    max_j |v_j - o| of o: the score part is capped at twice max_j |v_j - c| + |o - c|,
    the whole o allowance at twice max_j |v_j| + |o|.
    """
    pb = _Problem.of(q, k, v, o, lse, causal, scale, p, window, alibi_slopes, softcap)
    a_o, a_lse = torch.empty_like(pb.o), torch.empty_like(pb.lse)
    for rows in pb.blocks():
        block = _forward_block(pb, rows)
        a_o[..., rows, :], a_lse[..., rows] = block.o_allowed, block.lse_allowed
    return to_numpy(a_o), to_numpy(a_lse)


PARTIAL_SUM_BLOCK = 32  # rows per partial gradient sum in PyTorch's CPU flash attention


def attention_grad(q, k, v, do, o, lse, dq, dk, dv, causal: bool, scale: float, p: Precision,
                   window=(-1, -1), alibi_slopes=None, softcap: float = 0.0) -> dict:
    """Allowed absolute errors of dq, dk, dv of attention (upstream do on o).

    FlashAttention backward: P recomputed from the saved lse, dv = P^T dO, dP = dO V^T,
    delta_i = sum_d dO_id O_id (the stored O), dS = P (dP - delta), dq = scale dS K,
    dk = scale dS^T Q.
    - P: relative error dP_ij = expm1(eps_ij + the lse allowance + the rounding of s - lse
      and exp) (a plain softmax of rounded scores is within it: its normaliser errs by at
      most the lse allowance); rounded to the dtype before its products (u_p, p_floor).
    - dP_ij: (p.dot + sum_error(D)) sum_d |dO_id v_jd|, u(dtype) |dP_ij| for dO V^T
      stored in the input dtype.
    - delta_i: sum_d |dO_id| (o allowance) + sum_error(D) sum_d |dO_id O_id|; formed as
      sum_j P_ij dP_ij: sum_j P_ij (dP_ij + u) |dP_ij|.
    - dS_ij: P_ij (dP_ij |dP - delta| + err(dP) + err(delta) + u |dP - delta|), p_floor
      |dP_ij - delta_i| for a P_ij near underflow; rounded to the dtype (u_p, u(dtype) for
      plain PyTorch's scale product) and p_floor on dS or scale dS, the larger.
    - dq, dk, dv: the entry errors through the products, (p.dot + sum_error(n)) for sums
      of n terms, the scale product (u), p.store, p.floor; DOT_READ_FLOOR times the other
      operand's sum (|dS| for misread k or q, P for dO, |dO| + |v| in dP).
    - PyTorch's CPU flash attention backward sums dk, dv over blocks of 32 queries (dq over
      32 keys), each partial sum rounded to the dtype: u(dtype) |g| + half the subnormal
      spacing per extra rounding; with GQA the per-head dk, dv are such sums.
    GQA: a KV head's dk, dv sum its group's per-head bounds, the group's sums counted as
    one sum of group * Nq terms. SAFETY on the first-order roundings (P and scores carry it).
    """
    pb = _Problem.of(q, k, v, o, lse, causal, scale, p, window, alibi_slopes, softcap)
    return _gradient_allowances(pb, k.shape[-3], do, dq, dk, dv)


def _gradient_allowances(pb: _Problem, kv_heads: int, do, dq, dk, dv, keep: torch.Tensor | None = None,
                         c: float = 1.0) -> dict:
    """:func:`attention_grad`'s rule (derivations there); with the keep mask [B, H, Nq, Nk]
    and the dropout factor c = 1 / (1 - p), :func:`attention_dropout_grad`'s."""
    p, scale, softcap = pb.p, pb.scale, pb.softcap
    group = pb.q.shape[-3] // kv_heads
    dev = pb.q.device
    do, dq, dk, dv = (float64_on(t, dev) for t in (do, dq, dk, dv))
    u_p, p_floor = _attention_parts(p)
    u_in = unit_roundoff(p.dtype)
    tiny = float(torch.finfo(p.dtype).tiny)
    d = pb.q.shape[-1]
    abs_k, av = pb.k.abs(), pb.av
    # dS rounds into the subnormals before (kernel) or after (plain PyTorch) the scale
    ds_floor = p_floor * max(1.0, 1.0 / scale)
    dq_allowed = torch.empty_like(pb.q)
    # per-key sums over every query row, added up block by block (dk, dv)
    dk_err, dk_sum, dv_err, dv_sum = (torch.zeros_like(pb.k) for _ in range(4))
    ds_col, pr_col = (torch.zeros(pb.k.shape[:-1], dtype=torch.float64, device=dev) for _ in range(2))
    seen_by = torch.zeros(pb.k.shape[-2], dtype=torch.float64, device=dev)  # query rows that see each key
    for rows in pb.blocks():
        blk = _forward_block(pb, rows) if keep is None else _forward_block(pb, rows, keep[..., rows, :], c)
        visible, pr, s = blk.visible, blk.pr, blk.s
        qr, do_r, o_r = pb.q[..., rows, :], do[..., rows, :], pb.o[..., rows, :]
        lse_r = pb.lse[..., rows]
        expo = torch.where(visible, blk.eps + blk.lse_allowed[..., None]
                           + SAFETY * p.compute * ((s - lse_r[..., None]).abs() + EXP_ULPS), 0.0)
        # P_ij (e^{expo} - 1), in the log domain (P_ij may underflow where the product does not)
        p_rel = torch.where(visible, torch.exp((blk.logp + expo).clamp(max=300.0)), 0.0) - pr
        n_row = visible.sum(-1, keepdim=True)  # keys each query sees
        seen_by += visible[0, 0].sum(-2)
        ad, ao = do_r.abs(), o_r.abs()
        dp = do_r @ pb.v.transpose(-1, -2)
        e_dp = (p.dot + sum_error(d, p.compute)) * (ad @ av.transpose(-1, -2)) + u_in * dp.abs() \
            + DOT_READ_FLOOR * (ad.sum(-1)[..., :, None] + av.sum(-1)[..., None, :])
        # dropout: P's weight in o, c M_ij (1 without); dP' = c M dP, its error c M times
        # dP's plus the factor's roundings (attention_dropout_grad)
        weight = 1.0 if keep is None else c * (keep[..., rows, :] & visible).to(torch.float64)
        if keep is not None:
            dp = weight * dp
            e_dp = weight * e_dp + 2 * (p.compute + u_in) * dp.abs()
        delta = (do_r * o_r).sum(-1, keepdim=True)
        r = (dp - delta).abs()
        ds = pr * (dp - delta)
        e_delta = sum_error(d, p.compute) * (ad * ao).sum(-1, keepdim=True) \
            + ((p_rel + u_in * pr) * dp.abs()).sum(-1, keepdim=True)
        # a P near underflow is only known to p_floor (GPU exp2 flushes), times |dP - delta| in dS
        small = visible & (pr < 4 * tiny)
        p_underflow = p_floor * r * small
        e_ds = p_rel * r + pr * (ad * blk.o_allowed).sum(-1, keepdim=True) + SAFETY * (
            pr * (e_dp + e_delta + p.compute * r) + (u_p + u_in) * ds.abs() + ds_floor * visible + p_underflow)
        if softcap:
            # dS of the raw score is dS_c (1 - t^2), t = tanh(r / c), bounded by dS_c; t errs
            # by (2 EXP_ULPS + 7) u plus the raw score's error / c, |t'^2 - t^2| <= 2 dt + dt^2,
            # and 1 - t t rounds (2 u, in the dtype for plain PyTorch)
            raw = (qr @ pb.k.transpose(-1, -2)).abs() * scale
            e_raw = (p.dot + sum_error(d, p.compute)) * scale * (qr.abs() @ abs_k.transpose(-1, -2)) \
                + DOT_READ_FLOOR * scale * (qr.abs().sum(-1)[..., :, None] + abs_k.sum(-1)[..., None, :]) \
                + 3 * (u_in + p.compute) * raw
            dt = ((2 * EXP_ULPS + 7) * p.compute + SAFETY * e_raw / softcap).clamp(max=2.0)
            dg = (2 * dt + dt * dt + 2 * (p.compute + u_in)).clamp(max=1.0)
            e_ds = e_ds + SAFETY * dg * ds.abs() * visible
        e_ds = e_ds.clamp(max=1e300)
        ads = ds.abs()
        reads_row = DOT_READ_FLOOR * ads.sum(-1, keepdim=True)  # k misread, per dq_i
        dq_allowed[..., rows, :] = scale * (e_ds @ abs_k + SAFETY * reads_row
                                            + SAFETY * (p.dot + sum_error(n_row, p.compute)) * (ads @ abs_k)) \
            + (SAFETY * p.compute + p.store) * dq[..., rows, :].abs() + attention_floor(p)
        dk_err += e_ds.transpose(-1, -2) @ qr.abs()
        dk_sum += ads.transpose(-1, -2) @ qr.abs()
        ds_col += ads.sum(-2)
        e_p = p_rel + SAFETY * (u_p * pr + p_floor * small)
        if keep is not None:  # the weights c M P: c M times P's error, and the factor's roundings
            e_p = weight * (e_p + SAFETY * 2 * (p.compute + u_in) * pr)
        dv_err += e_p.transpose(-1, -2) @ ad
        dv_sum += (weight * pr).transpose(-1, -2) @ ad
        pr_col += (weight * pr).sum(-2)
    n_col = (group * seen_by)[:, None]  # query rows (of the group) that see each key
    reads_col = DOT_READ_FLOOR * ds_col[..., None]  # q misread, per dk_j
    dk_allowed = _group_sum(scale * (dk_err + SAFETY * reads_col + SAFETY * (p.dot + sum_error(n_col, p.compute))
                                     * dk_sum), kv_heads) + (SAFETY * p.compute + p.store) * dk.abs() \
        + attention_floor(p)
    dv_allowed = _group_sum(dv_err + SAFETY * (p.dot + sum_error(n_col, p.compute)) * dv_sum
                            + SAFETY * DOT_READ_FLOOR * pr_col[..., None], kv_heads) \
        + p.store * dv.abs() + attention_floor(p)

    def partial_sums(g, n, heads=1):
        # one rounding per partial sum but the first: cdiv(n, 32) per head, ``heads`` heads
        return max(0, heads * -(-n // PARTIAL_SUM_BLOCK) - 1) * (u_in * g.abs() + p.floor / 2)

    n_q, n_k = pb.n_q, pb.k.shape[-2]
    return {"dq": to_numpy(dq_allowed + partial_sums(dq, n_k)), "dk": to_numpy(dk_allowed + partial_sums(dk, n_q, group)),
            "dv": to_numpy(dv_allowed + partial_sums(dv, n_q, group))}


def attention_dropout(q, k, v, o, lse, keep, dropout_p: float, causal: bool, scale: float, p: Precision,
                      window=(-1, -1), alibi_slopes=None, softcap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Allowed absolute errors of (o, lse) of attention with dropout, given the implementation's
    keep mask m (``o`` is the fp64 reference with that mask). lse is dropout-free: its
    allowance is :func:`attention`'s.

    o_i = c sum_j p_ij m_ij v_j, c = 1 / (1 - dropout_p). The computed weights are
    p_j e^{zeta_j} / Z, Z = sum_j p_j e^{zeta_j} over every visible key (the normaliser is
    dropout-free), |zeta_j| <= E_j as in :func:`attention`. With sum_j m_j p_j v_j = o / c,
        o' - o = (c sum_j m_j p_j (e^{zeta_j} - 1) v_j - o sum_j p_j (e^{zeta_j} - 1)) / Z,
        |o' - o| <= (c sum_j m_j w_j |v_j| + |o| sum_j w_j) / z,   w_j = p_j (e^{E_j} - 1),
    z <= Z as in attention. Centred at each value column's midrange c0 (v_j = c0 + d_j) the
    numerator is c sum_j m_j w'_j d_j + c0 sum_j w'_j (c m_j - 1) - (o - c0) sum_j w'_j
    (w'_j = p_j (e^{zeta_j} - 1)): the kept weights do not sum to 1, so c0 enters through
    the kept mass's change, |c0| sum_j w_j |c m_j - 1|. The smaller bound holds. Cap:
    o' = c sum_j m_j p'_j v_j, p' a probability vector: twice c max_visible |v_j| + |o|.
    Roundings: attention's with pv = c sum_j m_j p_j |v_j| for sum_j p_j |v_j|, and the
    factor c: rounded to fp32 and multiplied once (u(fp32) each), or in plain PyTorch
    (P m / (1 - p) in the dtype) u(dtype) per weight and for c: 2 (u(fp32) + u(dtype)) (pv + |o|).
    """
    pb = _Problem.of(q, k, v, o, lse, causal, scale, p, window, alibi_slopes, softcap)
    keep = torch.as_tensor(keep, device=pb.q.device)
    a_o, a_lse = torch.empty_like(pb.o), torch.empty_like(pb.lse)
    for rows in pb.blocks():
        block = _forward_block(pb, rows, keep[..., rows, :].to(torch.bool), 1.0 / (1.0 - dropout_p))
        a_o[..., rows, :], a_lse[..., rows] = block.o_allowed, block.lse_allowed
    return to_numpy(a_o), to_numpy(a_lse)


def attention_dropout_grad(q, k, v, do, o, lse, dq, dk, dv, keep, dropout_p: float, causal: bool, scale: float,
                           p: Precision, window=(-1, -1), alibi_slopes=None, softcap: float = 0.0) -> dict:
    """Allowed absolute errors of dq, dk, dv of attention with dropout, given the
    implementation's keep mask M (``o`` is the fp64 reference with that mask, ``lse`` the
    dropout-free one, ``dq``, ``dk``, ``dv`` fp64 autograd of that reference).

    With c = 1 / (1 - dropout_p), o_i = sum_j P~_ij v_j, P~ = c M * P (an exact 0 or c per
    weight, after the softmax), so the backward is :func:`attention_grad`'s with two
    substitutions:
        dV     = P~^T dO                     (P replaced by P~ = c M P)
        dP'_ij = c M_ij dO_i . v_j            (dP = dO V^T replaced by c M dP)
        delta_i = sum_j P_ij dP'_ij = sum_j P~_ij dO_i . v_j = dO_i . o_i
        dS     = P (dP' - delta)             (the softmax's own P, dropout-free),
        dq = scale dS K, dk = scale dS^T Q.
    delta's error uses :func:`attention_dropout`'s o allowance (and, formed as
    sum_j P_ij dP'_ij, P's errors times |dP'|).

    P's relative error is the dropout-free one (the mask and normaliser do not depend on
    it); P~_ij errs by c M_ij times it (M exact), so every dv term of attention_grad is
    taken with the weight c M_ij, and dP' errs by c M_ij times dP's error. c is one more
    rounding: the kernel's fp32 c multiplied in once (into dP', into dv), u(fp32) each;
    plain PyTorch's P M / (1 - p) and dP M / (1 - p) in the dtype, u(dtype) each: so
    2 (u(fp32) + u(dtype)) on every |dP'_ij| and every weight P~_ij. dS's terms, dq and dk
    are attention_grad's with dP' for dP. Not c times attention_grad's allowance: delta
    moves with the mask, and a dropped key's dS_ij = -P_ij delta_i.
    """
    pb = _Problem.of(q, k, v, o, lse, causal, scale, p, window, alibi_slopes, softcap)
    keep = torch.as_tensor(keep, device=pb.q.device).to(torch.bool).expand(*pb.q.shape[:-1], pb.k.shape[-2])
    return _gradient_allowances(pb, k.shape[-3], do, dq, dk, dv, keep, 1.0 / (1.0 - dropout_p))
