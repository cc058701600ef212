"""Tolerance rules of the gated delta rule: o, the final state and the six gradients.

Pieces and notation: :mod:`tritoncheck.tolerance`. Evaluated in float64 torch on the
suite's device; arguments NumPy arrays or tensors, results NumPy.

The model (derivation; the recurrence is ``references/gated_delta_rule.py``'s). Per head
the state evolves by h_t = A_t h_{t-1} + beta_t k_t v_t^T with A_t = exp(g_t) (I - beta_t
k_t k_t^T), and each value column e of h is an independent K-vector recurrence. In the
contract's domain (||k_t|| <= 1, beta_t in [0, 1], g_t <= 0) every A_t is symmetric with
||A_t||_2 <= exp(g_t) <= 1: an error put into the state at token s reaches token t
multiplied by A_t ... A_{s+1}, never enlarged, and damped along every key written since.

* Per-token errors. Whatever the kernel's order (the recurrence, or a chunked WY form:
  the pseudo-values u_i = beta_i (v_i - h'_i^T k_i) through T = (I + A)^{-1}, whose
  entries are at most 1 here), token t's write errs by at most KAPPA u_op m_t[e] along
  k_t, m_t[e] = beta_t (|v_t[e]| + sum_d |k_t[d]| |h'_t[d, e]|) the magnitude of the terms
  of u_t[e]. u_op = max(u(dtype), p.dot) + sum_error(max(K, C), fp32): an operand of a
  product rounded to the input dtype (a tensor-core kernel stores T, U, W and the
  chunk's state in it: fla does) or read by the dot unit, and an fp32 sum over K or a
  chunk. KAPPA^2 = 8 counts the roundings that land on u_t: the pseudo-value, the
  corrections W h (the state read), v beta and k beta gamma rounded, and T's rounding,
  whose terms T_ij beta_j v_j add up to sqrt(C / K) ~ 3 times m_t in norm (random keys;
  |T_ij| decays geometrically for correlated ones). The write k_t u_t^T itself may be
  rounded elementwise (a chunk's K^T U stored in the input dtype before it joins an fp32
  state: plain PyTorch in fp16 does): KAPPA_READ u_op |k_t[d]| |u_t[e]| on each element.
* Propagation. Rounding errors are independent and of either sign (Higham and Mary,
  SIAM J. Sci. Comput. 41(5), 2019): the error of column e after token t is a sum of the
  propagated per-token errors, which concentrates within SUM_LAMBDA times the square
  root of its variance bound M_t^e = A_t M_{t-1}^e A_t + (KAPPA u_op m_t[e])^2 k_t k_t^T
  ([K, K] per column, computed in fp64 on the reference's own transitions, so the
  damping of the delta rule is counted where it happens and nowhere else). o_t[e] =
  scale q_t^T h_t[:, e] then errs by SUM_LAMBDA scale sqrt(q_t^T M_t^e q_t), element by
  element; the final state by SUM_LAMBDA sqrt(M_T^e[d, d]). (A first-order bound that
  sums the norms instead grows with T and reaches |o| in bfloat16 after a few dozen
  tokens; simulating a bfloat16 chunked kernel that rounds T, U, W and the chunk state
  as fla does gave errors of at most 3.8 of these standard deviations at KAPPA = 1, T up
  to 1024, K 16 and 64, beta uniform, small or 1, g 0 or down to -1 a token.)
* The chunk's own tokens (chunked form). A chunked kernel computes the chunk's pseudo-values
  at once, U = T (beta Y) from the chunk's starting state, and then S0 + K^T U and o from U:
  an error of u_j reaches the final state and the chunk's later outputs undamped by the
  chunk's later transitions (only decayed by exp(G_t - G_j)), where the recurrence above
  damps it. The C tokens up to t (the final state: up to the last token) add their m_j^2 k_j
  k_j^T and writes to the final state's variance, and (q_t . k_j)^2 exp(2 (G_t - G_j)) m_j^2 to
  o's, undamped, besides the damped ones (those still bound the recurrent form and the
  earlier chunks, whose errors the next chunk's U does damp: it is linear in S0). With
  v_0 = fp32's largest value and g = 0 the project's kernel's final state was off by 1.3e30
  where the damped terms allowed 6.5e29 (T's rounding times beta v_0 on the u_i after it).
* The read of o: q_t^T h_t and, in a chunked kernel, sum_{j <= i} (q_i . k_j) R_ij u_j
  over the chunk, each product's operands rounded (KAPPA_READ u_op) and the roundings
  independent: SUM_LAMBDA KAPPA_READ u_op scale sqrt(sum_d (q_t[d] h_t[d, e])^2 +
  sum_j ((q_t . k_j) exp(G_t - G_j) u_j[e])^2), j over the C tokens up to t (the chunk's
  boundaries unknown: every chunk that holds t lies in that window).
* Underflow. A dot operand below fp32's smallest normal F may be read as another value
  within F (GPU flush to zero; ``tolerance.DOT_READ_FLOOR``), and one rounded to fp16
  lands in its subnormals below 6e-5, off by up to half their spacing fl (3e-8): a product
  errs by max(F, fl) times its other operand, a pseudo-value stored in fp16 by KAPPA fl. Charged on the write (k and h' in the read h'^T k, a chunk's k . k
  products times the pseudo-values they weight: F (sum_d |h'[d, e]| + ||k_t||_1 +
  sum_j |u_j[e]|), j over the C tokens before t, times max(beta_t, 1): fla multiplies k and v
  by beta and stores them in fp16 before the read, so a small beta does not shrink the
  misread; v beta itself by F) and on o (q and h, the scores and the
  pseudo-values: F (sum_d |h_t[d, e]| + ||q_t||_1 + sum_j |u_j[e]| + sum_j |(q_t . k_j)
  R|)). Negligible unless a case's magnitudes span fp32's range (a value near the max
  scales the rest of its tensor into the subnormals).
* Decays. exp(G_i - G_j) from fp32 cumulative sums of g over a chunk (fla, this suite's
  kernel) errs relatively by u32 (EXP_ULPS + (2 + sum_error(C)) Lambda_t), Lambda_t =
  sum |g| over the C tokens up to t (|G_i|, |G_j| <= Lambda_t), and the state's decays
  compound once a chunk: u32 EXP_ULPS per 16 tokens. Charged as an error of each state
  column along itself (delta_t^2 h'_e h'_e^T into M at every token, D_e D_e^T into the
  adjoint's: a chunked kernel weighs even the adjoint's own token by exp(G_last - G_t),
  1 only up to that error), and on the magnitude sum_d |q_d| |h_t[d, e]| of o and |h_T| of the final
  state. C is 64, fla's chunk and this kernel's largest.

Gradients: the adjoint D_t = dL/dh_t runs backwards through the same A_t (symmetric), so
its errors are bounded alike; the rule keeps one variance per column for them (F_t[e]^2,
propagated by the contraction exp(2 g_t), no damping credited), and the forward state's
per-column variance trace(M_t^e). Each gradient is a sum over e (and d) of products of a
state and an adjoint quantity: its error is the products of each with the other's error,
added in quadrature over the sum, plus the rounding of the products (KAPPA_READ u_op
times the magnitudes); dg's chunked form (a reverse cumulative sum over the chunk of
per-token terms) adds SUM_LAMBDA u_op sqrt(sum over the next C tokens of their
magnitudes squared). Not covered: errors that are systematic rather than rounding
(truncation instead of rounding to nearest, a biased exp), and kernels whose decays
accumulate over more than C tokens in fp32 (a global cumulative sum of g).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tritoncheck.references.gated_delta_rule import resolved_scale, sequences
from tritoncheck.tolerance import (
    DOT_READ_FLOOR,
    EXP_ULPS,
    SAFETY,
    SUM_LAMBDA,
    U32,
    Precision,
    float64_on,
    sum_error,
    unit_roundoff,
)

KAPPA = math.sqrt(8.0)  # roundings that land on a pseudo-value (module docstring)
KAPPA_READ = 2.0  # a product's two operands rounded
DEFAULT_CHUNK = 64  # the chunk a kernel is assumed to accumulate decays over, undeclared (fla's)
DECAY_COMPOUND = 16  # tokens per compounding of the state's decay: the smallest chunk


def operand_unit(p: Precision, k_dim: int, chunk: int) -> float:
    """u_op: a product's operand rounded to the input dtype or read by the dot unit, plus an
    fp32 sum over K or a chunk."""
    return max(unit_roundoff(p.dtype), p.dot) + float(sum_error(max(k_dim, chunk), p.compute))


def floor_units(dtype: torch.dtype) -> tuple[float, float]:
    """(an operand's absolute misread, a stored value's absolute rounding) near underflow:
    fp32's smallest normal (a GPU flushes) or half the dtype's subnormal spacing (an operand
    rounded to fp16, whose subnormals start at 6e-5), whichever is larger; and that half
    spacing alone."""
    info = torch.finfo(dtype)
    half_sub = float(info.tiny) * float(info.eps) / 2
    return max(DOT_READ_FLOOR, half_sub), half_sub


def _write_floor(floors: tuple[float, float], bt, kt, h, window):
    """The pseudo-value's misreads near underflow (module docstring, Underflow), [B, H, V]: k_t
    and h in the read h^T k, the chunk's k . k products times the pseudo-values they weight
    (``window``), each off by floors[0] times the other operand and then by beta; a kernel that
    folds beta in first (fla stores k beta and v beta in the input dtype) reads them off by
    floors[0] whatever beta, so beta counts as at least 1; v beta misread by floors[0]; u_t
    itself rounded into the dtype's subnormals."""
    reads = floors[0] * (h.abs().sum(-2) + kt.abs().sum(-1, keepdim=True) + window)
    return bt.clamp(min=1.0) * reads + floors[0] + KAPPA * floors[1]


