"""Tolerance rules of the attention family: o and lse of attention, and its gradients.

The pieces (unit roundoff, sum bounds, floors, SAFETY and the other constants with
their sources) are in :mod:`properties.tolerance`."""
from __future__ import annotations

import numpy as np
import torch

from properties.tolerance import DOT_READ_FLOOR, EXP_ULPS, SAFETY, Precision, sum_error, unit_roundoff
from references.attention import _scores as _ref_scores
from references.attention import alibi_bias, repeat_kv, visible_pairs


def attention_scores(q: np.ndarray, k: np.ndarray, causal: bool, scale: float, window=(-1, -1),
                     alibi_slopes=None, softcap: float = 0.0):
    """fp64 scores (scaled, softcapped, ALiBi-biased: references.attention), -inf at masked
    (i, j) (causal and window, bottom-right aligned); and the mask of kept pairs. k has q's
    heads (GQA: see :func:`repeat_kv`)."""
    s = _ref_scores(q @ np.swapaxes(k, -1, -2), scale, softcap, alibi_slopes)
    visible = np.broadcast_to(visible_pairs(q.shape[-2], k.shape[-2], causal, tuple(window)), s.shape)
    return np.where(visible, s, -np.inf), visible


def _visible_max(x: np.ndarray, n_q: int, causal: bool, window) -> np.ndarray:
    """[..., Nq, D]: per query row, the largest x_j over the keys j it sees, or an upper
    bound of it ([..., 1, D], every key) where the band has a lower edge. Rows see a prefix
    of the keys (causal or right-bounded, left unbounded): a running max read at the row's
    last key. Without a band: the max over all keys. Rows that see no key read key 0 (their
    o is exactly 0, the bound is not needed)."""
    n_k = x.shape[-2]
    left, right = window
    if left >= 0 or (not causal and right < 0):
        return np.max(x, axis=-2, keepdims=True)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    last = np.clip(np.arange(n_q) + (n_k - n_q) + right, 0, n_k - 1)
    return np.maximum.accumulate(x, axis=-2)[..., last, :]


