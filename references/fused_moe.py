"""fp64 references for the fused mixture-of-experts layer (``fused_moe``).

- :func:`fused_moe`: NumPy fp64.
- :func:`fused_moe_torch`: PyTorch fp64 on the inputs' device (cross-checked with the NumPy
  one in tests/test_registry.py).
- :func:`routing`, :func:`expert_terms`: the pieces, for the tolerance rule and the properties.

Math (``x [T, H]``; ``w1 [E, 2I, H]`` its first I rows the gate projection, the next I the
up projection; ``w2 [E, H, I]``; fp8 weights stand for ``w * scale``, the scale layouts of
``references/quantisation.py`` over each expert's ``[N, K]`` matrix)::

    routing: topk_weights, topk_ids as given, or from router_logits [T, E]:
        p = softmax(router_logits[t]); ids = the top_k largest p (ties at the k-th are outside
        the domain); weights = p[ids], divided by their sum when renormalize
    for each token t and slot j (e = topk_ids[t, j], w = topk_weights[t, j]):
        g = W1[e, :I] x_t      v = W1[e, I:] x_t      h = silu(g) v = g sigmoid(g) v
        o = W2[e] h
    y_t = sum_j w o          exactly, in fp64

A token routed twice to one expert (a row of topk_ids naming it twice) has two terms: the
sum is over slots, not over distinct experts. Only the experts some slot names are read.
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.references.quantisation import SCALE_BLOCK, dequantise, groups

__all__ = ["fused_moe", "fused_moe_torch", "routing", "routing_torch", "expert_terms", "weight_groups",
           "dequantised_expert"]


def weight_groups(scale_shape, matrix_shape, name: str = "scale") -> tuple[int | None, int | None]:
    """The groups of an expert's weight scale ``[1 or N or ceil(N/128), 1 or ceil(K/128)]`` over
    its ``[N, K]`` matrix: per expert (both 1), per output channel (N), per 128 x 128 block."""
    return groups(scale_shape, matrix_shape, ((1, SCALE_BLOCK), (SCALE_BLOCK,)), name)


def dequantised_expert(w, scale, e: int):
    """Expert ``e``'s weight matrix in float64 (NumPy or torch, as ``w``): ``w[e]`` itself, or
    ``w[e] * scale[e]`` over the scale's groups."""
    if scale is None:
        return w[e].to(torch.float64) if isinstance(w, torch.Tensor) else np.asarray(w[e], dtype=np.float64)
    return dequantise(w[e], scale[e], weight_groups(tuple(scale.shape[1:]), tuple(w.shape[1:])))


