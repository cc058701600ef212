"""Tolerance rules of the SSD scan: y, the final state and the gradients.

Pieces and notation: :mod:`tritoncheck.tolerance`. Evaluated in float64 torch on the
suite's device; arguments NumPy arrays or tensors, results NumPy.

The model (derivation; the recurrence is ``references/ssd_scan.py``'s). Per sequence and
head the state evolves by h_t = exp(a_t) h_{t-1} + d_t x_t B_t^T with a_t = d_t A <= 0:
a scalar contraction, so an error put into the state at token j reaches token t
multiplied by R_tj = exp(G_t - G_j) <= 1, and y_t = C_t h_t is a sum of terms
tau_tj = R_tj d_j x_j (C_t . B_j) over j <= t plus the initial state's exp(G_t) h_0 C_t.

* Writes. Whatever the order (the token loop, or a chunked kernel's C B^T * R * d
  scores times X and X^T diag(w) B chunk states), each term's products have their
  operands rounded a bounded number of times (to the input dtype, or read by the dot
  unit) and their sums accumulate in fp32: a term errs by KAPPA u_op of its magnitude
  |tau|_tj = R_tj d_j |x_j| (|C_t| . |B_j|), u_op = max(u(dtype), p.dot) +
  sum_error(max(N, C), fp32), independently over j (Higham and Mary: SUM_LAMBDA times the
  square root of the summed variances). The magnitude is the absolute-value dot, not
  C_t . B_j: a rounding of x_j (or of the step d_j) is shared by the N products of the
  term, so the term's error is proportional to its whole magnitude. The step d_j itself
  errs relatively by eps_d (below), on every term of token j alike: (KAPPA u_op)^2 +
  eps_d^2 per term.
* The read of the state: a chunked kernel reads the state at the chunk's start, possibly
  rounded to the input dtype (mamba_ssm stores it so), times C_t: KAPPA_READ u_op
  sqrt(sum_n (C_t[n] |h|_t[p, n])^2), |h|_t the state of magnitudes (the recurrence on
  |x| |B|^T and |h_0|), which bounds every part of the state a kernel can hold.
* The fp32 state rounds at every token (a token loop; a chunked kernel at each chunk):
  a per-element variance V_t = exp(2 a_t) V_{t-1} + (2 u32 |h|_t)^2, read through C_t.
* Decays. exp(G_t - G_j) from fp32 cumulative sums of a over a chunk err relatively by
  u32 (EXP_ULPS (1 + t / 16) + (2 + sum_error(C)) Lambda_t), Lambda_t = sum |a| over the C
  tokens up to t (the gated delta rule's analysis, properties/gated_delta_rule_tolerance.py),
  correlated over the terms: charged first-order on their magnitudes. The step's own
  error moves every decay it enters: a_s errs by eps_d,s |a_s|, so R_tj by
  sum_{j < s <= t} eps_d,s |a_s| = E_t - E_j (E the cumulative sum), and |tau|_tj (E_t -
  E_j) summed over the terms is the recurrence H^E_t = exp(a_t) (H^E_{t-1} + eps_d,t |a_t|
  |h|_{t-1}); it stays below eps_d / e of the state (x e^-x <= 1/e).
* The step: d = clamp(softplus?(dt + dt_bias)) in fp32: the sum rounds (u32 |v|) and the
  softplus errs by (EXP_ULPS + 4) u32 of itself (an accurate log1p: a kernel that takes
  log(1 + exp(v)) errs absolutely by u32, which is relatively unbounded for a small
  softplus, and is not covered), the sum's rounding reaching it multiplied by
  |v| sigmoid(v) / softplus(v): eps_d = u32 (EXP_ULPS + 4 + |v| sigmoid(v) / softplus(v));
  without softplus eps_d = 2 u32.
* D x_t, the gate and the store: y = (s + D x) silu(z): the skip product and the sum
  u_op |D x|; silu(z) in fp32 errs by (EXP_ULPS + 3 + |z| (1 - sigmoid(z))) u32 of itself
  (exp's error and its argument's, through 1 / (1 + exp(-z))), or rounded to the input
  dtype (u_op), and below fp32's smallest normal F (flushed, or exp(-z) overflowing past
  z = -88.7) by F absolutely; y stored once (p.store).
* Underflow: a dot operand below fp32's smallest normal may be read as 0 (GPU flush to
  zero) or rounded into fp16's subnormals, off by f0 = max(F, half their spacing)
  (``gated_delta_rule_tolerance.floor_units``): the products C . B misread by f0 (||C_t||_1
  + ||B_j||_1) times R d |x_j|, the chunk's scores and x by f0 (|x_j| + |score|) over the C
  tokens up to t, the state read by f0 (||C_t||_1 + sum_n |h|_t); each write's product of
  two of d, x_j[p], B_j[n] flushed before the third by f0 (|x_j[p]| + |B_j[n]| + d_j), and each
  factor misread alone by f0 times the other two (|B_j[n]| d_j + |x_j[p]| d_j + |x_j[p]| |B_j[n]|:
  mamba_ssm's tf32 dot reads a subnormal x on tf32's grid of 2^-136, times B R d), decayed
  into the state like H^E; over the chunk's own tokens a kernel may round the write after
  folding in its decay to the chunk's end (mamba_ssm rounds B R d to x's dtype), off by at
  most min(|B_j| d_j, f0) undecayed, times |x_j|, independently over j (SUM_LAMBDA times the
  root of the summed squares). An intermediate rounded to the input dtype near underflow is off
  by half its subnormal spacing (h_sub, fp16's 3e-8) whatever its relative error: y's
  Y_ROUNDINGS = 4 before the gate (C h_0 and L X, or the token's C h; D x; the sum), each
  chunk's state increment once (charged every DECAY_COMPOUND tokens); the gate silu(z)
  below F (a bf16 or fp32 subnormal z) read as 0 or rounded into subnormals by f0, so y by
  f0 |s + D x| (a kernel that flushes it returns 0 there: the allowance reaches |y|, as
  any flush of a subnormal factor must).

Gradients: see :func:`ssd_scan_grad`. Not covered: systematic errors (truncation instead
of rounding to nearest, a biased exp), and kernels that accumulate decays over more than
C tokens in fp32 (a global cumulative sum of d A).
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.properties.gated_delta_rule_tolerance import floor_units
from tritoncheck.references.ssd_scan import group_of_heads, sequences
from tritoncheck.tolerance import (
    DOT_READ_FLOOR,
    EXP_ULPS,
    SAFETY,
    SUM_LAMBDA,
    Precision,
    float64_on,
    sum_error,
    unit_roundoff,
)

KAPPA = 2.0  # operand roundings that land on one term: two products of dots (C . B, then score x or B x)
KAPPA_READ = 2.0  # a product's two operands rounded
DEFAULT_CHUNK = 64  # the chunk a kernel is assumed to accumulate decays over, undeclared (mamba_ssm's 256 is
# covered by the window term only up to 64 tokens: its cumulative sums run over 256; see docs/third-party)
DECAY_COMPOUND = 16  # tokens per compounding of the state's decay: the smallest chunk
Y_ROUNDINGS = 4  # y's intermediates a kernel may round to the input dtype before the gate: C h_0 and L X
# (or the token's C h), D x and the sum


def operand_unit(p: Precision, n_state: int, chunk: int) -> float:
    """u_op: a product's operand rounded to the input dtype or read by the dot unit, plus an
    fp32 sum over N or a chunk."""
    return max(unit_roundoff(p.dtype), p.dot) + float(sum_error(max(n_state, chunk), p.compute))


def step_error(dt, dt_bias, dt_softplus: bool, p: Precision) -> torch.Tensor:
    """eps_d: the relative error of the fp32 step d at every token (module docstring)."""
    v = dt if dt_bias is None else dt + dt_bias
    if not dt_softplus:
        return torch.full_like(v, 2 * p.compute)
    soft = torch.logaddexp(torch.zeros_like(v), v)
    lever = torch.where(soft > 0, v.abs() * torch.sigmoid(v) / soft.clamp(min=1e-300), 0.0)
    return p.compute * (EXP_ULPS + 4 + lever)


def gate_error(z: torch.Tensor, p: Precision, u_op: float) -> torch.Tensor:
    """The relative error of silu(z) in fp32, or rounded to the input dtype."""
    return p.compute * (EXP_ULPS + 3 + z.abs() * (1 - torch.sigmoid(z))) + u_op


def decay_window_error(a: torch.Tensor, chunk: int, p: Precision) -> torch.Tensor:
    """Relative error of the decays reaching token t from fp32 chunk cumsums, [nb, T, H]."""
    lam = torch.cumsum(a.abs(), dim=1)
    window = lam - torch.nn.functional.pad(lam, (0, 0, chunk, 0))[:, :-chunk]
    t = torch.arange(a.shape[1], dtype=torch.float64, device=a.device)[None, :, None]
    return p.compute * (EXP_ULPS * (1 + torch.floor(t / DECAY_COMPOUND)) + (2 + float(sum_error(chunk))) * window)


class Scan:
    """One group of sequences (batch rows evaluated together) in fp64, [nb, T, H, *] with
    B and C per head: the steps, decays and the per-token magnitudes every rule reads."""

    def __init__(self, x, d, A, Bh, Ch, h0, eps_d, p: Precision, chunk: int):
        self.p = p
        self.f0, self.half = floor_units(p.dtype)
        self.x, self.d, self.Bh, self.Ch, self.h0 = x, d, Bh, Ch, h0
        self.a = d * A  # [nb, T, H]
        self.eps_d = eps_d
        self.G = torch.cumsum(self.a, dim=1)
        T = x.shape[1]
        lower = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        diff = (self.G[:, :, None, :] - self.G[:, None, :, :]).masked_fill(~lower[None, :, :, None], 0.0)
        self.R = torch.where(lower[None, :, :, None], torch.exp(diff), 0.0)  # [nb, t, j, H]
        self.cb_abs = torch.einsum("bthn,bjhn->btjh", Ch.abs(), Bh.abs())  # |C_t| . |B_j|
        self.window = decay_window_error(self.a, chunk, p)
        self.lower = lower
        self.chunk = chunk

    def term_magnitudes(self) -> torch.Tensor:
        """R_tj d_j (|C_t| . |B_j|), [nb, t, j, H] (times |x_j[p]| a term's magnitude)."""
        return self.R * self.d[:, None, :, :] * self.cb_abs

    def states(self):
        """Per token: |h|_t, the first-order error state (H^E_t and the writes' underflow
        floors), the fp32-rounding variance V_t and the write's magnitude, [nb, H, P, N] each."""
        habs = self.h0.abs()
        h_eps = torch.zeros_like(habs)
        v_round = torch.zeros_like(habs)
        in_chunk = torch.zeros_like(habs)  # this chunk's writes' underflow roundings, squared, not decayed
        for t in range(self.x.shape[1]):
            e = torch.exp(self.a[:, t])[:, :, None, None]
            xt, bt = self.x[:, t, :, :, None].abs(), self.Bh[:, t, :, None, :].abs()
            write = self.d[:, t, :, None, None] * xt * bt
            # near underflow, one factor of d x B misread by f0 times the other two (a dot operand below F: mamba's
            # x^T (B w) reads x, a tf32 subnormal on a grid of 2^-136 or flushed, beside d B), or a pair's product
            # below F misread before the third factor
            step = self.d[:, t, :, None, None]
            floor = self.f0 * (xt + bt + step + bt * step + xt * step + xt * bt)
            if (t + 1) % DECAY_COMPOUND == 0 or t == self.x.shape[1] - 1:
                floor = floor + self.half  # a chunk's state increment rounded into the dtype's subnormals
            h_eps = e * (h_eps + (self.eps_d[:, t] * self.a[:, t].abs())[:, :, None, None] * habs) + floor
            # a kernel that folds the decay to the chunk's end into the write before rounding it (mamba_ssm
            # rounds B exp(G_end - G_j) d_j to x's dtype) leaves that rounding undecayed: |x_j| times at most
            # min(B_j w_j, f0) (rounding never moves a value past 0, w_j <= d_j), independent over j
            in_chunk = in_chunk + (xt * (bt * self.d[:, t, :, None, None]).clamp(max=self.f0)) ** 2
            habs = e * habs + write
            v_round = e ** 2 * v_round + (2 * self.p.compute * habs) ** 2
            yield habs, h_eps + SUM_LAMBDA * in_chunk.sqrt(), v_round, write
            if (t + 1) % self.chunk == 0:
                in_chunk = torch.zeros_like(habs)


def _groups(n_batch: int, T: int, cu_seqlens) -> list[tuple[slice, slice, slice]]:
    """(batch rows, tokens, states) evaluated together: every row at once without offsets,
    else one packed sequence at a time."""
    if cu_seqlens is None:
        return [(slice(0, n_batch), slice(0, T), slice(0, n_batch))]
    return [(slice(b, b + 1), slice(s, e), slice(n, n + 1))
            for n, (b, s, e) in enumerate(sequences(n_batch, T, cu_seqlens))]


def _per_head(B, H):
    return B[:, :, torch.as_tensor(group_of_heads(H, B.shape[2]), device=B.device)]


def _inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max):
    from tritoncheck.references.ssd_scan import effective_dt
    x, dt, A, B, C = (float64_on(a) for a in (x, dt, A, B, C))
    bias = float64_on(dt_bias) if dt_bias is not None else None
    H = x.shape[2]
    d = effective_dt(dt, bias, dt_softplus, dt_min, dt_max)
    skip = float64_on(D) if D is not None else x.new_zeros(H)
    zz = float64_on(z) if z is not None else None
    return x, dt, A, _per_head(B, H), _per_head(C, H), skip, zz, bias, d