def _decay_error(g: torch.Tensor, chunk: int) -> torch.Tensor:
    """Relative error of the decays reaching token t, [B, T, H] (module docstring)."""
    lam = torch.cumsum(g.abs(), dim=1)
    window = lam - torch.nn.functional.pad(lam, (0, 0, chunk, 0))[:, :-chunk]
    t = torch.arange(g.shape[1], dtype=torch.float64, device=g.device)[None, :, None]
    return U32 * (EXP_ULPS * (1 + torch.floor(t / DECAY_COMPOUND)) + (2 + float(sum_error(chunk))) * window)


def _groups(B: int, T: int, cu_seqlens) -> list[tuple[slice, slice, slice]]:
    """(batch rows, tokens, states) evaluated together: every row at once without offsets
    (all sequences as long), else one packed sequence at a time."""
    if cu_seqlens is None:
        return [(slice(0, B), slice(0, T), slice(0, B))]
    return [(slice(b, b + 1), slice(s, e), slice(n, n + 1)) for n, (b, s, e) in enumerate(sequences(B, T, cu_seqlens))]


def _forward_pass(q, k, v, g, beta, h0, u_op, chunk: int = DEFAULT_CHUNK, floors: tuple[float, float] = (0.0, 0.0)):
    """The recurrence in fp64 with the error variance per column ([B, T, H, *] inputs, h0
    [B, H, K, V]): yields per token (h'_t, h_t, u_t, m_t, M_t) where M_t is the variance
    after token t's write, m_t the write's error bound (rounding and read floors)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    h = h0.clone()
    M = q.new_zeros(B, H, V, K, K)
    decay = _decay_error(g, chunk)  # [B, T, H]
    recent: list[torch.Tensor] = []  # |u_j| of the C tokens before t
    for t in range(T):
        a = torch.exp(g[:, t])[:, :, None, None]
        hp = a * h
        # the decay's relative error moves each column of h' along itself
        M = a[..., None] ** 2 * M + (decay[:, t, :, None, None, None] ** 2) * torch.einsum(
            "bhkv,bhlv->bhvkl", hp, hp)
        kt, bt = k[:, t], beta[:, t][:, :, None]
        u = bt * (v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, hp))
        m = KAPPA * u_op * bt * (v[:, t].abs() + torch.einsum("bhk,bhkv->bhv", kt.abs(), hp.abs())) \
            + _write_floor(floors, bt, kt, hp, torch.stack(recent).sum(0) if recent else 0.0)
        recent.append(u.abs())
        del recent[:-chunk]
        h = hp + kt[..., :, None] * u[..., None, :]
        # M <- (I - b k k^T) M (I - b k k^T) + m^2 k k^T, per column (M already decayed)
        kk = kt[..., :, None] * kt[..., None, :]
        # the write k_t u_t^T itself rounded elementwise (a chunk's K^T U stored in the input
        # dtype before it joins an fp32 state), beside the pseudo-value's errors along k_t
        write = (KAPPA_READ * u_op * kt[..., None, :].abs() * u[..., :, None].abs()) ** 2  # [B, H, V, K]
        M = _propagate(M, kt, bt) + (m ** 2)[..., None, None] * kk[:, :, None] + torch.diag_embed(write)
        yield hp, h, u, m, M


def gated_delta_rule(q, k, v, g, beta, scale, initial_state, cu_seqlens, o, final, p: Precision,
                     chunk: int = DEFAULT_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Allowed absolute errors of (o, final_state) (module docstring)."""
    q, k, v, g, beta, o, final = (float64_on(a) for a in (q, k, v, g, beta, o, final))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = resolved_scale(scale, K)
    h0 = float64_on(initial_state) if initial_state is not None else None
    u_op = operand_unit(p, K, chunk)
    floors = floor_units(p.dtype)
    allowed_o, allowed_f = torch.zeros_like(o), torch.zeros_like(final)
    for rows, toks, states in _groups(B, T, cu_seqlens):
        args = [a[rows, toks] for a in (q, k, v, g, beta)]
        qs, ks, vs, gs, bs = args
        nb = qs.shape[0]
        start = h0[states] if h0 is not None else q.new_zeros(nb, H, K, V)
        decay = _decay_error(gs, chunk)
        cum = torch.cumsum(gs, dim=1)  # [1, T, H]
        h, M = start, q.new_zeros(nb, H, V, K, K)
        pseudo: list[torch.Tensor] = []  # u_j of the C tokens up to t
        errors: list[torch.Tensor] = []  # m_j of the same tokens
        for t, (_, h, u, m, M) in enumerate(_forward_pass(*args, start, u_op, chunk, floors)):
            qt = qs[:, t]
            var = torch.einsum("bhk,bhvkl,bhl->bhv", qt, M, qt).clamp(min=0)
            terms = torch.einsum("bhk,bhkv->bhv", qt ** 2, h ** 2)  # sum_d (q_d h_de)^2
            read = torch.einsum("bhk,bhkv->bhv", qt.abs(), h.abs())
            # the chunk's scores times pseudo-values, (q_t . k_j) exp(G_t - G_j) u_j over the C tokens up to t
            w0 = max(0, t + 1 - chunk)
            scores = torch.einsum("bhk,bjhk->bjh", qt, ks[:, w0:t + 1]) * torch.exp(cum[:, t, None] - cum[:, w0:t + 1])
            pseudo.append(u)
            errors.append(m)
            del pseudo[:-chunk], errors[:-chunk]
            stacked = torch.stack(pseudo)
            intra = torch.einsum("bjh,jbhv->bhv", scores ** 2, stacked ** 2)
            # the chunk's own pseudo-values' errors, undamped by its later tokens (chunked form)
            var = var + torch.einsum("bjh,jbhv->bhv", scores ** 2, torch.stack(errors) ** 2)
            # flushed operands: q and h in the read, the scores and the pseudo-values they weight
            floor = floors[0] * (h.abs().sum(-2) + qt.abs().sum(-1, keepdim=True) + stacked.abs().sum(0)
                                 + scores.abs().sum(1)[..., None])
            err = SUM_LAMBDA * (var.sqrt() + KAPPA_READ * u_op * (terms + intra).sqrt()) + decay[:, t, :, None] * read \
                + floor
            ot = o[rows, toks][:, t]
            allowed_o[rows, toks.start + t] = SAFETY * scale * err + p.store * ot.abs().nan_to_num(0.0) + p.floor
        last = decay[:, -1, :, None, None] if qs.shape[1] else 0.0
        diag = torch.diagonal(M, dim1=-2, dim2=-1).clamp(min=0).transpose(-1, -2)  # [1, H, K, V]
        if errors:  # the last chunk's pseudo-values and writes, undamped (chunked form), decayed to the end
            n = len(errors)
            to_end = torch.exp(cum[:, -1:] - cum[:, -n:]).transpose(0, 1)[..., None, None] ** 2  # [n, 1, H, 1, 1]
            kj = ks[:, -n:].transpose(0, 1)[..., None] ** 2  # [n, 1, H, K, 1]
            diag = diag + (to_end * kj * ((torch.stack(errors) ** 2)[:, :, :, None, :]
                                          + (KAPPA_READ * u_op * stacked[:, :, :, None, :]) ** 2)).sum(0)
        spread = SUM_LAMBDA * diag.sqrt()
        allowed_f[states] = SAFETY * (spread + last * h.abs()) + U32 * h.abs() + p.floor
    return allowed_o.cpu().numpy(), allowed_f.cpu().numpy()


