"""Invalid calls of every project kernel, generated: each is refused with a
``ValueError`` or ``TypeError`` whose message names the argument at fault.

A valid call is built from a few drawn sizes, then exactly one argument is spoiled
(a non-tensor, an unsupported dtype, a wrong rank, a shape that disagrees with
another argument, a tensor on another device, a scalar outside the contract's
domain). Anything else is a defect of the wrapper: a result computed from garbage,
an error that does not say which argument is wrong, another exception type, or (on
CUDA) a context that the call left broken.
"""
from __future__ import annotations

import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritoncheck import backend, registry

DEVICE = backend.device()
ROOT = Path(__file__).resolve().parents[1]
OTHER_DEVICE = torch.device("meta")  # a device no kernel runs on, on every machine


@dataclass(frozen=True)
class Spoiler:
    """One way to make one argument of a valid call invalid."""

    argument: str
    how: str
    spoil: Callable[[dict[str, Any]], Any]  # valid arguments -> the spoiled value of ``argument``


def _tensor(shape, dtype=torch.float32):
    return torch.randn(shape, device=DEVICE).to(dtype)


def _valid(op: str, dims: dict[str, int]) -> dict[str, Any]:
    """A small valid call of ``op`` (arguments by contract name) from drawn sizes."""
    b, h, n, m, d = dims["b"], dims["h"], dims["n"], dims["m"], dims["d"]
    if op == "softmax":
        return {"x": _tensor((b, n)), "temperature": 0.7}
    if op == "layer_norm":
        return {"x": _tensor((b, n)), "weight": _tensor((n,)), "bias": _tensor((n,)), "eps": 1e-5}
    if op == "dropout_residual_layer_norm":
        return {"x": _tensor((b, n)), "residual": _tensor((b, n)), "weight": _tensor((n,)),
                "bias": _tensor((n,)), "p": 0.25, "seed": 7, "eps": 1e-5}
    if op == "attention":
        return {"q": _tensor((b, h, n, d)), "k": _tensor((b, h, m, d)), "v": _tensor((b, h, m, d)),
                "causal": False, "sm_scale": None, "window": (-1, -1), "alibi_slopes": _tensor((b, h)),
                "softcap": 0.0, "dropout_p": 0.25, "seed": 7, "return_keep": False}
    if op == "linear_attention":
        return {"q": _tensor((b, h, n, d)).abs(), "k": _tensor((b, h, n, d)).abs(),
                "v": _tensor((b, h, n, d + 1)), "causal": False, "eps": 1e-6}
    if op == "elu_feature_map":
        return {"x": _tensor((b, n))}
    if op == "cross_entropy":
        return {"logits": _tensor((b, n)), "target": torch.randint(0, n, (b,), device=DEVICE),
                "ignore_index": -100}
    if op == "rope":
        return {"x": _tensor((b, h, n, 2 * d)), "cos": _tensor((n, d)), "sin": _tensor((n, d))}
    if op == "swiglu":
        return {"gate": _tensor((b, n)), "up": _tensor((b, n))}
    raise AssertionError(f"no valid call written for op {op!r}: add one here")


def _drop_dim(t):
    return t[0]


def _widen_last(t):
    return torch.cat([t, t[..., :1]], dim=-1)


def _tensor_spoilers(name: str, *, fixed_rank: bool, integer: bool = False) -> list[Spoiler]:
    """What can go wrong with any tensor argument."""
    out = [
        Spoiler(name, "a list instead of a tensor", lambda a: a[name].tolist()),
        Spoiler(name, "None", lambda a: None),
        Spoiler(name, "on another device", lambda a: torch.empty_like(a[name], device=OTHER_DEVICE)),
    ]
    if integer:
        out.append(Spoiler(name, "a float tensor", lambda a: a[name].float()))
    else:
        out += [Spoiler(name, "an int32 tensor", lambda a: a[name].to(torch.int32)),
                Spoiler(name, "a bool tensor", lambda a: a[name] > 0)]
    if fixed_rank:
        out.append(Spoiler(name, "one dim fewer", lambda a: _drop_dim(a[name])))
        out.append(Spoiler(name, "one dim more", lambda a: a[name].unsqueeze(0)))
    return out


def _scalar_spoilers(name: str, values: list[Any]) -> list[Spoiler]:
    return [Spoiler(name, f"{name}={v!r}", lambda a, v=v: v) for v in values]


