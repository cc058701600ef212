"""Tolerance rule of the fused mixture-of-experts layer (``fused_moe``).

Pieces and notation: :mod:`tritoncheck.tolerance`; the math: references/fused_moe.py. For each
(token t, slot j) pair with expert e and weight w: ``g``, ``v`` (gate and up, I each), ``h =
silu(g) v``, ``o = W2[e] h``; ``Sg = |W1[e, :I]| |x_t|``, ``Sv`` likewise (what the sums over H
run over). ``u = u(fp32)``; ``r`` is the rounding of an fp32 value into x's dtype, ``p.store``
(u(dtype), 2 u(bf16) for the interpreter's truncating conversion).

What a correct implementation may do, and what each step costs:

* The projections over H in fp32: ``sum_error(H)`` of ``Sg`` (``Sv``), whatever the order or
  blocking. The products' own roundings (``p.dot`` each: tf32 operands for float32 x on a GPU):
  ``p.dot min(Sg, 2 |g| + SUM_LAMBDA Rg)``, ``Rg = sqrt(sum_h (x_h W1_ih)^2)``. Each operand
  element is rounded once, distinct values independently, so over one dot the roundings add as
  a bounded zero-mean sum (Hoeffding, the SUM_LAMBDA of ``sum_error``); equal values round alike
  (a constant x, weights of one magnitude) and a truncating conversion has a mean, which ``2
  p.dot |g|`` covers whatever the correlation (each operand within p.dot: tf32's truncation).
  fp8 weights: the
  products of x and the fp8 values are exact in fp32 (or the dequantised weight in fp32: one
  rounding more), the scale applied in fp32: ``2 u``. Not charged: the dequantised weight
  rounded into x's dtype. That error is ``r |W|`` per weight, ``r Sg`` on g, and carried
  through SwiGLU and the second GEMM the worst-case bound reached |y| itself for bfloat16 at
  H = 150, I = 70 (a rule that accepts 0): a kernel that computes with a rounded copy of the
  dequantised weights is outside the contract. An operand below fp32's normals may be
  flushed (``DOT_READ_FLOOR`` per product, times the other operand's magnitude).
* g and v may be stored in x's dtype before SwiGLU (vLLM keeps the first GEMM's ``[T k, 2I]``
  output in the activation dtype): ``r |g| + p.floor``, ``r |v| + p.floor`` (near underflow a
  rounding into the dtype's subnormals errs by up to their spacing whatever |g|: p.floor, here
  and at every rounding below). So ``dg = sum_error(H) Sg + p.dot min(Sg, 2 |g| + SUM_LAMBDA Rg) + r |g|
  + p.floor + flush``.
* SwiGLU at the computed g, v: ``properties/elementwise_tolerance.py``'s ``swiglu`` rule (the fp32
  sigmoid, two products, silu(g) rounded to x's dtype as ``F.silu`` does, h stored in x's dtype:
  vLLM's ``[T k, I]`` intermediate); and g's, v's errors carried through h's derivatives:
  ``|v| 1.1 dg + |silu(g)| dv`` (|d silu / dg| <= 1.1).
* The projection over I: ``sum_error(I) |W2| |h|``, its products ``p.dot min(|W2| |h|, 2 |o| +
  SUM_LAMBDA Ro)`` as over H, plus ``|W2| dh`` (the intermediate's error carried worst-case over
  I), fp8's scale as above, and the flush floor. The first GEMM's product roundings are carried
  otherwise where the Jacobian fits ``JACOBIAN_BUDGET``: the smaller of ``|W2| dh_dot`` and their
  first-order effect on o bounded as a sum of independent terms (:func:`_first_gemm_roundings`).
  Worst-case over I they cost sqrt(I): x's rounding is shared by the I dots of g and v, so those
  errors are not independent, and only the Jacobian ``W2 (a W1g + b W1v)`` weighs each of x's
  roundings by its own coefficient. Charged linearly at both GEMMs, tf32's roundings reached |y|
  (an allowance that accepts 0) in 22 of 40 float32 comparisons at the gpu profile on an H200
  (H = 4200, I = 2100 grow it by sqrt(H I) over the error); a tf32 simulation
  (tests/test_property_rules.py) errs by 0.12-0.23 of the new form, the allowance 0.064-0.081 |y|.
* The weight: ``w o`` in fp32 (``u``); o rounded to x's dtype before the weighting (HF's
  Mixtral: ``w2`` is a Linear in x's dtype, then ``* routing_weights``), the routing weight
  rounded to x's dtype (HF casts it) and the weighted term stored in x's dtype (vLLM's ``[T,
  k, H]``): ``3 r`` of ``|w o|``, and ``(|w| + 1) p.floor``. From
  router logits, the weights' own error ``r_w``: a float32 softmax (each exp ``(EXP_ULPS + |z|)
  u`` for z = logit - max, the sum ``sum_error(E)``, the division ``u``; the sum's error carries
  every exp's, so ``r_p = 2 u (EXP_ULPS + max |z|) + sum_error(E) + u``), renormalised: ``2 r_p +
  sum_error(k) + u``. The experts chosen are the exact ones (the domain keeps the k-th and the
  (k+1)-th logits apart).
* The sum over the k slots, in x's dtype at worst (vLLM's ``moe_sum`` and HF's ``index_add_``
  accumulate there): ``(k - 1) r`` of ``sum_j |w_j o_j|`` (Higham's recursive-sum bound, k <= 8
  in practice, below the probabilistic one there), and ``(k - 1) p.floor``.
* The store of y: ``p.store |y| + p.floor``.

SAFETY on the whole (the SwiGLU rule carries its own as well).
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck import backend
from tritoncheck.properties.elementwise_tolerance import swiglu
from tritoncheck.references.fused_moe import expert_terms, routing_torch
from tritoncheck.tolerance import DOT_READ_FLOOR, EXP_ULPS, SAFETY, SUM_LAMBDA, U32, Precision, float64_on, sum_error


def _on(v, device, integer: bool = False):
    if v is None:
        return None
    if integer:
        return torch.as_tensor(np.asarray(v) if not isinstance(v, torch.Tensor) else v, device=device).to(torch.int64)
    return float64_on(v, device)


def routing_error(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
    """Each token's relative error bound of its routing weights [T, 1] (module docstring)."""
    experts = router_logits.shape[1]
    spread = (router_logits.max(dim=1).values - router_logits.min(dim=1).values)[:, None]
    r_p = 2 * U32 * (EXP_ULPS + spread) + float(sum_error(experts, U32)) + U32
    return 2 * r_p + float(sum_error(top_k, U32)) + U32 if renormalize else r_p