def _forward_errors(x, d, A, Bh, Ch, h0, eps_d, cu_seqlens, final, p: Precision, chunk: int):
    """(the error of s = C h per element [B, T, H, P], the allowed error of the final state)."""
    n_batch, T, H, P = x.shape
    N = Bh.shape[-1]
    u_op = operand_unit(p, N, chunk)
    f0 = floor_units(p.dtype)[0]
    err_s = torch.zeros_like(x)
    allowed_f = torch.zeros_like(final)
    for rows, toks, states in _groups(n_batch, T, cu_seqlens):
        xs, ds, bs, cs, es = (a[rows, toks] for a in (x, d, Bh, Ch, eps_d))
        nb = xs.shape[0]
        start = h0[states] if h0 is not None else x.new_zeros(nb, H, P, N)
        scan = Scan(xs, ds, A, bs, cs, start, es, p, chunk)
        mags = scan.term_magnitudes()  # [nb, t, j, H]
        # independent per-term errors: operand roundings and the step's own error, over every j <= t
        per_term = (KAPPA * u_op) ** 2 + es[:, None, :, :] ** 2
        writes = torch.einsum("btjh,bjhp->bthp", mags ** 2 * per_term, xs ** 2)
        init = torch.exp(scan.G)[..., None] * torch.einsum("bthn,bhpn->bthp", cs.abs(), start.abs())
        writes = writes + (KAPPA * u_op * init) ** 2
        # the chunk's scores and x near underflow (the C tokens up to t), C . B misread over every term
        window = scan.lower & ~torch.ones_like(scan.lower).tril(-chunk)
        scores = (mags * window[None, :, :, None]).sum(2)  # [nb, t, H]
        l1 = cs.abs().sum(-1)[:, :, None, :] + bs.abs().sum(-1)[:, None, :, :]  # ||C_t||_1 + ||B_j||_1
        cb_floor = torch.einsum("btjh,bjhp->bthp", scan.R * ds[:, None] * l1, xs.abs())
        x_window = torch.einsum("tj,bjhp->bthp", window.to(xs.dtype), xs.abs())
        for t, (habs, h_eps, v_round, _) in enumerate(scan.states()):
            ct = cs[:, t]  # [nb, H, N]
            read = torch.einsum("bhn,bhpn->bhp", ct ** 2, habs ** 2)
            rounding = torch.einsum("bhn,bhpn->bhp", ct ** 2, v_round)
            decay = torch.einsum("bhn,bhpn->bhp", ct.abs(), scan.window[:, t, :, None, None] * habs + h_eps)
            floor = f0 * (cb_floor[:, t] + x_window[:, t] + scores[:, t, :, None] + ct.abs().sum(-1)[..., None]
                          + habs.sum(-1))
            err_s[rows, toks.start + t] = SUM_LAMBDA * torch.sqrt(writes[:, t] + (KAPPA_READ * u_op) ** 2 * read
                                                                  + rounding) + decay + floor
        if xs.shape[1]:
            spread = SUM_LAMBDA * torch.sqrt(_write_variance(scan, u_op) + v_round)
            allowed_f[states] = SAFETY * (spread + scan.window[:, -1, :, None, None] * habs + h_eps) \
                + p.compute * final[states].abs() + p.floor
        else:
            allowed_f[states] = p.floor
    return err_s, allowed_f