NON_POSITIVE = [0.0, -1.0, math.nan, math.inf, -math.inf]

SPOILERS: dict[str, list[Spoiler]] = {
    "softmax": _tensor_spoilers("x", fixed_rank=False) + _scalar_spoilers("temperature", NON_POSITIVE + ["hot"]),
    "layer_norm": (
        _tensor_spoilers("x", fixed_rank=False)
        + _tensor_spoilers("weight", fixed_rank=True) + _tensor_spoilers("bias", fixed_rank=True)
        + [Spoiler("weight", "one element more than x's last dim", lambda a: _widen_last(a["weight"])),
           Spoiler("bias", "one element more than x's last dim", lambda a: _widen_last(a["bias"]))]
        + _scalar_spoilers("eps", [-1e-5, math.nan, math.inf, "small"])),
    "dropout_residual_layer_norm": (
        _tensor_spoilers("x", fixed_rank=False) + _tensor_spoilers("residual", fixed_rank=False)
        + _tensor_spoilers("weight", fixed_rank=True)
        + [Spoiler("residual", "a longer last dim than x", lambda a: _widen_last(a["residual"])),
           Spoiler("bias", "one element more than x's last dim", lambda a: _widen_last(a["bias"]))]
        + _scalar_spoilers("p", [-0.1, 1.0, 1.5, math.nan, "half"])
        + _scalar_spoilers("seed", [1.5, "seven", None])
        + _scalar_spoilers("eps", [-1e-5, math.nan])),
    "attention": (
        _tensor_spoilers("q", fixed_rank=True) + _tensor_spoilers("k", fixed_rank=True)
        + _tensor_spoilers("v", fixed_rank=True)
        + [Spoiler("k", "a head dim other than q's", lambda a: _widen_last(a["k"])),
           Spoiler("v", "another key count than k", lambda a: torch.cat([a["v"], a["v"][:, :, :1]], dim=2)),
           Spoiler("k", "another batch than q", lambda a: torch.cat([a["k"], a["k"]], dim=0)),
           Spoiler("v", "float16 while q is float32", lambda a: a["v"].half()),
           Spoiler("k", "a head count that does not divide q's", lambda a: torch.cat([a["k"], a["k"][:, :1]], dim=1)),
           Spoiler("v", "another head count than k", lambda a: torch.cat([a["v"], a["v"][:, :1]], dim=1))]
        + _scalar_spoilers("sm_scale", [0.0, -0.5, math.nan, math.inf, "auto"])
        + _scalar_spoilers("causal", ["yes"])
        + _scalar_spoilers("window", [4, (2.0, 0), (-2, 0), (1, 2, 3), "wide"])
        + [Spoiler("alibi_slopes", "a list instead of a tensor", lambda a: a["alibi_slopes"].tolist()),
           Spoiler("alibi_slopes", "float16", lambda a: a["alibi_slopes"].half()),
           Spoiler("alibi_slopes", "one head more than q", lambda a: _widen_last(a["alibi_slopes"])),
           Spoiler("alibi_slopes", "on another device", lambda a: torch.empty_like(a["alibi_slopes"],
                                                                                    device=OTHER_DEVICE))]
        + _scalar_spoilers("softcap", [-1.0, math.nan, math.inf, "30"])
        + _scalar_spoilers("dropout_p", [-0.1, 1.0, 1.5, math.nan, math.inf, "half", True, None])
        + _scalar_spoilers("seed", [1.5, "seven", None, -1, 2**63, True])
        + _scalar_spoilers("return_keep", ["yes", 1, None])),
    "linear_attention": (
        _tensor_spoilers("q", fixed_rank=True) + _tensor_spoilers("k", fixed_rank=True)
        + _tensor_spoilers("v", fixed_rank=True)
        + [Spoiler("k", "a head dim other than q's", lambda a: _widen_last(a["k"])),
           Spoiler("v", "another length than q", lambda a: torch.cat([a["v"], a["v"][:, :, :1]], dim=2))]
        + _scalar_spoilers("eps", [-1e-6, math.nan, "tiny"]) + _scalar_spoilers("causal", ["yes"])),
    "elu_feature_map": _tensor_spoilers("x", fixed_rank=False),
    "cross_entropy": (
        _tensor_spoilers("logits", fixed_rank=True) + _tensor_spoilers("target", fixed_rank=True, integer=True)
        + [Spoiler("target", "one row more than logits", lambda a: torch.cat([a["target"], a["target"][:1]])),
           Spoiler("target", "a class index equal to V", lambda a: torch.full_like(a["target"], a["logits"].shape[1])),
           Spoiler("target", "a negative class index", lambda a: torch.full_like(a["target"], -3))]
        + _scalar_spoilers("ignore_index", [1.5, "none"])),
    "rope": (
        _tensor_spoilers("x", fixed_rank=True) + _tensor_spoilers("cos", fixed_rank=True)
        + _tensor_spoilers("sin", fixed_rank=True)
        + [Spoiler("x", "an odd head dim", lambda a: a["x"][..., :-1]),
           Spoiler("cos", "one position more than x", lambda a: torch.cat([a["cos"], a["cos"][:1]])),
           Spoiler("sin", "a wider table than D // 2", lambda a: _widen_last(a["sin"]))]),
    "swiglu": (
        _tensor_spoilers("gate", fixed_rank=False) + _tensor_spoilers("up", fixed_rank=False)
        + [Spoiler("up", "another shape than gate", lambda a: _widen_last(a["up"])),
           Spoiler("up", "float16 while gate is float32", lambda a: a["up"].half())]),
}


