"""Plain-PyTorch controls for the fused mixture-of-experts layer, as a user would write them;
the suite must pass them.

``expert_loop`` is Hugging Face's Mixtral block: the routing in float32 (softmax, topk,
renormalised) cast to x's dtype, then a loop over the experts that some slot names, each
taking its tokens with ``torch.where`` on the routing, ``F.silu(x W_gate^T) * (x W_up^T)``
and ``W2`` in x's dtype (fp8 weights dequantised and multiplied in float32, the products
rounded to x's dtype), weighted in x's dtype, added into y with ``index_add_`` in x's dtype. ``sorted_grouped_fp32`` sorts the (token, slot) pairs by
expert, splits them into one group per expert (the grouped-GEMM layout, MegaBlocks' dropless
path in plain PyTorch), computes each group in float32, weights it in float32, sums the k
slots of each token in float32 and rounds y once. Both read only the experts some slot names.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tritoncheck.declarations import ExpectedFailure
from tritoncheck.references.fused_moe import weight_groups
from tritoncheck.references.quantisation import expand

__all__ = ["expert_loop", "sorted_grouped_fp32"]


def _routing(topk_weights, topk_ids, router_logits, top_k, renormalize) -> tuple[torch.Tensor, torch.Tensor]:
    if router_logits is None:
        return topk_weights.float(), topk_ids.long()
    p = torch.softmax(router_logits.float(), dim=1)
    weights, ids = torch.topk(p, top_k, dim=1)
    if renormalize:
        weights = weights / weights.sum(dim=1, keepdim=True)
    return weights, ids


def _project(xs: torch.Tensor, w: torch.Tensor, scale, e: int, dtype: torch.dtype) -> torch.Tensor:
    """``xs @ W[e]^T`` in ``dtype``: W[e] as it is, or (fp8) dequantised in float32 and
    multiplied in float32, the product rounded to ``dtype``."""
    if scale is None:
        return xs.to(dtype) @ w[e].to(dtype).T
    s = expand(scale[e], tuple(w.shape[1:]), weight_groups(tuple(scale.shape[1:]), tuple(w.shape[1:])))
    return (xs.float() @ (w[e].float() * s).T).to(dtype)


def expert_loop(x, w1, w2, topk_weights=None, topk_ids=None, router_logits=None, top_k=None, renormalize=True,
                w1_scale=None, w2_scale=None):
    weights, ids = _routing(topk_weights, topk_ids, router_logits, top_k, renormalize)
    weights = weights.to(x.dtype)
    inter = w2.shape[2]
    y = torch.zeros_like(x, memory_format=torch.contiguous_format)
    for e in torch.unique(ids).tolist():
        token, slot = torch.where(ids == e)
        gate_up = _project(x[token], w1, w1_scale, e, x.dtype)
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out = _project(h, w2, w2_scale, e, x.dtype) * weights[token, slot, None]
        y.index_add_(0, token, out)
    return y


def sorted_grouped_fp32(x, w1, w2, topk_weights=None, topk_ids=None, router_logits=None, top_k=None,
                        renormalize=True, w1_scale=None, w2_scale=None):
    weights, ids = _routing(topk_weights, topk_ids, router_logits, top_k, renormalize)
    t, k = ids.shape
    inter = w2.shape[2]
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w1.shape[0]).tolist()
    out = torch.zeros((t * k, x.shape[1]), dtype=torch.float32, device=x.device)
    for e, pairs in enumerate(torch.split(order, counts)):
        if pairs.numel() == 0:
            continue
        xs = x[pairs // k].float()
        gate_up = _project(xs, w1, w1_scale, e, torch.float32)
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out[pairs] = _project(h, w2, w2_scale, e, torch.float32) * weights.flatten()[pairs, None]
    return out.view(t, k, -1).sum(dim=1).to(x.dtype)


for _fn in (expert_loop, sorted_grouped_fp32):
    _fn.dtypes = (torch.float32, torch.float16, torch.bfloat16)
    _fn.supports_backward = False
    _fn.uses_triton = False

# Registry data (tritoncheck/registry.py): checks a control is expected to fail, with why.
expert_loop.expected_failures = (
    ExpectedFailure("unused_experts_never_read", (
        "on CUDA, index_add_ adds the experts' outputs into y with atomics in x's dtype: two calls "
        "differ in the last bits whatever the weights (seen on an H200 in float16: 1146 of 104832 "
        "elements), and the property compares the two calls bit for bit"), backends=("cuda",), strict=False),
)