def ssd_scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens, y, final,
             p: Precision, chunk: int = DEFAULT_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Allowed absolute errors of (y, final_state) (module docstring)."""
    x, dt, A, Bh, Ch, skip, zz, bias, d = _inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max)
    y, final = float64_on(y), float64_on(final)
    u_op = operand_unit(p, Bh.shape[-1], chunk)
    h0 = float64_on(initial_state) if initial_state is not None else None
    err, allowed_f = _forward_errors(x, d, A, Bh, Ch, h0, step_error(dt, bias, dt_softplus, p), cu_seqlens, final,
                                     p, chunk)
    f0, half = floor_units(p.dtype)
    err = err + u_op * (skip[:, None] * x).abs() + Y_ROUNDINGS * half
    if zz is not None:
        gate = zz * torch.sigmoid(zz)
        pre = torch.where(gate != 0, y / torch.where(gate != 0, gate, 1.0), 0.0)
        # sigmoid(z) below fp32's smallest normal F is flushed or lost to exp(-z) overflowing (z < -88.7):
        # off by at most F, so y by F |z| |s + D x|; silu(z) itself below F (z a bf16 or fp32 subnormal)
        # read as 0 or rounded into the dtype's subnormals: off by f0, so y by f0 |s + D x|
        err = err * gate.abs() + gate_error(zz, p, u_op) * (pre * gate).abs() \
            + DOT_READ_FLOOR * (zz * pre).abs() + f0 * pre.abs()
    allowed_y = SAFETY * err + p.store * y.abs().nan_to_num(0.0) + p.floor
    return allowed_y.cpu().numpy(), allowed_f.cpu().numpy()


def _write_variance(scan: Scan, u_op: float) -> torch.Tensor:
    """Per element of the final state: sum_j R_Tj^2 d_j^2 x_j^2 B_j^2 ((KAPPA u_op)^2 + eps_d,j^2)
    and the initial state's (KAPPA u_op exp(G_T) |h_0|)^2 (elementwise, the roundings of
    different elements' terms independent)."""
    last = scan.R[:, -1]  # [nb, j, H]
    weight = (last * scan.d) ** 2 * ((KAPPA * u_op) ** 2 + scan.eps_d ** 2)
    v = torch.einsum("bjh,bjhp,bjhn->bhpn", weight, scan.x ** 2, scan.Bh ** 2)
    return v + (KAPPA * u_op * torch.exp(scan.G[:, -1])[:, :, None, None] * scan.h0.abs()) ** 2