BLOCK = 64  # tokens whose forward quantities the gradient rule holds at once (recomputed per block)


def _propagate(M: torch.Tensor, kt: torch.Tensor, bt: torch.Tensor) -> torch.Tensor:
    """(I - b k k^T) M (I - b k k^T) per column: M [B, H, V, K, K], k [B, H, K], b [B, H, 1]."""
    Mk = torch.einsum("bhvkl,bhl->bhvk", M, kt)
    kMk = torch.einsum("bhvk,bhk->bhv", Mk, kt)
    b2 = bt[..., None, None]
    return M - b2 * (kt[:, :, None, :, None] * Mk[..., None, :] + Mk[..., :, None] * kt[:, :, None, None, :]) \
        + b2 ** 2 * kMk[..., None, None] * (kt[..., :, None] * kt[..., None, :])[:, :, None]


def _quad(M: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x_e^T M^e x_e per column: M [B, H, V, K, K], x [B, H, K] (one vector) or [B, H, K, V]."""
    if x.dim() == 3:
        return torch.einsum("bhk,bhvkl,bhl->bhv", x, M, x).clamp(min=0)
    return torch.einsum("bhkv,bhvkl,bhlv->bhv", x, M, x).clamp(min=0)


def _diag(M: torch.Tensor) -> torch.Tensor:
    """M^e[d, d] as [B, H, K, V]."""
    return torch.diagonal(M, dim1=-2, dim2=-1).transpose(-1, -2).clamp(min=0)


def gated_delta_rule_grad(q, k, v, g, beta, scale, initial_state, cu_seqlens, do, dfinal, grads, p: Precision,
                          chunk: int = DEFAULT_CHUNK, stores: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """Allowed absolute errors of dq, dk, dv, dg, dbeta and d initial_state (module docstring).

    Per token, with M' = exp(2 g_t) M_{t-1} and M_t the forward variances (per column) of
    h'_t and h_t, N and N' the adjoint's of D_t = dL/dh_t and of D' = (I - beta k k^T) D
    (N' = (I - b k k^T) N (I - b k k^T) plus the write's rounding along k, N_{t-1} =
    exp(2 g_t) N' plus the rounding of scale q do^T, elementwise), du = D^T k, dr = -beta du:

    * dq_t[d] = scale sum_e h_t[d, e] do_e: scale^2 sum_e do_e^2 M_t^e[d, d].
    * dv_t[e] = beta du_e: beta^2 k^T N^e k.
    * dk_t[d] = sum_e D[d, e] u_e + h'[d, e] dr_e: each factor's variance times the other's square.
    * dbeta_t = sum_e du_e (v_e - h'_e^T k): likewise.
    * dg_t = <D', h'_t>: h'_e^T N'^e h'_e + D'_e^T M'^e D'_e, and the chunked form's
      reverse cumulative sum over the next C tokens of per-token terms (the pieces
      scale q . (h do), k . (D u), k . (h' dr) that a chunked kernel adds), each product
      in them erring by KAPPA_READ u_op of itself, independently.
    * d initial_state: the adjoint at the start, SUM_LAMBDA sqrt(N^e[d, d]).

    Plus each product's rounding (KAPPA_READ u_op, independent over the sum), then
    SUM_LAMBDA, SAFETY, the store of each gradient in its input's dtype (``stores``: name ->
    its unit, default p.store; g and beta may come in another dtype than q) and the floor.
    """
    q, k, v, g, beta, do = (float64_on(a) for a in (q, k, v, g, beta, do))
    dfinal = float64_on(dfinal) if dfinal is not None else None
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = resolved_scale(scale, K)
    h0 = float64_on(initial_state) if initial_state is not None else None
    u_op = operand_unit(p, K, chunk)
    floors = floor_units(p.dtype)
    fu = KAPPA_READ * floors[0]  # a product's operands misread near underflow, absolutely
    rd = (KAPPA_READ * u_op) ** 2
    var = {n: torch.zeros(q.shape[:3] + ((K,) if n in ("q", "k") else (V,) if n == "v" else ()),
                          dtype=torch.float64, device=q.device) for n in ("q", "k", "v", "g", "beta")}
    dh0 = q.new_zeros(len(sequences(B, T, cu_seqlens)), H, K, V)
    for rows, toks, states in _groups(B, T, cu_seqlens):
        qs, ks, vs, gs, bs, dos = (a[rows, toks] for a in (q, k, v, g, beta, do))
        nb, length = qs.shape[0], qs.shape[1]
        start = h0[states] if h0 is not None else q.new_zeros(nb, H, K, V)
        zero = q.new_zeros(nb, H, V, K, K)
        marks, prev = [], (start, zero)  # the state and its variance at every block's start
        for t, (_, h, _, _, M) in enumerate(_forward_pass(qs, ks, vs, gs, bs, start, u_op, chunk, floors)):
            if t % BLOCK == 0:
                marks.append(prev)
            prev = (h, M)
        adj_decay = _decay_error(gs, chunk)
        D = dfinal[states].clone() if dfinal is not None else q.new_zeros(nb, H, K, V)
        N = zero.clone()
        window: list[torch.Tensor] = []  # the next C tokens' dg pieces, squared magnitudes
        for blk in reversed(range(len(marks))):
            b0, b1 = blk * BLOCK, min(length, (blk + 1) * BLOCK)
            h_start, M_start = marks[blk]
            steps = list(_forward_pass(*(a[:, b0:b1] for a in (qs, ks, vs, gs, bs)), h_start, u_op, chunk, floors))
            for i in reversed(range(b1 - b0)):
                t = b0 + i
                hp, ht, u, m, Mt = steps[i]
                a = torch.exp(gs[:, t])[:, :, None]
                Mp = a[..., None, None] ** 2 * (M_start if i == 0 else steps[i - 1][4])
                qt, kt, vt, dot, bt = qs[:, t], ks[:, t], vs[:, t], dos[:, t], bs[:, t][:, :, None]
                D = D + scale * qt[..., :, None] * dot[..., None, :]
                # the rounding of scale q do^T, elementwise; the decays that weigh D_t's terms
                # (exp(G_m - G_t), exp(G_last - G_t) in a chunked kernel) along D_t itself
                N = N + torch.diag_embed(((u_op * scale) ** 2 * qt[..., None, :] ** 2 * dot[..., :, None] ** 2)) \
                    + (adj_decay[:, t, :, None, None, None] ** 2) * torch.einsum("bhkv,bhlv->bhvkl", D, D)
                du = torch.einsum("bhkv,bhk->bhv", D, kt)
                read_D = torch.einsum("bhkv,bhk->bhv", D ** 2, kt ** 2)  # sum_d (k_d D_de)^2
                du_var = _quad(N, kt) + rd * read_D
                dr = -bt * du
                Dp = D + kt[..., :, None] * dr[..., None, :]
                adj_floor = _write_floor(floors, bt, kt, D, 0.0)
                Np = _propagate(N, kt, bt) + ((KAPPA * u_op * bt) ** 2 * read_D + adj_floor ** 2)[..., None, None] \
                    * (kt[..., :, None] * kt[..., None, :])[:, :, None]
                r = torch.einsum("bhkv,bhk->bhv", hp, kt)
                r_var = _quad(Mp, kt)
                u_var = bt ** 2 * r_var + m ** 2
                pos = (rows, toks.start + t)
                var["q"][pos] = (scale ** 2 * (torch.einsum("bhkv,bhv->bhk", _diag(Mt), dot ** 2)
                                               + rd * torch.einsum("bhkv,bhv->bhk", ht ** 2, dot ** 2)))
                var["v"][pos] = bt ** 2 * du_var
                var["k"][pos] = (torch.einsum("bhv,bhkv->bhk", u ** 2, _diag(N))
                                 + torch.einsum("bhv,bhkv->bhk", dr ** 2, _diag(Mp))
                                 + torch.einsum("bhkv,bhv->bhk", D ** 2, u_var + rd * u ** 2)
                                 + torch.einsum("bhkv,bhv->bhk", hp ** 2, bt ** 2 * du_var + rd * dr ** 2))
                var["beta"][pos] = ((du_var * (vt - r) ** 2 + du ** 2 * (r_var + rd * (vt ** 2 + torch.einsum(
                    "bhkv,bhk->bhv", hp ** 2, kt ** 2)))).sum(-1))
                # every product's operands misread near underflow: fu times the other operands
                var["q"][pos] += (fu * scale * (ht.abs().sum(-1) + dot.abs().sum(-1, keepdim=True))) ** 2
                var["v"][pos] += (fu * bt * (D.abs().sum(-2) + kt.abs().sum(-1, keepdim=True))) ** 2
                var["k"][pos] += (fu * (D.abs() + hp.abs()).sum(-1) + fu * (u.abs() + dr.abs()).sum(-1, keepdim=True)) ** 2
                var["beta"][pos] += (fu * (du.abs() + (vt - r).abs()).sum(-1)) ** 2
                pieces = scale ** 2 * torch.einsum("bhk,bhkv,bhv->bh", qt ** 2, ht ** 2, dot ** 2) \
                    + torch.einsum("bhk,bhkv,bhv->bh", kt ** 2, D ** 2, u ** 2) \
                    + torch.einsum("bhk,bhkv,bhv->bh", kt ** 2, hp ** 2, dr ** 2)
                window.insert(0, pieces)
                del window[chunk:]
                var["g"][pos] = ((_quad(Np, hp) + _quad(Mp, Dp)).sum(-1) + rd * ((Dp * hp) ** 2).sum((-2, -1))
                                 + rd * torch.stack(window).sum(0) + (fu * (Dp.abs() + hp.abs()).sum((-2, -1))) ** 2)
                D = Dp * a[..., None]
                N = a[..., None, None] ** 2 * Np
        dh0[states] = _diag(N)
    out = {}
    for n in ("q", "k", "v", "g", "beta"):
        got = float64_on(grads[n]).abs().nan_to_num(0.0)
        store = (stores or {}).get(n, p.store)
        out[f"d{n}"] = SAFETY * SUM_LAMBDA * var[n].sqrt() + store * got + p.floor
    got0 = float64_on(grads["initial_state"]).abs() if grads.get("initial_state") is not None else 0.0
    out["dinitial_state"] = SAFETY * SUM_LAMBDA * dh0.sqrt() + U32 * got0 + p.floor
    return {n: a.cpu().numpy() for n, a in out.items()}
