"""What a kernel declares about itself is validated, and declared limits steer every
check's strategy: no drawn case lies outside them."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritoncheck import refusals, registry
from tritoncheck.declarations import ExpectedFailure
from tritoncheck.harness import Target
from tritoncheck.limits import Limits, OutsideLimits

OPS = registry.load()


def kernel(**attributes):
    def fn(*args, **kwargs):
        raise AssertionError("not called")
    for name, value in attributes.items():
        setattr(fn, name, value)
    return fn


def impl(op="softmax", **attributes):
    return registry.Implementation.of(op, kernel(**attributes), name="k")


@pytest.mark.parametrize("attributes, error, words", [
    ({"supports_backwards": False}, ValueError, "did you mean 'supports_backward'"),
    ({"dtype": (torch.float16,)}, ValueError, "did you mean 'dtypes'"),
    ({"fp32_dot_precision": "IEEE"}, ValueError, "'tf32', 'tf32x3', 'ieee'"),
    ({"rms_norm_cast": "before_weight"}, ValueError, "a declaration of add_rms_norm, rms_norm, not of softmax"),
    ({"supports_backward": "no"}, TypeError, "supports_backward must be True or False"),
    ({"dtypes": (torch.float64,)}, ValueError, "not dtypes of softmax"),
    ({"expected_failures": {"determinstic": "atomics"}}, ValueError, "did you mean 'deterministic'"),
    ({"expected_failures": {("deterministic", "cpu"): "x"}}, ValueError, "nor backends"),
    ({"expected_failures": {"deterministic": ""}}, ValueError, "non-empty"),
    ({"limits": {"max_sizes": {"N": 4}}}, ValueError, "did you mean 'max_size'"),
    ({"limits": {"N": 4}}, ValueError, "'max_size': {'N': n}"),
    ({"limits": {"max_size": {"n": 4}}}, ValueError, "did you mean 'N'"),
    ({"limits": {"max_size": {"N": 0}}}, ValueError, "an int >= 1"),
    ({"limits": {"sizes": {"N": 64}}}, ValueError, "non-empty tuple"),
    ({"limits": {"values": {"temperature": (3.0,)}}}, ValueError, "from (1.0, 0.5"),
    ({"limits": {"same_dtype": ("y",)}}, ValueError, "not a tensor argument"),
    ({"limits": {"min_size": {"N": 9}, "max_size": {"N": 8}}}, ValueError, "exceeds"),
    ({"limits": ["N"]}, TypeError, "must be a dict"),
])
def test_bad_declarations_are_errors_that_name_the_fix(attributes, error, words):
    with pytest.raises(error, match=None) as info:
        impl(**attributes)
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("op, attributes, error, words", [
    ("rms_norm", {"rms_norm_cast": "llama"}, ValueError, "'after_weight', 'before_weight'"),
    ("rms_norm", {"rms_norm_casts": "before_weight"}, ValueError, "did you mean 'rms_norm_cast'"),
    ("rms_norm", {"batch_invariant": "yes"}, TypeError, "batch_invariant must be True or False"),
    ("rms_norm", {"batch_invariants": True}, ValueError, "did you mean 'batch_invariant'"),
    ("linear_attention", {"chunk_sizes": (0,)}, ValueError, "chunk_sizes"),
])
def test_an_ops_own_declarations_are_validated_on_its_implementations(op, attributes, error, words):
    """rms_norm_cast, chunk_sizes, batch_invariant: listed on their ops' records
    (OpSpec.declarations), validated and spell-checked there, errors elsewhere."""
    with pytest.raises(error) as info:
        impl(op, **attributes)
    assert words in str(info.value), str(info.value)


def test_attention_vocabulary_hints():
    with pytest.raises(ValueError, match=r"a scalar argument: write \{'values': \{'causal'"):
        impl("attention", limits={"causal": (True,)})


def test_a_kernels_own_attributes_are_left_alone():
    assert impl(dot_precisions={"float32": "ieee"}, max_head_dim=128).name == "k"


def test_expected_failures_are_scoped():
    k = impl(expected_failures={("deterministic", "cuda"): "atomics",
                                ("matches_reference", "bfloat16", "interpret"): "truncating stores",
                                "rows_sum_to_one": "everywhere"})
    assert k.expected_failure("deterministic", torch.float32) is None  # this run is not CUDA
    assert k.expected_failure("matches_reference", torch.bfloat16).reason == "truncating stores"
    assert k.expected_failure("matches_reference", torch.float16) is None
    assert k.expected_failure("rows_sum_to_one", torch.float16).reason == "everywhere"
    direct = impl(expected_failures=(ExpectedFailure("deterministic", "flaky", backends=("interpret",),
                                                     strict=False),))
    assert direct.expected_failure("deterministic", torch.float32).strict is False


def _cases(op_name: str, check, limits: dict, dtype=torch.float16):
    k = registry.Implementation.of(op_name, kernel(limits=limits), name="k")
    dtype = dtype if dtype in OPS[op_name].dtypes else OPS[op_name].dtypes[0]  # scaled_mm's are input formats
    return Target(OPS[op_name], k, dtype, check), k.limits


def _draws_inside(op, check, strategy, limits) -> None:
    @settings(max_examples=4, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def inside(data):
        case = data.draw(strategy)
        assert limits.excludes(op, case) is None, f"{check.name}: {limits.excludes(op, case)}"

    inside()


def _assert_inside(op_name, limits_decl):
    op = OPS[op_name]
    for check in op.checks:
        target, limits = _cases(op_name, check, limits_decl)
        try:
            _draws_inside(op, check, target.strategy(), limits)
        except OutsideLimits:
            continue  # the check needs cases these limits exclude: skipped with that reason


def _each_op_first_on_every_commit(names_of) -> list:
    """(op, name) for every op and each of its names, the op's first on every commit and the
    others ``slow`` (tests/conftest.py): drawing every check's cases of an attention-like op
    costs seconds a name, and one name per op exercises the op's strategy on every commit."""
    return [pytest.param(o, n, marks=[] if i == 0 else [pytest.mark.slow])
            for o in sorted(OPS) for i, n in enumerate(names_of(OPS[o]))]