def _triangle_window(q2: torch.Tensor, chunk: int) -> torch.Tensor:
    """sum over t <= j <= i < t + chunk of q2[i, j], per t: [nb, i, j, H] -> [nb, T, H] (the
    pieces a chunked kernel's reverse cumulative sum of dG adds and cancels)."""
    T = q2.shape[1]
    rowcum = torch.cumsum(q2, dim=2)  # sum_{j <= k} q2[i, j]
    full = torch.diagonal(rowcum, dim1=1, dim2=2).transpose(1, 2)  # [nb, T(i), H]: sum_{j <= i}
    fullcum = torch.nn.functional.pad(torch.cumsum(full, dim=1), (0, 0, 1, 0))  # [nb, T + 1, H]
    stacked = torch.nn.functional.pad(torch.cumsum(rowcum, dim=1), (0, 0, 0, 0, 1, 0))  # P2[i' + 1, k]
    out = torch.zeros_like(full)
    for t in range(T):
        end = min(T, t + chunk)
        out[:, t] = fullcum[:, end] - fullcum[:, t]
        if t:
            out[:, t] -= stacked[:, end, t - 1] - stacked[:, t, t - 1]
    return out.clamp(min=0)


def _step_gradients(x, d, A, B, C, h0, cu_seqlens, ds, dfinal):
    """fp64 autograd of the scan's core with the steps d and the log decays a = d A as two
    leaves: (d loss / d d through the writes, d loss / d a, s = C h), for upstream ds on s
    and dfinal on the final state."""
    from tritoncheck.references.ssd_scan import scan_from_steps
    with torch.enable_grad():
        dw, da = d.detach().clone().requires_grad_(True), (d * A).detach().clone().requires_grad_(True)
        s, final = scan_from_steps(x, dw, da, float64_on(B), float64_on(C), h0, cu_seqlens)
        outs, ups = [s], [ds]
        if dfinal is not None:
            outs.append(final)
            ups.append(dfinal)
        g_w, g_a = torch.autograd.grad(outs, [dw, da], ups, allow_unused=True)
    zero = torch.zeros_like(d)
    return (zero if g_w is None else g_w), (zero if g_a is None else g_a), s.detach()