def routed(values: dict, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | float]:
    """(weights fp64 [T, k], ids int64 [T, k], the weights' relative error) of a call's inputs:
    as given, or the exact routing of its logits."""
    logits = values.get("router_logits")
    if logits is None:
        return _on(values["topk_weights"], device), _on(values["topk_ids"], device, integer=True), 0.0
    logits = _on(logits, device)
    weights, ids = routing_torch(logits, int(values["top_k"]), bool(values["renormalize"]))
    return weights, ids, routing_error(logits, int(values["top_k"]), bool(values["renormalize"]))


def _flush(row_sums: torch.Tensor, col_sums: torch.Tensor, n: int) -> torch.Tensor:
    """DOT_READ_FLOOR per product of a length-n dot: misread operands times the other's magnitude."""
    return DOT_READ_FLOOR * (row_sums[:, None] + col_sums[None, :] + n)


def _products_rss(rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sqrt(sum_k (rows[p, k] w[n, k])^2) [P, N]: the root sum of squares of each dot's products."""
    return (rows.square() @ w.square().T).sqrt()


# pairs x H x H x I, all experts': above it the first GEMM's roundings travel over I worst-case
# (the linear bound): 2**36 multiply-adds of one example's Jacobians, under a second on a GPU in fp64.
JACOBIAN_BUDGET = 2**36


def _first_gemm_roundings(xs: torch.Tensor, w1e: torch.Tensor, w2e: torch.Tensor, g: torch.Tensor,
                          v: torch.Tensor, rss: torch.Tensor, dot: float) -> torch.Tensor:
    """The first GEMM's operand roundings (x's and W1's elements, each rounded once) carried to o
    [P, H] through the pair's linearised map: o's first-order error is ``sum_h x_h alpha_h M_jh +
    sum_ih W2_ji (a_i W1g_ih + b_i W1v_ih) x_h beta_ih`` with ``a = d silu(g) / dg v``, ``b =
    silu(g)``, ``M = W2 (a W1g + b W1v)`` (the Jacobian of o in x). Roundings of distinct values
    are independent: each sum's deviations from its mean, within ``dot / 2`` a term, are bounded
    by SUM_LAMBDA times its root sum of squares (Hoeffding). Equal values round alike (a constant
    x, weights of one magnitude), and a truncating conversion has a mean: at most ``dot |M x|``
    each sum, whatever the correlation (``|alpha|, |beta| <= dot``). Worst-case over I instead (x's
    rounding is shared by the I dots) costs sqrt(I). ``rss``: the first GEMM's :func:`_products_rss`."""
    inter = v.shape[1]
    w1g, w1v = w1e[:inter], w1e[inter:]
    sig = torch.sigmoid(g)
    a, b = (sig + g * sig * (1 - sig)) * v, g * sig
    mean = (a * g + b * v) @ w2e.T  # M x
    rss_w = (((a * rss[:, :inter]).square() + (b * rss[:, inter:]).square()) @ w2e.square().T).sqrt()
    rss_x = torch.empty_like(mean)
    hidden = xs.shape[1]
    step = max(1, 2**24 // (hidden * max(hidden, inter)))  # pairs a batch: [step, H, H] and [step, H, I]
    for start in range(0, xs.shape[0], step):
        end = start + step
        jac = (w2e[None] * a[start:end, None, :]) @ w1g + (w2e[None] * b[start:end, None, :]) @ w1v
        rss_x[start:end] = (jac.square() @ xs[start:end, :, None].square()).squeeze(-1).sqrt()
    return 2 * dot * mean.abs() + dot / 2 * SUM_LAMBDA * (rss_x + rss_w)


def pair_allowance(values: dict, p: Precision) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(allowed error of each pair's w o [P, H] before the sum over slots, |w o| [P, H], the
    terms' weights w [P], k) for a call's fp64 inputs ``values`` (module docstring)."""
    device = backend.device()
    x = _on(values["x"], device)
    w1, w2 = _on(values["w1"], device), _on(values["w2"], device)
    s1, s2 = _on(values.get("w1_scale"), device), _on(values.get("w2_scale"), device)
    weights, ids, r_w = routed(values, device)
    terms = expert_terms(x, w1, w2, weights, ids, s1, s2)
    r = p.store
    hidden, inter = x.shape[1], w2.shape[2]
    fp8_1 = 2 * U32 if s1 is not None else 0.0
    fp8_2 = 2 * U32 if s2 is not None else 0.0
    a1 = float(sum_error(hidden, p.compute)) + fp8_1
    a2 = float(sum_error(inter, p.compute)) + fp8_2
    g, v, h = terms["g"], terms["v"], terms["h"]
    x_sums = x.abs().sum(1)[terms["token"]]
    dg = a1 * terms["sg"] + r * g.abs() + p.floor
    dv = a1 * terms["sv"] + r * v.abs() + p.floor
    dg_dot, dv_dot = torch.zeros_like(g), torch.zeros_like(v)  # the products' own roundings
    rss = torch.zeros(g.shape[0], 2 * inter, dtype=g.dtype, device=g.device)  # their root sums of squares
    for e, w1e in terms["W1"].items():
        rows = (terms["expert"] == e).nonzero().flatten()
        col = w1e.abs().sum(1)
        dg[rows] += _flush(x_sums[rows], col[:inter], hidden)
        dv[rows] += _flush(x_sums[rows], col[inter:], hidden)
        rss[rows] = _products_rss(x[terms["token"][rows]], w1e)
        dg_dot[rows] = p.dot * torch.minimum(terms["sg"][rows], 2 * g[rows].abs() + SUM_LAMBDA * rss[rows, :inter])
        dv_dot[rows] = p.dot * torch.minimum(terms["sv"][rows], 2 * v[rows].abs() + SUM_LAMBDA * rss[rows, inter:])
    silu = g * torch.sigmoid(g)
    dh = float64_on(swiglu(g, v, h, p), device) + v.abs() * 1.1 * dg + silu.abs() * dv
    dh_dot = v.abs() * 1.1 * dg_dot + silu.abs() * dv_dot
    do = torch.zeros_like(terms["o"])
    jacobians = ids.numel() * hidden * hidden * inter <= JACOBIAN_BUDGET
    for e, w2e in terms["W2"].items():
        rows = (terms["expert"] == e).nonzero().flatten()
        a = w2e.abs()
        s_o = h[rows].abs() @ a.T
        products = torch.minimum(s_o, 2 * terms["o"][rows].abs() + SUM_LAMBDA * _products_rss(h[rows], w2e))
        carried = dh_dot[rows] @ a.T
        if jacobians:
            composed = _first_gemm_roundings(x[terms["token"][rows]], terms["W1"][e], w2e, g[rows], v[rows], rss[rows],
                                             p.dot)
            carried = torch.minimum(carried, composed)
        do[rows] = a2 * s_o + p.dot * products + dh[rows] @ a.T + carried \
            + _flush(h[rows].abs().sum(1), a.sum(1), inter)
    w = terms["weight"]
    r_w = r_w if isinstance(r_w, float) else r_w.expand(-1, ids.shape[1]).reshape(-1)[:, None]
    wo = (w[:, None] * terms["o"]).abs()
    allowed = w.abs()[:, None] * do + (U32 + 3 * r + r_w) * wo + (w.abs()[:, None] + 1) * p.floor
    return allowed, wo, w, ids.shape[1]


def fused_moe(values: dict, y, p: Precision) -> np.ndarray:
    """Allowed absolute error of each element of ``y [T, H]`` (the module docstring derives it)."""
    allowed, wo, _, k = pair_allowance(values, p)
    t = allowed.shape[0] // k
    per_token = allowed.view(t, k, -1).sum(1) + (k - 1) * (p.store * wo.view(t, k, -1).sum(1) + p.floor)
    device = backend.device()
    return (SAFETY * per_token + p.store * float64_on(y, device).abs() + p.floor).cpu().numpy()