@pytest.mark.parametrize("op_name, dim", _each_op_first_on_every_commit(lambda op: op.dims))
def test_size_limits_steer_every_check(op_name, dim):
    _assert_inside(op_name, {"max_size": {dim: 4}})
    _assert_inside(op_name, {"sizes": {dim: (4,)}})


@pytest.mark.parametrize("op_name, arg", _each_op_first_on_every_commit(lambda op: op.choices))
def test_value_limits_steer_every_check(op_name, arg):
    _assert_inside(op_name, {"values": {arg: OPS[op_name].choices[arg][-1:]}})


@pytest.mark.parametrize("op_name", sorted(OPS))
def test_dtype_and_layout_limits_steer_every_check(op_name):
    tensors = OPS[op_name].tensor_arguments
    _assert_inside(op_name, {"contiguous": True, "same_dtype": tensors})


def _raise(exc):
    raise exc


def test_what_a_refusal_is():
    def refuses(x):
        raise ValueError("x: too long")

    with pytest.raises(refusals.Refused, match="ValueError: x: too long") as info:
        refusals.call(refuses, [1], {})
    assert not info.value.declared  # a ValueError alone says nothing about intent
    for exc in (AssertionError("wrong"), RuntimeError("CUDA error: misaligned address"), KeyError("k")):
        with pytest.raises(type(exc)):
            refusals.call(lambda x, e=exc: _raise(e), [1], {})
    with pytest.raises(TypeError):  # a signature that does not take the contract's arguments
        refusals.call(lambda x: x, [1, 2], {})


def test_a_declared_refusal_is_a_refusal_class_or_a_declared_message():
    def raises_refusal(x):
        raise refusals.Refusal("x: rows past 64")

    def raises_declared(x):
        raise RuntimeError("FlashAttention only supports head dimension at most 256")

    raises_declared.refuses = (RuntimeError, r"only supports head dimension")

    def raises_other(x):
        raise TypeError("softmax() got an unexpected keyword argument 'dtpye'")

    raises_other.refuses = r"rows of \d+ elements"
    for fn, declared in ((raises_refusal, True), (raises_declared, True), (raises_other, False)):
        with pytest.raises(refusals.Refused) as info:
            refusals.call(fn, [1], {})
        assert info.value.declared is declared, fn.__name__


