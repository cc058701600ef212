"""The suite checked against itself: planted bugs must die, correct code must live.

A mutant (``mutants/``) is killed when a check it claims in ``kills`` fails on it
for some dtype within the hunt's example budget. A control (``CONTROLS``: correct
plain-PyTorch implementations in the input dtype) must pass every check in every
dtype; a control that fails means a tolerance is too tight or a property is wrong.
"""
from __future__ import annotations

import importlib
import os
import pickle
import select
import signal
import time
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, given, settings

from properties import backend, registry
from properties.registry import Check, Implementation, NotApplicable, OpSpec

# Correct implementations per op, as a user would write them.
CONTROLS: dict[str, tuple[str, ...]] = {
    "softmax": ("controls.softmax:torch_softmax", "controls.softmax:torch_softmax_fp32"),
    "attention": ("controls.attention:sdpa", "controls.attention:naive_torch"),
    "layer_norm": ("controls.norms:torch_layer_norm",),
    "dropout_residual_layer_norm": ("controls.norms:torch_dropout_residual_layer_norm",),
    "cross_entropy": ("controls.losses:torch_cross_entropy",),
    "rope": ("controls.elementwise:torch_rope",),
    "swiglu": ("controls.elementwise:torch_swiglu",),
    "elu_feature_map": ("controls.linear_attention:torch_elu_feature_map",),
    "linear_attention": ("controls.linear_attention:torch_linear_attention",),
}

HUNT_EXAMPLES = 60  # a mutant must die within this many examples (per dtype tried)
CONTROL_EXAMPLES = 4
ISOLATED_TIMEOUT_S = 300  # one mutant hunt in one dtype: ~10 s on a CI core; longer is a hang


@dataclass(frozen=True)
class Verdict:
    failed: bool
    dtype: torch.dtype | None
    text: str


def mutants() -> list:
    """Every Mutant object defined in mutants/<family>.py, for the registered ops."""
    from mutants import Mutant
    ops = registry.load()
    found = []
    for family in registry.FAMILIES:
        try:
            module = importlib.import_module(f"mutants.{family}")
        except ModuleNotFoundError:
            continue
        found.extend(v for v in vars(module).values() if isinstance(v, Mutant) and v.op in ops)
    return sorted(found, key=lambda m: (m.op, m.name))


def controls() -> list[Implementation]:
    ops = registry.load()
    return [Implementation.of(op, registry.resolve(t), name=t.rpartition(":")[2], kind="control", target=t)
            for op, targets in CONTROLS.items() if op in ops for t in targets]


def as_implementation(m) -> Implementation:
    return Implementation.of(m.op, m.fn, name=m.name, kind="mutant", target=m.target)


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None, print_blob=False,
                    phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))


def runnable(op: OpSpec, impl: Implementation, check: Check, dtype: torch.dtype) -> str | None:
    """Why (op, impl, check, dtype) cannot run here, or None."""
    limit = backend.limit_for(op.name, dtype, impl.fn)
    if limit is not None:
        return limit.reason
    if impl.unsupported(dtype):
        return impl.unsupported(dtype)
    if check.requires is not None:
        return check.requires(impl)
    return None


def hunt(op: OpSpec, impl: Implementation, check: Check, dtype: torch.dtype, examples: int) -> Verdict:
    """Run ``check`` on ``impl`` for up to ``examples`` cases; report the first failure."""
    strategy = check.cases(op, dtype) if check.cases is not None else op.cases(dtype)

    @_settings(examples)
    @given(case=strategy)
    def search(case):
        try:
            check.run(case, impl)
        except NotApplicable:
            pass
        except AssertionError as exc:
            raise AssertionError(f"{exc}\non:\n{case.describe()}") from None

    try:
        search()
    except AssertionError as exc:
        return Verdict(True, dtype, str(exc))
    except Exception as exc:  # a crash on valid input is a failure too
        return Verdict(True, dtype, f"{type(exc).__name__}: {exc}")
    return Verdict(False, dtype, "")


def isolated(fn, *args) -> Verdict:
    """Run ``fn(*args)`` in a forked child under the interpreter, where a planted
    out-of-bounds access can crash the process (design notes): the crash becomes a
    verdict instead of taking pytest down. On CUDA (no fork after CUDA init) it runs
    in-process."""
    if backend.current() == "cuda" or not hasattr(os, "fork"):
        return fn(*args)
    # torch's OpenMP pool does not survive fork: a child that enters a parallel region
    # the parent has used waits forever on the pool's futex. One thread per process
    # never enters one (and two xdist workers on two cores want one thread each anyway).
    torch.set_num_threads(1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read)
        try:
            payload = pickle.dumps(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
            payload = pickle.dumps(Verdict(True, None, f"{type(exc).__name__}: {exc}"))
        with os.fdopen(write, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write)
    chunks, deadline = [], time.monotonic() + ISOLATED_TIMEOUT_S
    with os.fdopen(read, "rb", buffering=0) as inp:
        while True:
            ready, _, _ = select.select([inp], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:  # a hang is a failure, never a stuck test run
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return Verdict(True, None, f"did not finish in {ISOLATED_TIMEOUT_S} s: the process hung")
            chunk = inp.read(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    payload = b"".join(chunks)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        return Verdict(True, None, f"the process died of {sig}: an out-of-bounds access under the interpreter")
    return pickle.loads(payload)


def kill(m, check_name: str) -> Verdict:
    """Hunt mutant ``m`` with ``check_name`` in each dtype until one fails."""
    op = registry.load()[m.op]
    check = {c.name: c for c in op.checks}.get(check_name)
    if check is None:
        return Verdict(False, None, f"{m.op} has no check {check_name!r}")
    impl = as_implementation(m)
    tried = []
    for dtype in op.dtypes:
        if runnable(op, impl, check, dtype):
            continue
        tried.append(str(dtype).replace("torch.", ""))
        verdict = isolated(hunt, op, impl, check, dtype, HUNT_EXAMPLES)
        if verdict.failed:
            return verdict
    return Verdict(False, None, f"survived {check_name} in {tried or 'no runnable dtype'}")
