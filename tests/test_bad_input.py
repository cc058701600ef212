"""Invalid calls of every project kernel, generated from each op record's ``bad_input``
(tritoncheck/bad_input.py): each is refused with a ``ValueError`` or ``TypeError``
whose message names the argument at fault. Anything else is a defect of the wrapper:
a result computed from garbage, an error that does not say which argument is wrong,
another exception type, or (on CUDA) a context that the call left broken.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritoncheck import backend, registry

DEVICE = backend.device()
ROOT = Path(__file__).resolve().parents[1]
OPS = registry.load()
# the ops whose records build invalid calls; the others declare why not (NotApplicable)
CHECKED = sorted(op for op, spec in OPS.items() if isinstance(spec.bad_input, registry.BadInput))


def _call(op: str, args: dict[str, Any]):
    spec = registry.OPS[op]
    kernel = registry.resolve(spec.kernel)
    return kernel(*(args[a] for a in spec.arguments))


def _names(message: str, argument: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(argument)}(?![A-Za-z0-9_])", message) is not None


@st.composite
def invalid_calls(draw):
    op = draw(st.sampled_from(CHECKED))
    dims = {"b": draw(st.integers(1, 3)), "h": draw(st.integers(1, 2)), "n": draw(st.integers(2, 40)),
            "m": draw(st.integers(2, 40)), "d": draw(st.sampled_from((4, 8, 16)))}
    return op, dims, draw(st.sampled_from(OPS[op].bad_input.spoilers))


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(invalid_calls())
def test_an_invalid_call_is_refused_naming_the_argument(call):
    op, dims, spoiler = call
    args = OPS[op].bad_input.valid(dims, DEVICE)
    args[spoiler.argument] = spoiler.spoil(args)
    with pytest.raises((ValueError, TypeError)) as raised:
        _call(op, args)
    message = str(raised.value)
    assert _names(message, spoiler.argument), (
        f"{op} with {spoiler.argument} {spoiler.how}: the {type(raised.value).__name__} does not name "
        f"{spoiler.argument!r}: {message!r}")
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()  # raises if the refused call still broke the context


@pytest.mark.parametrize("op", [op if op in CHECKED else pytest.param(op, marks=pytest.mark.skip(
    reason=f"{op}: {OPS[op].bad_input.reason}")) for op in sorted(OPS)])
def test_the_valid_calls_are_accepted(op):
    """The spoilers spoil a call that is otherwise valid: without them it runs."""
    dims = {"b": 2, "h": 2, "n": 9, "m": 11, "d": 8}
    _call(op, OPS[op].bad_input.valid(dims, DEVICE))


# ------------------------------------------------------------ the suite's own options

# a process each (about 7 CPU-s): three on every commit, one per way an option is read (a name
# looked up, a module imported, a directory written), the others' own messages in the slow tier
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("options, words", [
    (["--op", "nope"], "--op nope: unknown"),
    pytest.param(["--dtype", "float64"], "--dtype float64", marks=_SLOW),
    pytest.param(["--dtype", "fp16"], "unknown dtype 'fp16'", marks=_SLOW),
    pytest.param(["--impl", "softmax"], "expected OP=package.module:function", marks=_SLOW),
    pytest.param(["--impl", "nope=tritoncheck.controls.softmax:torch_softmax"], "unknown op 'nope'", marks=_SLOW),
    (["--impl", "softmax=no_such_module:f"], "cannot import 'no_such_module'"),
    pytest.param(["--impl", "softmax=tritoncheck.controls.softmax:torch_softmax", "--op", "rope"],
                 "selects none of the ops", marks=_SLOW),
    pytest.param(["--hypothesis-profile", "nope"], "--hypothesis-profile 'nope': unknown", marks=_SLOW),
    pytest.param(["--max-examples", "0"], "--max-examples 0", marks=_SLOW),
    (["--report-dir", "/proc/no-such-dir"], "--report-dir '/proc/no-such-dir': cannot write there"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_bad_option_is_a_usage_error_with_a_message(options, words):
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_checks.py", "--collect-only", "-q",
                           "-p", "no:xdist", "-p", "no:cacheprovider", *options],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert words in out and "Traceback" not in out and "INTERNALERROR" not in out, out
