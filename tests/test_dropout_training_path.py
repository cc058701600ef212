"""Attention's dropout checked on the training path (properties/attention_dropout.py).

Plain-PyTorch implementations with one planted bug each, built on the correct control
``naive_torch``: the new checks must fail them and say why, and an implementation that
cannot return its keep mask must still get the mask's statistical checks, on the mask
recovered from its training call.
"""
import pytest
import torch
from hypothesis import given, settings

from tritoncheck import backend, registry, selfcheck
from tritoncheck.controls.attention import naive_torch
from tritoncheck.properties import attention_dropout
from tritoncheck.references.attention import visible_pairs

OP = registry.load()["attention"]
CHECKS = {c.name: c for c in OP.checks}
EXAMPLES = 10  # every bug below shows on the first case with dropout_p > 0


def dropout_only_with_keep(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0,
                           dropout_p=0.0, seed=0, return_keep=False):
    """naive_torch that drops nothing unless the mask is asked for: the training call
    (return_keep=False) runs without dropout."""
    return naive_torch(q, k, v, causal, sm_scale, window, alibi_slopes, softcap, dropout_p if return_keep else 0.0,
                       seed, return_keep)


def backward_without_rescale(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0,
                             dropout_p=0.0, seed=0, return_keep=False):
    """naive_torch with the right forward and the backward of (P * keep) V: the gradients
    are (1 - p) times right (o's value is kept, o - o.detach() is exactly 0; only the
    gradient through it is scaled)."""
    o, *rest = naive_torch(q, k, v, causal, sm_scale, window, alibi_slopes, softcap, dropout_p, seed, return_keep)
    return (o.detach() + (1.0 - dropout_p) * (o - o.detach()), *rest)


def training_only(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0,
                  dropout_p=0.0, seed=0):
    """naive_torch without return_keep: an implementation that cannot return its mask."""
    return naive_torch(q, k, v, causal, sm_scale, window, alibi_slopes, softcap, dropout_p, seed)


def training_only_heads_share_mask(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None,
                                   softcap=0.0, dropout_p=0.0, seed=0):
    """training_only called head by head with the same seed: every head draws the same mask."""
    group = q.shape[1] // k.shape[1]
    heads = [naive_torch(q[:, h:h + 1], k[:, h // group:h // group + 1], v[:, h // group:h // group + 1], causal,
                         sm_scale, window, None if alibi_slopes is None else alibi_slopes[..., h:h + 1], softcap,
                         dropout_p, seed) for h in range(q.shape[1])]
    return torch.cat([o for o, _ in heads], dim=1), torch.cat([lse for _, lse in heads], dim=1)


for _fn in (dropout_only_with_keep, backward_without_rescale, training_only, training_only_heads_share_mask):
    _fn.uses_triton = False


def _implementation(fn) -> registry.Implementation:
    return registry.Implementation.of("attention", fn, kind="user")


def _hunt(fn, check: str, dtype=torch.float32, examples: int = EXAMPLES) -> selfcheck.Verdict:
    impl = _implementation(fn)
    reason = selfcheck.runnable(OP, impl, CHECKS[check], dtype)
    assert reason is None, reason
    return selfcheck.hunt(OP, impl, CHECKS[check], dtype, examples)


def test_training_call_without_dropout_fails_naming_the_training_path():
    verdict = _hunt(dropout_only_with_keep, "dropout_training_call_equals_keep_call")
    assert verdict.failed
    assert "the training call (return_keep=False) differs from the return_keep=True call" in verdict.text
    assert "the training call applies no dropout" in verdict.text


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_unscaled_backward_fails_naming_the_missing_factor(dtype):
    verdict = _hunt(backward_without_rescale, "dropout_gradients_match_reference", dtype)
    assert verdict.failed
    assert "the gradient is off by 1/(1-p)" in verdict.text
    assert "leaves out the kept weights' 1 / (1 - p) scale" in verdict.text


def test_the_old_mask_checks_miss_both_bugs():
    """Why the new checks exist: each bug passes the check of the returned mask that looks
    closest to it (o against the reference given the mask; dv zero where the mask drops)."""
    assert not _hunt(dropout_only_with_keep, "dropout_matches_reference", examples=4).failed
    assert not _hunt(backward_without_rescale, "dropout_gradient_uses_keep", examples=4).failed


def test_an_implementation_without_return_keep_gets_the_mask_checks_on_its_training_call():
    impl = _implementation(training_only)
    for name in ("dropout_seed_reproducible", "dropout_keep_iid", "dropout_matches_reference",
                 "dropout_gradient_uses_keep", "dropout_gradients_match_reference"):
        assert selfcheck.runnable(OP, impl, CHECKS[name], torch.float32) is None, name
        verdict = selfcheck.hunt(OP, impl, CHECKS[name], torch.float32, 4)
        assert not verdict.failed, f"{name}: {verdict.text}"
    reason = selfcheck.runnable(OP, impl, CHECKS["dropout_training_call_equals_keep_call"], torch.float32)
    assert reason is not None and "takes no" in reason and "return_keep" in reason


def test_the_recovered_mask_shows_heads_sharing_one():
    verdict = _hunt(training_only_heads_share_mask, "dropout_keep_iid")
    assert verdict.failed and "agreements of heads 2t and 2t + 1" in verdict.text


@settings(max_examples=8, deadline=None)
@given(case=CHECKS["dropout_keep_iid"].cases(OP, torch.float16))
def test_recovered_mask_is_the_returned_one(case):
    """naive_torch's mask read off its training call equals the one it returns, at every
    visible pair (outside the band the mask is unspecified and reads False)."""
    values = case.materialise(backend.device())
    returned = naive_torch(*(values[a] for a in case.args))[2].cpu()
    recovered = attention_dropout._recovered_keep(case, _implementation(training_only), values)
    visible = torch.from_numpy(visible_pairs(values["q"].shape[-2], values["k"].shape[-2], case.params["causal"],
                                             tuple(case.params["window"]))).expand_as(returned)
    assert torch.equal(recovered[visible], returned[visible])
    assert not recovered[~visible].any()