def _softmax_np(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def routing(router_logits, top_k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(topk_weights [T, k] fp64, topk_ids [T, k] int64): softmax, the top_k largest (in order,
    the lower expert first among equal ones), renormalised when asked (NumPy)."""
    p = _softmax_np(np.asarray(router_logits, dtype=np.float64))
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(p, ids, axis=-1)
    if renormalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights, ids


def routing_torch(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`routing` in PyTorch fp64."""
    p = torch.softmax(router_logits.to(torch.float64), dim=-1)
    ids = torch.argsort(-p, dim=-1, stable=True)[:, :top_k]
    weights = torch.gather(p, -1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _routed(topk_weights, topk_ids, router_logits, top_k, renormalize, torch_form: bool):
    if router_logits is not None:
        return (routing_torch if torch_form else routing)(router_logits, top_k, renormalize)
    if torch_form:
        return topk_weights.to(torch.float64), topk_ids.to(torch.int64)
    return np.asarray(topk_weights, dtype=np.float64), np.asarray(topk_ids).astype(np.int64)


def _sigmoid(g):
    if isinstance(g, torch.Tensor):
        e = torch.exp(-g.abs())
        return torch.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    e = np.exp(-np.abs(g))
    return np.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def expert_terms(x, w1, w2, weights, ids, w1_scale=None, w2_scale=None) -> dict:
    """Every (token, slot) pair's pieces in fp64, pairs in row-major order (p = t k + j):
    ``token``, ``expert``, ``weight`` [P]; ``g``, ``v``, ``h`` [P, I]; ``o`` [P, H]; and, for
    the rule, ``sg``, ``sv`` (|W1| |x| of the gate and up rows) [P, I] and the expert's
    dequantised matrices by expert (``W1``, ``W2``: only the experts some slot names).
    NumPy or torch, as ``x``."""
    is_torch = isinstance(x, torch.Tensor)
    lib = torch if is_torch else np
    x64 = x.to(torch.float64) if is_torch else np.asarray(x, dtype=np.float64)
    t, k = ids.shape
    flat = ids.reshape(-1)
    tokens = lib.arange(t * k, **({"device": x.device} if is_torch else {})) // k
    inter = w2.shape[2]
    hidden = x64.shape[1]
    pieces = {name: (x64.new_zeros((t * k, inter)) if is_torch else np.zeros((t * k, inter)))
              for name in ("g", "v", "sg", "sv")}
    pieces["o"] = x64.new_zeros((t * k, hidden)) if is_torch else np.zeros((t * k, hidden))
    mats = {"W1": {}, "W2": {}}
    used = sorted({int(e) for e in (flat.tolist() if is_torch else flat)})
    for e in used:
        rows = (flat == e).nonzero()[0] if not is_torch else (flat == e).nonzero().flatten()
        w1e, w2e = dequantised_expert(w1, w1_scale, e), dequantised_expert(w2, w2_scale, e)
        mats["W1"][e], mats["W2"][e] = w1e, w2e
        xs = x64[tokens[rows]]
        gv = xs @ w1e.T
        s = lib.abs(xs) @ lib.abs(w1e).T
        pieces["g"][rows], pieces["v"][rows] = gv[:, :inter], gv[:, inter:]
        pieces["sg"][rows], pieces["sv"][rows] = s[:, :inter], s[:, inter:]
    g, v = pieces["g"], pieces["v"]
    pieces["h"] = g * _sigmoid(g) * v
    for e in used:
        rows = (flat == e).nonzero()[0] if not is_torch else (flat == e).nonzero().flatten()
        pieces["o"][rows] = pieces["h"][rows] @ mats["W2"][e].T
    return {**pieces, "token": tokens, "expert": flat, "weight": weights.reshape(-1), **mats}


def fused_moe(x, w1, w2, topk_weights=None, topk_ids=None, router_logits=None, top_k=None, renormalize=True,
              w1_scale=None, w2_scale=None):
    """``y [T, H]`` exactly, in fp64 (NumPy)."""
    weights, ids = _routed(topk_weights, topk_ids, router_logits, top_k, renormalize, torch_form=False)
    x = np.asarray(x, dtype=np.float64)
    terms = expert_terms(x, np.asarray(w1), np.asarray(w2), weights, ids,
                         None if w1_scale is None else np.asarray(w1_scale, dtype=np.float64),
                         None if w2_scale is None else np.asarray(w2_scale, dtype=np.float64))
    return (terms["weight"][:, None] * terms["o"]).reshape(ids.shape[0], ids.shape[1], -1).sum(axis=1)


def fused_moe_torch(x, w1, w2, topk_weights=None, topk_ids=None, router_logits=None, top_k=None, renormalize=True,
                    w1_scale=None, w2_scale=None):
    """:func:`fused_moe` in PyTorch fp64, on the inputs' device."""
    weights, ids = _routed(topk_weights, topk_ids, router_logits, top_k, renormalize, torch_form=True)
    terms = expert_terms(x, w1, w2, weights, ids, w1_scale, w2_scale)
    return (terms["weight"][:, None] * terms["o"]).reshape(ids.shape[0], ids.shape[1], -1).sum(dim=1)
