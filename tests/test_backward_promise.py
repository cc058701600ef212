"""An implementation that does not declare ``supports_backward = False`` promises a
gradient on every input: an output without ``grad_fn`` fails the checks that use the
backward, it does not skip them."""
import pytest
import torch

from tritoncheck import registry
from tritoncheck.strategies import Case, TensorSpec

OPS = registry.load()


def _detached_long_rows(x, temperature=1.0):
    """Plain softmax that drops autograd for rows longer than 4 (the planted bug's shape)."""
    src = x.detach() if x.shape[-1] > 4 else x
    return torch.softmax(src.float() / temperature, dim=-1).to(x.dtype)


_detached_long_rows.uses_triton = False


def _softmax_case(n: int) -> Case:
    return Case("softmax", "float32", ("x", "temperature"),
                {"x": TensorSpec((3, n), "float32", seed=1), "dy": TensorSpec((3, n), "float32", seed=2)},
                {"temperature": 1.0})


def _check(op: str, name: str) -> registry.Check:
    return {c.name: c for c in OPS[op].checks}[name]


@pytest.mark.parametrize("check", ["gradients_match_reference", "deterministic"])
def test_missing_grad_fn_fails_and_says_how_to_declare(check):
    impl = registry.Implementation.of("softmax", _detached_long_rows)
    _check("softmax", check).run(_softmax_case(4), impl)  # short rows: differentiable, passes
    with pytest.raises(AssertionError, match=r"carries no grad_fn.*supports_backward = False"):
        _check("softmax", check).run(_softmax_case(9), impl)


def test_declared_forward_only_skips_gradient_checks_at_collection():
    def forward_only(x, temperature=1.0):
        return torch.softmax(x.detach().float() / temperature, dim=-1).to(x.dtype)

    forward_only.supports_backward = False
    impl = registry.Implementation.of("softmax", forward_only)
    reason = _check("softmax", "gradients_match_reference").requires(impl)
    assert reason and "supports_backward = False" in reason
    _check("softmax", "deterministic").run(_softmax_case(9), impl)  # forward half only, passes


@pytest.mark.filterwarnings("ignore:Using `assume` outside")  # the check's assume(ignored.any()) holds here
def test_cross_entropy_ignored_rows_need_a_gradient():
    def detached_loss(logits, target, ignore_index=-100):
        return torch.nn.functional.cross_entropy(logits.detach().float(), target, ignore_index=ignore_index,
                                                 reduction="none")

    detached_loss.uses_triton = False
    case = Case("cross_entropy", "float32", ("logits", "target", "ignore_index"),
                {"logits": TensorSpec((4, 7), "float32", seed=3),
                 "target": TensorSpec((4,), "int64", family="indices", scale=7.0, seed=4, injections=((1, -100.0),)),
                 "dloss": TensorSpec((4,), "float32", seed=5)},
                {"ignore_index": -100})
    impl = registry.Implementation.of("cross_entropy", detached_loss)
    with pytest.raises(AssertionError, match="carries no grad_fn"):
        _check("cross_entropy", "ignored_rows_zero").run(case, impl)