def step_gradient(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens, dy,
                  dfinal) -> torch.Tensor:
    """d loss / d d in fp64 [B, T, H]: the gradient of the effective step before the clamp
    and softplus (a kernel holds it in fp32 before the chain rule masks or scales it)."""
    from tritoncheck.references.ssd_scan import silu
    x, dt, A, Bh, Ch, skip, zz, bias, d = _inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max)
    dout = float64_on(dy)
    ds = dout * silu(zz) if zz is not None else dout
    h0 = float64_on(initial_state) if initial_state is not None else None
    dw, da, _ = _step_gradients(x, d, A, B, C, h0, cu_seqlens, ds, float64_on(dfinal) if dfinal is not None else None)
    return dw + A * da


def ssd_scan_grad(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens, dy, dfinal,
                  outputs, grads, p: Precision, chunk: int = DEFAULT_CHUNK,
                  stores: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """Allowed absolute errors of dx, ddt, dA, dB, dC, dD, dz, ddt_bias and d initial_state.

    The adjoint D_t = dL/dh_t = sum_{i >= t} R_it dy_i C_i^T + R_Tt dfinal (dy = the upstream
    gradient times silu(z)) runs backwards through the same scalar decays, so its terms
    are bounded alike. Each gradient is a sum of terms; as for y (module docstring), each
    term errs independently by KAPPA u_op of its absolute magnitude (plus the step's eps_d
    on the terms through d_t, the gate's error on the terms through dy_i, its underflow
    floor f0 |dout| among it), the chunk-start state and adjoint are read rounded
    (KAPPA_READ u_op, over the [P, N] elements), and the decays err first-order (the chunk
    window and E_i - E_j):

    * dx_t[p] = d_t sum_{i >= t} R_it dy_i[p] (C_i . B_t) + d_t R_Tt (dfinal B_t)[p] + D dy_t[p];
    * dB_t[n] = d_t sum_{i >= t} R_it C_i[n] (dy_i . x_t) + d_t R_Tt (x_t^T dfinal)[n], summed
      over the group's heads; dC_t[n] = sum_{j <= t} R_tj d_j B_j[n] (dy_t . x_j) + the
      initial state's exp(G_t) (dy_t^T h_0)[n], summed likewise;
    * dd_t = sum_{p, n} D_t x_t B_t^T (the write) + A da_t, da_t = <D_t, exp(a_t) h_{t-1}> (the
      decay): the product of the adjoint and the state, each with its per-element error
      variance, and a chunked kernel's dG pieces, which cancel in a reverse cumulative sum:
      KAPPA_READ u_op sqrt(sum of the squared pieces R_ij d_j (|dy_i| . |x_j|) (|C_i| . |B_j|)
      over t <= j <= i < t + C, and of the chunk-end write pieces d_j x_j^T adj B_j over
      t <= j < t + C, bounded by d_j <|x_j| |B_j|^T, |D|_j>: a write's decay to the chunk's
      end is added to dG_last and taken off dG_j, 1e10 each where the result is 1e2);
    * ddt_t = dd_t sigmoid(v_t) [softplus] on the clamp's closed interval (and anything
      where the fp32 step lies within its own error of a bound: either side is right);
      ddt_bias sums it over tokens, dA sums d_t da_t, dD sums dy x;
    * dz = upstream silu'(z) (s + D x): y's own error before the gate, times silu'(z), and
      silu' in fp32 (EXP_ULPS + 6 + |z|) u32 or rounded (u_op);
    * d initial_state = exp(a_1) D_1: the adjoint's per-element variance at the start.

    The per-token fp32 rounding of the state and the adjoint (2 u32 a token) is inside
    the read term's KAPPA_READ u_op: u_op holds sum_error(64) u32 ~ 46 u32, and 2 sqrt(T)
    u32 stays below it for T below 2**9 (the gradient checks' longest sequences).
    Then SUM_LAMBDA, SAFETY, the store of each gradient in its input's dtype (``stores``)
    and the floor.
    """
    from tritoncheck.references.ssd_scan import silu
    x, dt, A, Bh, Ch, skip, zz, bias, d = _inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max)
    dout = float64_on(dy)
    n_batch, T, H, P = x.shape
    G, N = B.shape[2], Bh.shape[-1]
    u_op = operand_unit(p, N, chunk)
    kw, rd = (KAPPA * u_op) ** 2, (KAPPA_READ * u_op) ** 2
    eps_d = step_error(dt, bias, dt_softplus, p)
    h0 = float64_on(initial_state) if initial_state is not None else None
    dfin = float64_on(dfinal) if dfinal is not None else None
    if zz is not None:
        # the gate's relative error, with its underflow floor f0 (forward) taken relative to silu(z):
        # at most 1, as rounding to nearest or a flush never moves a value past 0
        gate = silu(zz)
        f0 = floor_units(p.dtype)[0]
        dyp = dout * gate
        gerr = gate_error(zz, p, u_op) + (f0 / gate.abs().clamp(min=f0)).where(gate != 0, 0.0)
    else:
        dyp, gerr = dout, torch.zeros_like(dout)
    zeros = {n: torch.zeros(x.shape[:3] + tail, dtype=torch.float64, device=x.device)
             for n, tail in (("x", (P,)), ("B", (N,)), ("C", (N,)), ("dd", ()), ("da", ()))}
    var = {n: t.clone() for n, t in zeros.items()}
    lin = {n: t.clone() for n, t in zeros.items()}
    n_seq = len(sequences(n_batch, T, cu_seqlens))
    var_h0 = x.new_zeros(n_seq, H, P, N)
    lin_h0 = x.new_zeros(n_seq, H, P, N)
    for rows, toks, states in _groups(n_batch, T, cu_seqlens):
        xs, ds, bs, cs, es, dys, gs = (a[rows, toks] for a in (x, d, Bh, Ch, eps_d, dyp, gerr))
        nb, n_tok = xs.shape[:2]
        start = h0[states] if h0 is not None else x.new_zeros(nb, H, P, N)
        dfs = dfin[states] if dfin is not None else x.new_zeros(nb, H, P, N)
        if not n_tok:
            var_h0[states] = 0.0
            continue
        scan = Scan(xs, ds, A, bs, cs, start, es, p, chunk)
        step = es * scan.a.abs()
        E = torch.cumsum(step, dim=1)
        delta = (scan.window[:, :, None] + E[:, :, None] - E[:, None, :]) * scan.lower[None, :, :, None]
        to_end = torch.exp(scan.G[:, -1:] - scan.G)  # R_Tt [nb, T, H]
        end_err = scan.window[:, -1:] + E[:, -1:] - E  # the decay error of R_Tt
        xy = torch.einsum("bihp,bjhp->bijh", dys.abs(), xs.abs())  # |dy_i| . |x_j|
        xy_gate = torch.einsum("bihp,bjhp->bijh", dys.abs() * gs, xs.abs())  # the gate's error of |dy_i| . |x_j|
        mags = scan.term_magnitudes()
        # dx: terms R_it d_t (|C_i| . |B_t|) |dy_i[p]| over i >= t, and the final adjoint's
        vx = torch.einsum("bith,bihp->bthp", mags ** 2, dys ** 2) * (kw + es ** 2)[..., None] \
            + torch.einsum("bith,bihp->bthp", mags ** 2, (dys * gs) ** 2)
        lx = torch.einsum("bith,bihp->bthp", mags * delta, dys.abs())
        fx = (ds * to_end)[..., None] * torch.einsum("bhpn,bthn->bthp", dfs.abs(), bs.abs())
        vx, lx = vx + kw * fx ** 2, lx + end_err[..., None] * fx
        # dB (over i >= t) and dC (over j <= t): terms R_ij d_j (|dy_i| . |x_j|) times |C_i[n]|, |B_j[n]|
        mb = scan.R * ds[:, None] * xy
        w = mb ** 2 * (kw + es[:, None] ** 2) + (scan.R * ds[:, None] * xy_gate) ** 2
        vb, lb = torch.einsum("bith,bihn->bthn", w, cs ** 2), torch.einsum("bith,bihn->bthn", mb * delta, cs.abs())
        fb = (ds * to_end)[..., None] * torch.einsum("bhpn,bthp->bthn", dfs.abs(), xs.abs())
        vb, lb = vb + kw * fb ** 2, lb + end_err[..., None] * fb
        vc, lc = torch.einsum("btjh,bjhn->bthn", w, bs ** 2), torch.einsum("btjh,bjhn->bthn", mb * delta, bs.abs())
        init = torch.exp(scan.G)[..., None] * torch.einsum("bthp,bhpn->bthn", dys.abs(), start.abs())
        vc, lc = vc + kw * init ** 2, lc + (scan.window + E)[..., None] * init
        # the step's write part: R_it (|dy_i| . |x_t|) (|C_i| . |B_t|) over i >= t; the decay part's dG pieces
        m2 = scan.R * xy * scan.cb_abs
        vdd = torch.einsum("bith->bth", m2 ** 2 * kw + (scan.R * xy_gate * scan.cb_abs) ** 2)
        ldd = torch.einsum("bith->bth", m2 * delta)
        fdd = to_end * torch.einsum("bthp,bhpn,bthn->bth", xs.abs(), dfs.abs(), bs.abs())
        vdd, ldd = vdd + kw * fdd ** 2, ldd + end_err * fdd
        pieces = _triangle_window((m2 * ds[:, None]) ** 2, chunk)
        # the state before each token's write (magnitude, decay error, per-element variance)
        fwd, v_state = [], torch.zeros_like(start)
        for t, (habs, h_eps, _, write) in enumerate(scan.states()):
            e2 = torch.exp(2 * scan.a[:, t])[:, :, None, None]
            fwd.append((habs - write, h_eps, e2 * v_state))
            v_state = e2 * v_state + (kw + es[:, t, :, None, None] ** 2) * write ** 2 + (2 * p.compute * habs) ** 2
            fc = torch.einsum("bhp,bhpn->bhn", dys[:, t] ** 2, habs ** 2)
            vc[:, t] += rd * fc + torch.einsum("bhp,bhpn->bhn", dys[:, t] ** 2, v_state)
            lc[:, t] += torch.einsum("bhp,bhpn->bhn", dys[:, t].abs(), scan.window[:, t, :, None, None] * habs + h_eps)
        d_abs, d_var, d_eps = dfs.abs(), torch.zeros_like(dfs), torch.zeros_like(dfs)
        da_var, da_lin = torch.zeros_like(ds), torch.zeros_like(ds)
        ends: list[torch.Tensor] = []  # the chunk-end write pieces of the C tokens from t on
        for t in reversed(range(n_tok)):
            own = dys[:, t].abs()[..., None] * cs[:, t].abs()[:, :, None, :]
            d_abs = d_abs + own
            d_var = d_var + (kw + gs[:, t][..., None] ** 2) * own ** 2 + (2 * p.compute * d_abs) ** 2
            bt, xt, dt_t = bs[:, t].abs(), xs[:, t].abs(), ds[:, t][..., None]
            spread = scan.window[:, t, :, None, None] * d_abs + d_eps
            vx[:, t] += rd * dt_t ** 2 * torch.einsum("bhn,bhpn->bhp", bt ** 2, d_abs ** 2)
            lx[:, t] += dt_t * torch.einsum("bhn,bhpn->bhp", bt, spread)
            vb[:, t] += rd * dt_t ** 2 * torch.einsum("bhp,bhpn->bhn", xt ** 2, d_abs ** 2)
            lb[:, t] += dt_t * torch.einsum("bhp,bhpn->bhn", xt, spread)
            vdd[:, t] += rd * torch.einsum("bhp,bhpn,bhn->bh", xt ** 2, d_abs ** 2, bt ** 2)
            ldd[:, t] += torch.einsum("bhp,bhpn,bhn->bh", xt, spread, bt)
            hp, hp_eps, hp_var = fwd[t]
            # each write's piece of the chunk-end decay, d_j x_j^T adj B_j (the adjoint at the chunk's end
            # decayed to j is at most |D|_j), added to dG_last and taken off dG_j: cancels for j >= t
            ends.insert(0, (dt_t[..., 0] * torch.einsum("bhp,bhpn,bhn->bh", xt, d_abs, bt)) ** 2)
            del ends[chunk:]
            da_var[:, t] = (hp ** 2 * d_var + d_abs ** 2 * hp_var + rd * (d_abs * hp) ** 2).sum((-2, -1)) \
                + rd * (pieces[:, t] + torch.stack(ends).sum(0))
            da_lin[:, t] = (d_abs * hp_eps + hp * spread).sum((-2, -1))
            e = torch.exp(scan.a[:, t])[:, :, None, None]
            d_eps = e * (d_eps + step[:, t, :, None, None] * d_abs)
            d_abs, d_var = e * d_abs, e ** 2 * d_var
        var_h0[states], lin_h0[states] = d_var, d_eps + scan.window[:, 0, :, None, None] * d_abs
        sel = (rows, toks)
        for name, v, li in (("x", vx, lx), ("B", vb, lb), ("C", vc, lc), ("dd", vdd, ldd), ("da", da_var, da_lin)):
            var[name][sel], lin[name][sel] = v, li
    g64 = {n: float64_on(g).abs().nan_to_num(0.0) if g is not None else None for n, g in grads.items()}

    def allowed(name, v, li, extra=0.0):
        store = (stores or {}).get(name, p.store)
        return (SAFETY * (SUM_LAMBDA * v.clamp(min=0).sqrt() + li + extra) + store * g64[name] + p.floor).cpu().numpy()

    per_group = (n_batch, T, G, H // G, N)
    out = {}
    vx_all = var["x"] + (u_op ** 2 + gerr ** 2) * (skip[:, None] * dyp) ** 2
    out["dx"] = allowed("x", vx_all, lin["x"])
    out["dB"] = allowed("B", var["B"].reshape(per_group).sum(3), lin["B"].reshape(per_group).sum(3))
    out["dC"] = allowed("C", var["C"].reshape(per_group).sum(3), lin["C"].reshape(per_group).sum(3))
    dd_var = var["dd"] + A ** 2 * var["da"]
    dd_lin = lin["dd"] + A.abs() * lin["da"]
    # the chain to dt: sigmoid(v) on the clamp's interval; near a bound either side
    v = dt if bias is None else dt + bias
    soft = torch.logaddexp(torch.zeros_like(v), v) if dt_softplus else v
    chain = (torch.sigmoid(v) if dt_softplus else torch.ones_like(v))
    inside = (soft >= dt_min) & (soft <= dt_max)
    near = ((soft - dt_min).abs() <= 4 * eps_d * soft.abs()) | ((soft - dt_max).abs() <= 4 * eps_d * soft.abs())
    dw_ref, da_ref, s_ref = _step_gradients(x, d, A, B, C, h0, cu_seqlens, dyp, dfin)
    dd_ref = dw_ref + A * da_ref
    chain_err = p.compute * (EXP_ULPS + 2 + v.abs() * (1 - chain)) if dt_softplus else torch.zeros_like(v)
    ddt_var = torch.where(inside, chain ** 2 * dd_var, 0.0)
    ddt_lin = torch.where(inside, chain * dd_lin + chain_err * (chain * dd_ref).abs(), 0.0) \
        + torch.where(near, (chain * dd_ref).abs(), 0.0)
    out["ddt"] = allowed("dt", ddt_var, ddt_lin)
    count = float(sum_error(max(1, n_batch * T), p.compute))
    ddt_ref = torch.where(inside, chain * dd_ref, 0.0)
    out["ddt_bias"] = allowed("dt_bias", ddt_var.sum((0, 1)), ddt_lin.sum((0, 1)) + count * ddt_ref.abs().sum((0, 1))) \
        if dt_bias is not None else None
    out["dA"] = allowed("A", (d ** 2 * var["da"] + (eps_d * d * da_ref) ** 2).sum((0, 1)),
                        (d * lin["da"]).sum((0, 1)) + count * (d * da_ref).abs().sum((0, 1)))
    if D is not None:
        prod = dyp * x
        out["dD"] = allowed("D", (rd * prod ** 2 + (gerr * prod) ** 2).sum((0, 1, 3)),
                            float(sum_error(max(1, n_batch * T * P), p.compute)) * prod.abs().sum((0, 1, 3)))
    if zz is not None:
        s = s_ref + skip[:, None] * x
        err_pre, _ = _forward_errors(x, d, A, Bh, Ch, h0, eps_d, cu_seqlens, x.new_zeros(n_seq, H, P, N), p, chunk)
        err_pre = err_pre + u_op * (skip[:, None] * x).abs()
        sg = torch.sigmoid(zz)
        slope = sg * (1 + zz * (1 - sg))
        rel = p.compute * (EXP_ULPS + 6 + zz.abs()) + u_op
        out["dz"] = allowed("z", torch.zeros_like(zz), (dout * slope).abs() * err_pre + rel * (dout * slope * s).abs()
                            + DOT_READ_FLOOR * (zz * dout * s).abs())
    out["dinitial_state"] = (SAFETY * (SUM_LAMBDA * var_h0.sqrt() + lin_h0) + p.compute * g64["initial_state"]
                             + p.floor).cpu().numpy() if h0 is not None else None
    return out