def test_a_declared_refusal_raised_in_backward_is_a_refusal_and_an_undeclared_one_is_not():
    """fla's chunked gated delta rule raises in its backward only (a guard against a Triton
    miscompilation on Hopper): the gradient checks call autograd through refusals.gradients,
    which honours the declaration as refusals.call does for the forward."""
    class GuardedBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, dy):
            raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for chunk_bwd")

    def kernel(x):
        return GuardedBackward.apply(x)

    x = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="incorrect results"):  # undeclared: the failure it is
        refusals.gradients(kernel, [kernel(x)], [x], [torch.ones(3)])
    kernel.refuses = ((RuntimeError, r"chunk_bwd"),)
    with pytest.raises(refusals.Refused) as info:
        refusals.gradients(kernel, [kernel(x)], [x], [torch.ones(3)])
    assert info.value.declared and "chunk_bwd" in info.value.message
    (grad,) = refusals.gradients(lambda x: x * 2, [x * 2], [x], [torch.ones(3)])
    assert torch.equal(grad, torch.full((3,), 2.0))


@pytest.mark.parametrize("value,words", [
    (".*", "matches any message"), ((AssertionError, "x"), "never a refusal"), (3, "must be a message pattern"),
    ("(", "not a regular expression")])
def test_a_bad_refuses_declaration_is_an_error_naming_it(value, words):
    def kernel(x, temperature=1.0):
        return x

    kernel.refuses = value
    with pytest.raises((TypeError, ValueError), match=words):
        registry.Implementation.of("softmax", kernel, name="kernel")


def test_an_error_inside_triton_is_not_a_refusal():
    import triton
    import triton.language as tl

    @triton.jit
    def broken(X, N: tl.constexpr):
        tl.store(X + tl.arange(0, N), 1.0)

    def wrapper(x):
        broken[(1,)](x, N=3)  # not a power of two: Triton raises inside its own code
        return x

    with pytest.raises(Exception) as info:
        refusals.call(wrapper, [torch.zeros(4)], {})
    assert not isinstance(info.value, refusals.Refused), info.value


def test_messages_are_deduplicated_up_to_their_numbers():
    text = refusals.summarise({"ValueError: rows of 1024": 3, "ValueError: rows of 2049": 2, "TypeError: fp32": 1})
    assert text == "5x ValueError: rows of 1024 (and 1 variant(s)); 1x TypeError: fp32"


def test_limits_describe():
    limits = Limits.parse(OPS["attention"], {"sizes": {"D": (128, 64)}, "values": {"causal": (True,)},
                                             "max_size": {"Nq": 4096}, "contiguous": True}, "fa")
    assert limits.describe() == "Nq <= 4096; D in [64, 128]; causal in [True]; q, k, v, alibi_slopes contiguous"


def test_the_documented_declarations_are_valid():
    """docs/declarations.md's attribute examples load, and its expected failure
    (deterministic, scoped to CUDA) does not apply on the interpreter, where the check must pass."""
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "docs" / "declarations.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if ".limits" in b]
    assert len(blocks) == 2, "docs/declarations.md: the attributes example and the limits example"
    namespace = {"torch": torch}
    exec("def flash_attention(q, k, v, causal=False, sm_scale=None): ...\ndef rope(x, cos, sin): ...\n"
         + "\n".join(blocks), namespace)
    softmax = registry.Implementation.of("softmax", namespace["softmax"])
    assert softmax.expected_failure("deterministic", torch.float16) is None
    assert registry.Implementation.of("attention", namespace["flash_attention"]).limits
    assert registry.Implementation.of("rope", namespace["rope"]).limits.same_dtype == ("cos", "sin")
    assert registry.Implementation.of("rms_norm", namespace["rms_norm"]).fn.rms_norm_cast == "before_weight"
    flash = registry.Implementation.of("attention", namespace["flash_attn_func"])
    assert flash.returns == ("o",) and flash.calling.layout == "bnhd"
    assert flash.calling.names["sm_scale"] == "softmax_scale" and not flash.calling.takes("window")