def _group_sum(x: np.ndarray, kv_heads: int) -> np.ndarray:
    """[B, H, N, D] per query head -> [B, Hkv, N, D]: the sum over each KV head's group."""
    b, h = x.shape[:2]
    return x.reshape(b, kv_heads, h // kv_heads, *x.shape[2:]).sum(axis=2)




def attention_score_error(q: np.ndarray, k: np.ndarray, s: np.ndarray, visible: np.ndarray,
                          scale: float, p: Precision, alibi_slopes=None, softcap: float = 0.0) -> np.ndarray:
    """Bound (SAFETY included) on the absolute error of each score s_ij, in natural units,
    as an exponent error of p_ij: eps_ij.

    The dot q_i . k_j of D exact products accumulates in fp32 ((p.dot + sum_error(D)) times
    scale sum_d |q_id k_jd|); the scaling (and the scale's own rounding, and log2(e) folded
    into it) adds 2 u(fp32) |s_ij|. A plain PyTorch implementation forms q @ k^T and the
    product with sm_scale in the input dtype, 2 u(dtype) |s_ij| more: the rule allows it
    (as the softmax rule allows x / T rounded in the input dtype), so users' attention in
    fp16 and bf16 passes; for the kernel (fp32 scores) this is slack of about
    u(dtype) |s| in lse and, through score differences, in o. The exponent s_ij - m
    (m <= the row max: online running maxima only get closer to s_ij) rounds
    (u |s_ij - m|) and exp/exp2 adds EXP_ULPS u. Operands below the smallest normal:
    DOT_READ_FLOOR scale (sum_d |q_id| + |k_jd|).

    Softcap (s_c = c tanh(r / c) of the raw score r = scale q.k): the raw score's error
    e_r above (with r for s, plus u |r| for r / c in fp32 and u(dtype) |r| for it in the
    dtype) passes through the cap with the derivative 1 - tanh^2 <= 1 at some point
    between r and r + e_r: at most g = 1 - tanh(max(0, |r| - e_r) / c)^2, the cap's effect
    on the condition (a saturated score barely moves). Then tanh's own absolute error,
    (2 EXP_ULPS + 7) u (kernels.attention._tanh), times c; the product c t and the later
    log2(e) product (u |s_c| each, and u |s_c| for the conversion of the scale path); in
    the dtype, torch.tanh's rounding and the products: 3 u(dtype) |s_c|.
    ALiBi (s = s_c - slope |i + Nk - Nq - j|, slopes exact in fp32): slope * distance and
    the subtraction round, u (|bias| + |s|) in fp32 and again in the dtype for a plain
    implementation that adds the bias to scores in the input dtype; the bias is exact in
    fp64 in the reference, so the fp32 slopes' own rounding does not count.
    """
    d = q.shape[-1]
    a = scale * (np.abs(q) @ np.swapaxes(np.abs(k), -1, -2))
    reads = scale * DOT_READ_FLOOR * (np.sum(np.abs(q), axis=-1)[..., :, None]
                                            + np.sum(np.abs(k), axis=-1)[..., None, :])
    u_in = unit_roundoff(p.dtype)
    with np.errstate(invalid="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        if not softcap and alibi_slopes is None:
            eps = SAFETY * ((p.dot + sum_error(d, p.compute)) * a + reads + 2 * (u_in + p.compute) * np.abs(s)
                            + p.compute * (np.abs(s - m) + EXP_ULPS))
            return np.where(visible, eps, 0.0)
        raw = np.abs(q @ np.swapaxes(k, -1, -2)) * scale
        e_raw = (p.dot + sum_error(d, p.compute)) * a + reads + 2 * (u_in + p.compute) * raw
        bias = np.zeros_like(raw) if alibi_slopes is None else np.abs(
            alibi_bias(alibi_slopes, raw.shape, raw.shape[-2], raw.shape[-1]))
        after = 2 * p.compute * np.abs(s) + (p.compute + u_in) * (bias + np.abs(s))
        if softcap:
            e_raw = e_raw + (p.compute + u_in) * raw
            g = 1.0 - np.tanh(np.maximum(0.0, raw - SAFETY * e_raw) / softcap) ** 2
            capped = np.abs(np.where(visible, s, 0.0)) + bias  # |s_c| <= |s| + |bias|
            e_raw = g * e_raw
            after = after + p.compute * (softcap * (2 * EXP_ULPS + 7) + 2 * capped) + 3 * u_in * capped
        eps = SAFETY * (e_raw + after + p.compute * (np.abs(s - m) + EXP_ULPS))
    return np.where(visible, eps, 0.0)


def _attention_parts(p: Precision):
    """(u_p, p_floor): the relative rounding of P (and dS) before their products, and the
    absolute rounding of a P or dS entry in the subnormal range.

    FlashAttention kernels and plain PyTorch round P = softmax and dS to the input dtype
    for fp16 / bf16 (this kernel: fp16 for float16; tf32 on the GPU, i.e. <= 2 u(tf32)
    with truncation, fp32 in the interpreter, for bfloat16: both within u(bf16));
    float32 products carry p.dot. Below the smallest normal the spacing is
    tiny * eps of the dtype (fp16: 2^-24), or tiny(fp32) where a GPU flushes.
    """
    info = torch.finfo(p.dtype)
    u_p = unit_roundoff(p.dtype) if p.dtype in (torch.float16, torch.bfloat16) else p.dot
    p_floor = max(float(info.tiny) * float(info.eps), float(torch.finfo(torch.float32).tiny))
    return u_p, p_floor


def attention_floor(p: Precision) -> float:
    """p.floor, plus, under the Triton interpreter for bfloat16, one more smallest normal:
    the interpreter's fp32 -> bf16 store maps fp32 subnormals to wrong bf16 values
    (e.g. -1.42e-39 -> -1.10e-38, 3.0e-39 -> 1.8e-40, seen on Triton 3.9), an error up to
    about tiny(bf16) on top of the value; p.floor (= tiny) alone is exceeded by a hair."""
    if p.backend == "interpret" and p.dtype == torch.bfloat16:
        return 2 * p.floor
    return p.floor


def _same_key_as(k: np.ndarray, jstar: np.ndarray) -> np.ndarray:
    """[..., Nq, Nk]: whether key j's row of k equals, bit for bit, the row of key
    jstar[..., i] (ids of distinct rows per batch and head, so memory stays Nq x Nk)."""
    ids = np.empty(k.shape[:-1], dtype=np.int64)
    for index in np.ndindex(*k.shape[:-2]):
        _, ids[index] = np.unique(k[index], axis=0, return_inverse=True)
    return ids[..., None, :] == np.take_along_axis(ids[..., None, :], jstar, axis=-1)


def _log_weights(s: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """log p_ij = (s_ij - m_i) - log sum_j exp(s_ij - m_i), -inf where masked. Not s - lse:
    for scores of 1e16 and more lse = m + log(sum) rounds to m in fp64, and a row of equal
    scores got log-weights 0 (weights 1, not 1/n)."""
    m = np.max(np.where(visible, s, -np.inf), axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    d = np.where(visible, s - m, -np.inf)
    return d - np.log(np.sum(np.exp(d), axis=-1, keepdims=True))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
              causal: bool, scale: float, p: Precision, window=(-1, -1), alibi_slopes=None,
              softcap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Allowed absolute errors of (o, lse) of attention, from the fp64 inputs and reference.

    GQA: each query head is an attention of its own against its KV head's k, v (repeated
    here per group), so the rule is the per-head rule. A row that sees no key (a band
    missing every key) is exactly o = 0, lse = -inf: its o allowance is finite and unused.

    Scores: each s_ij errs by at most eps_ij (attention_score_error), i.e. the weight of
    key j is multiplied by e^{eta_j}, |eta_j| <= eps_ij. Measured against the row's top key
    j* (softmax only sees differences), zeta_j = eta_j - eta_j* is bounded by
    E_j = eps_ij + eps_ij* (E_j* = 0), and exactly
        o' - o = sum_j p_j (e^{zeta_j} - 1)(v_j - o) / Z,   Z = sum_j p_j e^{zeta_j}
    so |o' - o| <= (sum_j p_j expm1(E_j) |v_j - o|) / max(p_j*, sum_j p_j e^{-E_j}), with
    |v_j - o| <= |v_j - c| + |o - c| for c = 0 and for c the midrange of each value
    column, whichever bound is smaller. A key whose k row equals the top key's bit for
    bit is scored by the same dot product on the same operands, so E_j = 0 for it (a
    constant k makes every weight exact, whatever the scores' rounding).
    This is not first-order: it stays a bound when scores near the dtype's range make
    E large, and it vanishes for a row dominated by one key. For lse,
    |lse' - lse| <= log sum_j p_j e^{eps_ij} = logsumexp(s + eps) - lse.

    Roundings that do not cancel between the numerator acc = sum_j p_j v_j and the
    denominator l = sum_j p_j: P rounded before the P V product (u_p sum_j p_j |v_j|,
    plus p_floor sum |v_j| over keys whose p_j is subnormal in the dtype); the two sums
    of n terms (sum_error(n)); the online rescaling by alpha once per key block (one
    fp32 product each for acc and l, nb = ceil(n / 16) blocks at the interpreter's
    smallest block); the division. The lse adds: l's sum (sum_error(n)), each alpha's
    exp2 (EXP_ULPS + 2 u per block, plus u times the total rise of the running max
    <= m - min s), m + log2(l) and the LN2 / LOG2E conversions (u (2 |m| + |lse| + log l)).
    Stored o: p.store |o|, plus p.floor. A convex combination of the v_j can never be
    further than max_j |v_j - o| from o: the score part is capped at twice
    max_j |v_j - c| + |o - c|, and the whole o allowance at twice max_j |v_j| + |o|.

    Why the old rule was wrong: it bounded |v_j - o| by |v_j| + |o|, so values with a
    large common offset (o close to every v_j) got an allowance of the offset's size, and
    o became vacuous (allowance >= |o|) wherever the scores were uncertain: 246125 of
    308151 bfloat16 o elements in an H100 run, the v "offset" family first among them.
    """
    k, v = repeat_kv(k, q.shape[-3]), repeat_kv(v, q.shape[-3])
    s, visible = attention_scores(q, k, causal, scale, window, alibi_slopes, softcap)
    eps = attention_score_error(q, k, s, visible, scale, p, alibi_slopes, softcap)
    u_p, p_floor = _attention_parts(p)
    tiny = float(torch.finfo(p.dtype).tiny)
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        logp = _log_weights(s, visible)
        pr = np.where(visible, np.exp(logp), 0.0)
        # keys each row sees; a row that sees none counts 1 (its pr is 0, o exactly 0)
        n = np.maximum(visible.sum(axis=-1, keepdims=True), 1)
        nb = np.ceil(n / 16)
        jstar = np.argmax(s, axis=-1)[..., None]
        eps_star = np.take_along_axis(eps, jstar, axis=-1)
        top = np.arange(s.shape[-1]) == jstar
        # A key whose row of k is the top key's, bit for bit, gets the same computed score
        # (the same dot product of the same operands): its zeta_j is exactly 0. Not with
        # ALiBi: the bias differs per key position, and so does its rounding (a bias of 0.5
        # vanishes next to a capped score of 1e36 in fp32, for one key and not the other)
        twin = _same_key_as(k, jstar) if alibi_slopes is None else np.zeros(s.shape, dtype=bool)
        big_e = np.where(visible & ~top & ~twin, eps + eps_star, 0.0)
        # p_j (e^{E_j} - 1), formed in the log domain: p_j may underflow where e^{E_j}
        # does not; exponents are clipped at 300 (the allowance is then capped anyway)
        w = np.where(visible, np.exp(np.minimum(logp + big_e, 300.0)), 0.0) - pr
        # z bounds the perturbed normaliser from below; it includes p_max >= 1/n. With scores
        # near 1e76 (bf16 q, k near max), s - lse loses every digit in fp64 and p_max can
        # come out 0 (then z = 0 and the allowance inf); 1/n keeps the bound finite and true.
        z = np.maximum(np.maximum(np.take_along_axis(pr, jstar, axis=-1), 1.0 / n),
                       np.sum(pr * np.exp(-big_e), axis=-1, keepdims=True))
        av, ao = np.abs(v), np.abs(o)
        pv = pr @ av
        # |v_j - o| <= |v_j - c| + |o - c| for any centre c of each value column; the
        # midrange of the column keeps both small when the values share a large offset
        # (o is then close to every v_j, and perturbed weights move it little)
        c = (np.max(v, axis=-2, keepdims=True) + np.min(v, axis=-2, keepdims=True)) / 2
        c = np.where(np.isfinite(c), c, 0.0)
        dv_c, do_c = np.abs(v - c), np.abs(o - c)
        w_sum = np.sum(w, axis=-1, keepdims=True)
        # both centres give a bound (c = 0: values spread around 0, where a midrange c
        # drawn off 0 would loosen it): the smaller one holds
        score_part = np.minimum(w @ dv_c + w_sum * do_c, w @ av + w_sum * ao) / z
        # the weights' perturbation alone keeps o' a convex combination of the visible v_j
        vdev = _visible_max(dv_c, s.shape[-2], causal, window)
        score_part = np.minimum(score_part, 2 * (vdev + do_c))
        sub = np.where(visible & (pr < 4 * tiny), 1.0, 0.0)
        rounding = u_p * pv + p_floor * (sub @ av) + (sum_error(n, p.compute) + 2 * nb * p.compute) * (pv + ao) \
            + p.compute * ao + DOT_READ_FLOOR
        vmax = _visible_max(av, s.shape[-2], causal, window)
        o_allowed = np.minimum(score_part + SAFETY * rounding, 2 * (vmax + ao)) + p.store * ao + attention_floor(p)

        t = np.where(visible, s + eps, -np.inf)
        mt = np.max(t, axis=-1, keepdims=True)
        lse_score = (mt + np.log(np.sum(np.exp(t - mt), axis=-1, keepdims=True)))[..., 0] - lse
        m = np.max(s, axis=-1)
        s_min = np.min(np.where(visible, s, np.inf), axis=-1)
        n, nb = n[..., 0], nb[..., 0]
        lse_allowed = np.maximum(lse_score, 0.0) + SAFETY * (
            sum_error(n, p.compute) + nb * p.compute * (EXP_ULPS + 2) + p.compute * (m - s_min)
            + p.compute * (2 * np.abs(m) + np.abs(lse) + np.abs(lse - m) + EXP_ULPS)) \
            + float(torch.finfo(torch.float32).tiny)
        # a row that sees no key is exact (o = 0, lse = -inf): allowance 0, never NaN (the
        # terms above form -inf - -inf there), so sums of allowances over calls stay finite
        sees = visible.any(axis=-1)
        o_allowed = np.where(sees[..., None], o_allowed, 0.0)
        lse_allowed = np.where(sees, lse_allowed, 0.0)
    return o_allowed, lse_allowed


PARTIAL_SUM_BLOCK = 32  # rows per partial gradient sum in PyTorch's CPU flash attention


def attention_grad(q, k, v, do, o, lse, dq, dk, dv, causal: bool, scale: float, p: Precision,
                   window=(-1, -1), alibi_slopes=None, softcap: float = 0.0) -> dict:
    """Allowed absolute errors of dq, dk, dv of attention (upstream do on o).

    GQA: dk and dv of a KV head are sums over its group of query heads; the rule bounds
    each query head's contribution (k, v repeated per group), sums the bounds over the
    group, and counts the group's sums as one sum of group * Nq terms (the kernel
    accumulates them in one fp32 accumulator and rounds once; a plain implementation
    sums per-head gradients of repeated k, v, which the same bound covers).

    FlashAttention backward: P recomputed from the saved lse, dv = P^T dO, dP = dO V^T,
    delta_i = sum_d dO_id O_id (from the stored, rounded O), dS = P (dP - delta),
    dq = scale dS K, dk = scale dS^T Q.
    - P: exponent error eps_ij (scores) + the lse allowance + the rounding of s - lse and
      exp: a relative error dP_ij = expm1(that) (a plain softmax of rounded scores is
      within the same: its normaliser errs by at most the lse allowance); then rounded
      to the dtype before its products (u_p, p_floor).
    - dP_ij: (p.dot + sum_error(D)) sum_d |dO_id v_jd|, and u(dtype) |dP_ij| where users
      store dO V^T in the input dtype.
    - delta_i: sum_d |dO_id| (the o allowance) + sum_error(D) sum_d |dO_id O_id|, and for a
      softmax backward computing it as sum_j P_ij dP_ij: sum_j P_ij (dP_ij + u) |dP_ij|.
    - dS_ij: P_ij (dP_ij |dP - delta| + err(dP) + err(delta) + u |dP - delta|) and, for a P_ij
      near underflow, p_floor |dP_ij - delta_i|; rounded to
      the dtype (u_p, and u(dtype) for the scale product of plain PyTorch) and p_floor
      (on dS or on scale dS, whichever is larger).
    - dq, dk, dv: the entry errors through the products, plus (p.dot + sum_error(n)) for
      the sums of n terms, the scale product (u), the store (p.store) and p.floor;
      operands below the smallest normal (DOT_READ_FLOOR times the other
      operand's sum: |dS| for a misread k or q, P for a misread dO, |dO| + |v| in dP).
    - a plain implementation may sum dk, dv over blocks of 32 queries (dq over blocks of
      32 keys) rounding each partial sum to the dtype: PyTorch's CPU flash attention
      backward in fp16 gave dk 2 subnormal spacings off an exact -4.0e-8 over 65 queries.
      Each extra rounding adds u(dtype) |g| + half the dtype's subnormal spacing; with
      GQA the group's per-head dk, dv are such partial sums too.
    SAFETY multiplies the first-order roundings; the P and score parts carry it already.
    """
    kv_heads = k.shape[-3]
    group = q.shape[-3] // kv_heads
    o_allowed, lse_allowed = attention(q, k, v, o, lse, causal, scale, p, window, alibi_slopes, softcap)
    k, v = repeat_kv(k, q.shape[-3]), repeat_kv(v, q.shape[-3])
    s, visible = attention_scores(q, k, causal, scale, window, alibi_slopes, softcap)
    eps = attention_score_error(q, k, s, visible, scale, p, alibi_slopes, softcap)
    u_p, p_floor = _attention_parts(p)
    u_in = unit_roundoff(p.dtype)
    tiny = float(torch.finfo(p.dtype).tiny)
    d = q.shape[-1]
    kt = lambda x: np.swapaxes(x, -1, -2)  # noqa: E731
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        logp = _log_weights(s, visible)
        pr = np.where(visible, np.exp(logp), 0.0)
        expo = np.where(visible, eps + lse_allowed[..., None] + SAFETY * p.compute * (np.abs(s - lse[..., None])
                                                                                       + EXP_ULPS), 0.0)
        # P_ij (e^{expo} - 1), in the log domain (P_ij may underflow where the product does not)
        p_rel = np.where(visible, np.exp(np.minimum(logp + expo, 300.0)), 0.0) - pr
        n_row = visible.sum(axis=-1, keepdims=True)  # keys each query sees
        n_col = group * kt(visible.sum(axis=-2, keepdims=True))  # query rows (of the group) that see each key
        ad, av, ao = np.abs(do), np.abs(v), np.abs(o)
        dp = do @ kt(v)
        delta = np.sum(do * o, axis=-1, keepdims=True)
        r = np.abs(dp - delta)
        # dS rounds into the dtype's subnormals before (kernel) or after (plain PyTorch: the
        # product with sm_scale in the dtype) the scale: p_floor at whichever is larger
        ds_floor = p_floor * max(1.0, 1.0 / scale)
        ds = pr * (dp - delta)
        e_dp = (p.dot + sum_error(d, p.compute)) * (ad @ kt(av)) + u_in * np.abs(dp) \
            + DOT_READ_FLOOR * (np.sum(ad, axis=-1)[..., :, None] + np.sum(av, axis=-1)[..., None, :])
        e_delta = sum_error(d, p.compute) * np.sum(ad * ao, axis=-1, keepdims=True) \
            + np.sum((p_rel + u_in * pr) * np.abs(dp), axis=-1, keepdims=True)
        # a P near underflow is only known to p_floor (a GPU's exp2 flushes it to 0), and
        # dS = P (dP - delta) carries that times |dP - delta| (H100: dk 0 for -6e-37 with
        # v near fp32's max, where |dP - delta| ~ 1e36)
        p_underflow = p_floor * r * (visible & (pr < 4 * tiny))
        e_ds = p_rel * r + pr * np.sum(ad * o_allowed, axis=-1, keepdims=True) + SAFETY * (
            pr * (e_dp + e_delta + p.compute * r) + (u_p + u_in) * np.abs(ds) + ds_floor * visible + p_underflow)
        if softcap:
            # dS of the raw score is dS_c (1 - t^2), t = tanh(r / c): the rule's dS is dS_c, a
            # bound on it (1 - t^2 <= 1); the factor's error: t errs by tanh's own (2 EXP_ULPS
            # + 7) u plus the raw score's error / c (tanh' <= 1), |t'^2 - t^2| <= 2 dt + dt^2,
            # and 1 - t t rounds (2 u, in the dtype for plain PyTorch's tanh backward)
            raw = np.abs(q @ kt(k)) * scale
            e_raw = (p.dot + sum_error(d, p.compute)) * scale * (np.abs(q) @ kt(np.abs(k))) \
                + DOT_READ_FLOOR * scale * (np.sum(np.abs(q), axis=-1)[..., :, None]
                                            + np.sum(np.abs(k), axis=-1)[..., None, :]) \
                + 3 * (u_in + p.compute) * raw
            dt = np.minimum(2.0, (2 * EXP_ULPS + 7) * p.compute + SAFETY * e_raw / softcap)
            dg = np.minimum(1.0, 2 * dt + dt * dt + 2 * (p.compute + u_in))
            e_ds = e_ds + SAFETY * dg * np.abs(ds) * visible
        e_ds = np.minimum(e_ds, 1e300)
        ads = np.abs(ds)
        reads_row = DOT_READ_FLOOR * np.sum(ads, axis=-1, keepdims=True)  # k misread, per dq_i
        reads_col = DOT_READ_FLOOR * kt(np.sum(ads, axis=-2, keepdims=True))  # q misread, per dk_j
        dq_allowed = scale * (e_ds @ np.abs(k) + SAFETY * reads_row + SAFETY * (p.dot + sum_error(n_row, p.compute)) * (ads @ np.abs(k))) \
            + (SAFETY * p.compute + p.store) * np.abs(dq) + attention_floor(p)
        dk_allowed = _group_sum(scale * (kt(e_ds) @ np.abs(q) + SAFETY * reads_col
                                         + SAFETY * (p.dot + sum_error(n_col, p.compute)) * (kt(ads) @ np.abs(q))),
                                kv_heads) + (SAFETY * p.compute + p.store) * np.abs(dk) + attention_floor(p)
        e_p = p_rel + SAFETY * (u_p * pr + p_floor * (visible & (pr < 4 * tiny)))
        dv_allowed = _group_sum(kt(e_p) @ ad + SAFETY * (p.dot + sum_error(n_col, p.compute)) * (kt(pr) @ ad)
                                + SAFETY * DOT_READ_FLOOR * kt(np.sum(pr, axis=-2, keepdims=True)), kv_heads) \
            + p.store * np.abs(dv) + attention_floor(p)

    def partial_sums(g, n, heads=1):
        # cdiv(n, 32) partial sums per head, over ``heads`` heads (GQA: a plain
        # implementation sums the repeated heads' gradients in the dtype): one rounding
        # fewer than partial sums
        return max(0, heads * -(-n // PARTIAL_SUM_BLOCK) - 1) * (u_in * np.abs(g) + p.floor / 2)

    n_q, n_k = q.shape[-2], k.shape[-2]
    return {"dq": dq_allowed + partial_sums(dq, n_k), "dk": dk_allowed + partial_sums(dk, n_q, group),
            "dv": dv_allowed + partial_sums(dv, n_q, group)}


def attention_dropout(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
                      keep: np.ndarray, dropout_p: float, causal: bool, scale: float, p: Precision,
                      window=(-1, -1), alibi_slopes=None, softcap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Allowed absolute errors of (o, lse) of attention with dropout, given the implementation's
    keep mask m (``o`` is the fp64 reference with that mask). lse is dropout-free: its
    allowance is :func:`attention`'s.

    o_i = c sum_j p_ij m_ij v_j with c = 1 / (1 - dropout_p). The computed weights are
    p_j e^{zeta_j} / Z, Z = sum_j p_j e^{zeta_j} over every visible key (the normaliser is
    dropout-free), |zeta_j| <= E_j as in :func:`attention` (E_j* = 0 for the top key and its
    bitwise twins). With sum_j m_j p_j v_j = o / c,
        o' - o = (c sum_j m_j p_j (e^{zeta_j} - 1) v_j - o sum_j p_j (e^{zeta_j} - 1)) / Z,
        |o' - o| <= (c sum_j m_j w_j |v_j| + |o| sum_j w_j) / z,   w_j = p_j (e^{E_j} - 1),
    z <= Z as in attention. No centring of v: the kept weights do not sum to 1, so a common
    offset of the values does not cancel. Cap: o' = c sum_j m_j p'_j v_j with p' a probability
    vector, |o' - o| <= c max_visible |v_j| + |o| (twice that, as attention's cap).
    Roundings: attention's, with the kept sum pv = c sum_j m_j p_j |v_j| for sum_j p_j |v_j|
    (P rounded before P V and its subnormals, the sums of n terms and the per-block rescaling,
    the division), and the factor c: rounded to fp32 and multiplied once (u(fp32) each, on |o|,
    folded into 1 / l by the kernel), or, in a plain implementation forming P m / (1 - p) in
    the dtype, u(dtype) per weight and u(dtype) for c (on pv): 2 (u(fp32) + u(dtype)) (pv + |o|).
    """
    _, lse_allowed = attention(q, k, v, o, lse, causal, scale, p, window, alibi_slopes, softcap)
    k, v = repeat_kv(k, q.shape[-3]), repeat_kv(v, q.shape[-3])
    s, visible = attention_scores(q, k, causal, scale, window, alibi_slopes, softcap)
    eps = attention_score_error(q, k, s, visible, scale, p, alibi_slopes, softcap)
    u_p, p_floor = _attention_parts(p)
    c = 1.0 / (1.0 - dropout_p)
    kept = np.broadcast_to(np.asarray(keep, dtype=bool), s.shape) & visible
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        logp = _log_weights(s, visible)
        pr = np.where(visible, np.exp(logp), 0.0)
        n = np.maximum(visible.sum(axis=-1, keepdims=True), 1)
        jstar = np.argmax(s, axis=-1)[..., None]
        top = np.arange(s.shape[-1]) == jstar
        twin = _same_key_as(k, jstar) if alibi_slopes is None else np.zeros(s.shape, dtype=bool)
        big_e = np.where(visible & ~top & ~twin, eps + np.take_along_axis(eps, jstar, axis=-1), 0.0)
        w = np.where(visible, np.exp(np.minimum(logp + big_e, 300.0)), 0.0) - pr
        z = np.maximum(np.maximum(np.take_along_axis(pr, jstar, axis=-1), 1.0 / n),
                       np.sum(pr * np.exp(-big_e), axis=-1, keepdims=True))
        av, ao = np.abs(v), np.abs(o)
        pv = c * ((pr * kept) @ av)
        score_part = (c * ((w * kept) @ av) + np.sum(w, axis=-1, keepdims=True) * ao) / z
        sub = np.where(kept & (pr < 4 * float(torch.finfo(p.dtype).tiny)), c, 0.0)
        rounding = u_p * pv + p_floor * (sub @ av) + (sum_error(n, p.compute) + 2 * np.ceil(n / 16) * p.compute) \
            * (pv + ao) + p.compute * ao + 2 * (p.compute + unit_roundoff(p.dtype)) * (pv + ao) + DOT_READ_FLOOR
        cap = 2 * (c * _visible_max(av, s.shape[-2], causal, window) + ao)
        o_allowed = np.minimum(score_part + SAFETY * rounding, cap) + p.store * ao + attention_floor(p)
    return np.where(visible.any(axis=-1)[..., None], o_allowed, 0.0), lse_allowed
