"""The fused mixture-of-experts layer: kernel, references, rule, properties, controls.

Fast (Triton interpreter on CPU, or the GPU when the suite's backend picks it). The suite's
strategies and properties do the fuzzing (tests/test_checks.py --op fused_moe); these pin
the pieces: every dtype, routing form and weight format against the fp64 reference under the
derived rule, the alignment at row-block edges, the properties on the inputs their bugs need,
the rule's allowance for an implementation that keeps its intermediates in x's dtype.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritoncheck import backend, registry
from tritoncheck.controls import fused_moe as controls
from tritoncheck.generic import precision
from tritoncheck.kernels import fused_moe as kernel
from tritoncheck.mutants import fused_moe as mutants
from tritoncheck.properties import fused_moe as props
from tritoncheck.properties import fused_moe_tolerance as rules
from tritoncheck.references import fused_moe as refs
from tritoncheck.references.quantisation import quantise
from tritoncheck.strategies import Case

DEVICE = backend.device()
OP = registry.load()["fused_moe"]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _problem(t, h, i, e, k, dtype, seed=0, fp8: str | None = None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w1 = torch.randn(e, 2 * i, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, i, generator=g) / i**0.5
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    weights = torch.rand(t, k, generator=g)
    call = {"x": x.to(dtype), "w1": w1.to(dtype), "w2": w2.to(dtype), "topk_weights": weights, "topk_ids": ids,
            "router_logits": None, "top_k": None, "renormalize": True, "w1_scale": None, "w2_scale": None}
    if fp8:
        groups = {"expert": (None, None), "channel": (1, None), "block": (128, 128)}[fp8]
        for name in ("w1", "w2"):
            pairs = [quantise(m, torch.float8_e4m3fn, groups) for m in (w1 if name == "w1" else w2)]
            call[name] = torch.stack([q for q, _ in pairs])
            call[f"{name}_scale"] = torch.stack([s for _, s in pairs])
    return {n: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for n, v in call.items()}


def _within_rule(y, call, fn=kernel.fused_moe) -> float:
    impl = registry.Implementation.of("fused_moe", fn, kind="kernel")
    case = Case("fused_moe", str(call["x"].dtype)[6:], props.ARGS, {}, {})
    expected, inputs64 = OP.expected(case, call)
    allowed = rules.fused_moe(inputs64, expected["y"], precision(impl, case))
    err = np.abs(y.double().cpu().numpy() - expected["y"])
    ratio = float((err / allowed).max())
    assert ratio <= 1, f"max error / allowance {ratio:.3g}"
    assert (allowed < np.abs(expected["y"])).mean() > 0.5, "the allowance reaches most outputs: it checks nothing"
    return ratio


def _run(fn, call):
    return fn(*(call[a] for a in props.ARGS))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("fp8", [None, "expert", "channel", "block"])
def test_every_dtype_and_weight_format_matches_the_reference(dtype, fp8):
    """H = 150, I = 40: a short last scale block along H; E = 4, k = 2; w1 transposed in memory."""
    call = _problem(24, 150, 40, 4, 2, dtype, fp8=fp8)
    call["w1"] = call["w1"].transpose(1, 2).contiguous().transpose(1, 2)
    y = _run(kernel.fused_moe, call)
    assert y.dtype == dtype and y.shape == (24, 150)
    _within_rule(y, call)


@pytest.mark.parametrize("renormalize", [True, False])
def test_router_logits_route_as_softmax_top_k(renormalize):
    call = _problem(33, 40, 24, 6, 3, torch.float32, seed=1)
    call.update(topk_weights=None, topk_ids=None, top_k=3, renormalize=renormalize,
                router_logits=torch.randn(33, 6, device=DEVICE))
    _within_rule(_run(kernel.fused_moe, call), call)


@pytest.mark.parametrize("count", [1, 31, 32, 33, 64, 65])
def test_an_expert_at_a_row_block_edge(count):
    """Expert 0 gets exactly ``count`` tokens (k = 1), expert 1 the others, expert 2 none: the
    alignment pads each run to whole blocks of 32 (the interpreter's) or 64 rows."""
    t = 70
    call = _problem(t, 20, 12, 3, 1, torch.float32, seed=2)
    ids = torch.ones((t, 1), dtype=torch.int32)
    ids[torch.randperm(t)[:count]] = 0
    call["topk_ids"] = ids.to(DEVICE)
    _within_rule(_run(kernel.fused_moe, call), call)


def test_alignment_pads_each_expert_to_whole_blocks():
    ids = torch.tensor([[2], [0], [2], [2], [0]])
    pairs, experts = kernel._align(ids, 4, 2)
    assert experts.tolist() == [0, 2, 2]  # experts 1 and 3: no token, no block
    assert pairs.tolist() == [1, 4, 0, 2, 3, 5]  # pairs by expert, padding = 5 (T k)


def test_duplicate_ids_are_summed():
    call = _problem(9, 16, 8, 3, 2, torch.float32, seed=3)
    ids = call["topk_ids"].clone()
    ids[:, 1] = ids[:, 0]
    call["topk_ids"] = ids
    y = _run(kernel.fused_moe, call)
    _within_rule(y, call)
    once = dict(call, topk_ids=ids[:, :1].contiguous(), topk_weights=call["topk_weights"].sum(1, keepdim=True))
    torch.testing.assert_close(y, _run(kernel.fused_moe, once), rtol=1e-5, atol=1e-6)


def test_unused_experts_are_never_read():
    call = _problem(12, 16, 8, 5, 2, torch.float32, seed=4)
    call["topk_ids"] = call["topk_ids"] % 3  # experts 3 and 4 unused (duplicates allowed)
    y = _run(kernel.fused_moe, call)
    call["w1"][3:], call["w2"][3:] = float("nan"), float("nan")
    assert torch.equal(_run(kernel.fused_moe, call), y)


@pytest.mark.parametrize("fn", [controls.expert_loop, controls.sorted_grouped_fp32], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_controls_are_within_the_rule(fn, dtype):
    """expert_loop keeps every intermediate in x's dtype (vLLM's and HF's roundings): the rule
    allows it, and the allowance stays below most outputs."""
    call = _problem(24, 64, 40, 6, 3, dtype, seed=5, fp8="block" if dtype == torch.bfloat16 else None)
    _within_rule(_run(fn, call), call, fn)


def test_numpy_and_torch_references_agree_on_fp8_and_router_calls():
    call = _problem(10, 130, 20, 4, 2, torch.float32, fp8="block", seed=6)
    call.update(topk_weights=None, topk_ids=None, top_k=2, renormalize=False,
                router_logits=torch.randn(10, 4, device=DEVICE))
    num = {n: (v.double().cpu().numpy() if isinstance(v, torch.Tensor) else v) for n, v in call.items()}
    want = refs.fused_moe(*(num[a] for a in props.ARGS))
    got = refs.fused_moe_torch(*((v.double() if isinstance(v, torch.Tensor) else v) for v in
                                 (call[a] for a in props.ARGS)))
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,bad", [
    ("topk_ids", lambda c: c["topk_ids"] + 10), ("top_k", lambda c: 2), ("w1_scale", lambda c: torch.ones(1)),
    ("router_logits", lambda c: torch.randn(c["x"].shape[0], 3, device=DEVICE))])
def test_bad_input_names_the_argument(name, bad):
    call = _problem(4, 8, 4, 3, 2, torch.float32)
    call[name] = bad(call)
    with pytest.raises((ValueError, TypeError), match=name):
        _run(kernel.fused_moe, call)


def test_the_bf16_accumulation_mutant_breaks_the_fp16_rule():
    """H = 300: three steps of 128 (five of 64 on a GPU) rounded to bf16, where float16's rule
    allows g and v their own rounding to float16 (2^-11) and fp32 sums (float32 x would be
    checked against tf32 dots on a GPU, 2^-10 of S)."""
    call = _problem(20, 300, 16, 3, 2, torch.float16, seed=7)
    with pytest.raises(AssertionError, match="allowance"):
        _within_rule(_run(mutants.accumulate_in_bf16, call), call)


def test_the_unpadded_expert_offset_mutant_is_wrong():
    call = _problem(40, 16, 8, 4, 2, torch.float32, seed=8)
    with pytest.raises(AssertionError, match="allowance"):
        _within_rule(_run(mutants.expert_offset_unpadded, call), call)