def test_every_op_of_the_registry_has_invalid_calls():
    assert set(SPOILERS) == set(registry.load()), "add spoilers for the new op above"


def _call(op: str, args: dict[str, Any]):
    spec = registry.OPS[op]
    kernel = registry.resolve(spec.kernel)
    return kernel(*(args[a] for a in spec.arguments))


def _names(message: str, argument: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(argument)}(?![A-Za-z0-9_])", message) is not None


@st.composite
def invalid_calls(draw):
    op = draw(st.sampled_from(sorted(SPOILERS)))
    dims = {"b": draw(st.integers(1, 3)), "h": draw(st.integers(1, 2)), "n": draw(st.integers(2, 40)),
            "m": draw(st.integers(2, 40)), "d": draw(st.sampled_from((4, 8, 16)))}
    return op, dims, draw(st.sampled_from(SPOILERS[op]))


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(invalid_calls())
def test_an_invalid_call_is_refused_naming_the_argument(call):
    op, dims, spoiler = call
    registry.load()
    args = _valid(op, dims)
    args[spoiler.argument] = spoiler.spoil(args)
    with pytest.raises((ValueError, TypeError)) as raised:
        _call(op, args)
    message = str(raised.value)
    assert _names(message, spoiler.argument), (
        f"{op} with {spoiler.argument} {spoiler.how}: the {type(raised.value).__name__} does not name "
        f"{spoiler.argument!r}: {message!r}")
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()  # raises if the refused call still broke the context


@pytest.mark.parametrize("op", sorted(SPOILERS))
def test_the_valid_calls_above_are_accepted(op):
    """The spoilers spoil a call that is otherwise valid: without them it runs."""
    registry.load()
    dims = {"b": 2, "h": 2, "n": 9, "m": 11, "d": 8}
    _call(op, _valid(op, dims))


# ------------------------------------------------------------ the suite's own options

@pytest.mark.parametrize("options, words", [
    (["--op", "nope"], "--op nope: unknown"),
    (["--dtype", "float64"], "--dtype float64"),
    (["--dtype", "fp16"], "unknown dtype 'fp16'"),
    (["--impl", "softmax"], "expected OP=package.module:function"),
    (["--impl", "nope=tritoncheck.controls.softmax:torch_softmax"], "unknown op 'nope'"),
    (["--impl", "softmax=no_such_module:f"], "cannot import 'no_such_module'"),
    (["--impl", "softmax=tritoncheck.controls.softmax:torch_softmax", "--op", "rope"], "selects none of the ops"),
    (["--hypothesis-profile", "nope"], "--hypothesis-profile 'nope': unknown"),
    (["--max-examples", "0"], "--max-examples 0"),
    (["--report-dir", "/proc/no-such-dir"], "--report-dir '/proc/no-such-dir': cannot write there"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_bad_option_is_a_usage_error_with_a_message(options, words):
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_checks.py", "--collect-only", "-q",
                           "-p", "no:xdist", "-p", "no:cacheprovider", *options],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert words in out and "Traceback" not in out and "INTERNALERROR" not in out, out
