"""The suite checked against itself: planted bugs must die, correct code must live.

A mutant (``mutants/``) is killed when a check it claims in ``kills`` fails on it
for some dtype within the hunt's example budget, and fails by its own assertion: an
``AssertionError`` raised in the check's code (the engine and ``properties/``). A
crash (any other exception, an ``assert`` inside the kernel, Triton or torch, a
refusal), a hang or the death of the process says the mutant broke, not that the
check saw the bug: the verdict records it as such and it is no kill. A control (an op record's ``controls``: correct
plain-PyTorch implementations in the input dtype) must pass every check in every
dtype; a control that fails means a tolerance is too tight or a property is wrong.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import signal
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from hypothesis import HealthCheck, Phase, given, reject, seed, settings
from hypothesis.errors import Flaky, Unsatisfiable, UnsatisfiedAssumption

from tritoncheck import autotune_configs, backend, registry, strategies
from tritoncheck.limits import NotApplicable
from tritoncheck.oracle import InvalidAllowance
from tritoncheck.poisoning import poisoned_allocations_for
from tritoncheck.refusals import Refused
from tritoncheck.registry import Check, Implementation, OpSpec

# A mutant must die within this many examples (per dtype tried). With 60, a reseeded stream
# let layer_norm.one_pass_variance survive in every dtype (the offset rows it needs came up
# once); it died at 80.
HUNT_EXAMPLES = 100
# The hunts' random streams: one per (op, implementation, check, dtype), so the dtypes of a
# hunt are independent tries (derandomize=True gave every hunt the seed of hunt()'s source:
# three dtypes made the same draws, and an edit to hunt() reseeded them all). Hypothesis also
# mixes literals of the loaded modules into its draws, so a stream is fixed per code version.
HUNT_SEED = 20261123
CONTROL_EXAMPLES = 4
# Examples a hunt sets aside because the implementation crashed on them before it ends
# as a crash (a planted bug that crashes everywhere costs this many examples, not 100).
CRASHES_PER_HUNT = 10
ISOLATED_TIMEOUT_S = 300  # one mutant hunt in one dtype: ~10 s on a CI core; longer is a hang


# What ended a hunt that did not pass (Verdict.ending): the check's own assertion, or not.
ASSERTION, CRASH, HANG, DIED = "assertion", "crash", "hang", "died"


@dataclass(frozen=True)
class Verdict:
    failed: bool
    dtype: torch.dtype | None
    text: str
    suite_bug: bool = False  # failed on an invalid allowance (oracle.InvalidAllowance): never a kill
    ending: str | None = None  # ASSERTION, CRASH, HANG or DIED when failed
    exception: str | None = None  # the type of the exception that ended it (ASSERTION, CRASH)

    @property
    def killed(self) -> bool:
        """Failed by the check's own assertion: the only failure that kills a mutant."""
        return self.failed and not self.suite_bug and self.ending == ASSERTION

    def describe(self) -> str:
        """What ended the hunt, in words, for a report line."""
        if not self.failed:
            return "passed"
        dtype = f" in {str(self.dtype).replace('torch.', '')}" if self.dtype is not None else ""
        what = {ASSERTION: f"failed the check's assertion ({self.exception})", CRASH: f"crashed ({self.exception})",
                HANG: "hung", DIED: "the process died"}.get(self.ending, "failed")
        return ("suite bug: " if self.suite_bug else "") + what + dtype


class _CheckFailed(AssertionError):
    """The check's own assertion, told apart inside a hunt from any other exception."""


def _suite_dirs() -> tuple[str, ...]:
    from tritoncheck import properties
    return tuple(f"{Path(m.__file__).resolve().parent}{os.sep}" for m in (registry, properties))


def raised_by_check(exc: BaseException) -> bool:
    """Whether ``exc`` is the check's own assertion: an ``AssertionError`` whose innermost
    frame lies in the suite's check code (the engine, ``tritoncheck/``, or
    ``properties/``). An ``assert`` in a kernel's wrapper, in Triton's interpreter or in
    torch is the implementation breaking: a crash."""
    if not isinstance(exc, AssertionError):
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_suite_dirs())


def mutants() -> list:
    """Every Mutant object defined in mutants/<family>.py, for the registered ops; a family
    mirrors properties/<family>.py (mutants/offsets.py and memory.py are killed by the
    large-index check and compute-sanitizer, outside the registry's checks), and
    mutants/cheats.py holds the gauntlet of tricks that game a check (docs/cheats.md)."""
    from tritoncheck.mutation import Mutant
    ops = registry.load()
    found = []
    families = set(registry.modules_of("tritoncheck.properties")) & set(registry.modules_of("tritoncheck.mutants"))
    for family in sorted(families) + ["cheats"]:  # the gauntlet: tricks that game a check, on any op
        module = importlib.import_module(f"tritoncheck.mutants.{family}")
        found.extend(v for v in vars(module).values() if isinstance(v, Mutant) and v.op in ops)
    return sorted(found, key=lambda m: (m.op, m.name))


def controls() -> list[Implementation]:
    """Every op record's controls: correct implementations, as a user would write them."""
    return [Implementation.of(op, registry.resolve(t), name=t.rpartition(":")[2], kind="control", target=t)
            for op, spec in registry.load().items() for t in spec.controls]


def as_implementation(m) -> Implementation:
    return Implementation.of(m.op, m.fn, name=m.name, kind="mutant", target=m.target)


def _settings(examples: int) -> settings:
    # Health checks off, with reason: a hunt is a search for one failure of a planted bug
    # within a fixed budget, not a test of the strategies (tests/test_checks.py runs the
    # same strategies with the health checks the plugin keeps on); a mutant that makes
    # every example slow, or a strategy's filters, must end in a verdict, not an error.
    return settings(max_examples=examples, derandomize=False, database=None, deadline=None, print_blob=False,
                    phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))


def runnable(op: OpSpec, impl: Implementation, check: Check, dtype: torch.dtype) -> str | None:
    """Why (op, impl, check, dtype) cannot run here, or None."""
    limit = backend.limit_for(op, dtype, impl.fn)
    if limit is not None:
        return limit.reason
    if impl.unsupported(dtype):
        return impl.unsupported(dtype)
    if check.requires is not None and check.requires(impl):
        return check.requires(impl)
    if check.cases is not None:
        try:
            check.cases(op, dtype)  # a check that does not apply in this dtype says so (rounding_bias)
        except NotApplicable as exc:
            return str(exc)
    return None


def hunt(op: OpSpec, impl: Implementation, check: Check, dtype: torch.dtype, examples: int,
         base_seed: int | None = None) -> Verdict:
    """Run ``check`` on ``impl`` for up to ``examples`` cases; report the first failure of the
    check's assertion. An example on which the implementation crashes (any other exception)
    is set aside and the hunt goes on, up to CRASHES_PER_HUNT of them: a planted bug that
    breaks part of the domain may still give wrong numbers on the rest, and only those kill
    it. A hunt that ends without the assertion but with crashes is a crash verdict, naming
    the first crash and its case. The stream is seeded by ``base_seed`` (default
    HUNT_SEED) and what is hunted."""
    strategy = check.cases(op, dtype) if check.cases is not None else op.cases(dtype)
    crashes: list[tuple[BaseException, str]] = []  # (exception, case) of the examples set aside
    base = HUNT_SEED if base_seed is None else base_seed

    def attempt(case):
        try:
            # as in a user's run (harness.Target.run): fresh allocations NaN, autotune configs in turn
            with poisoned_allocations_for(impl.fn), \
                    autotune_configs.pinned_all(impl.fn, autotune_configs.each_in_turn(impl.fn, None)):
                check.run(case, impl)
        except UnsatisfiedAssumption:
            raise  # the check's precondition discards the case: Hypothesis draws another
        except InvalidAllowance:
            crashes.append((None, case.describe()))
            raise  # a suite bug: the hunt stops
        except AssertionError as exc:
            if raised_by_check(exc):
                raise _CheckFailed(f"{exc}\non:\n{case.describe()}") from None
            _set_aside(exc, case)
        except Exception as exc:  # noqa: BLE001 - a crash, whatever its type
            _set_aside(exc, case)

    def _set_aside(exc: BaseException, case) -> None:
        crashes.append((exc, case.describe()))
        if len(crashes) >= CRASHES_PER_HUNT:
            raise exc
        reject()

    @seed(zlib.crc32(f"{base}:{op.name}:{impl.name}:{check.name}:{dtype}".encode()))
    @_settings(examples)
    @given(case=strategy)
    def search(case):
        attempt(case)

    # The length classes a row-wide check tries on purpose (tritoncheck/harness.py
    # run_length_classes), after the random hunt rather than before: a kill either way, and
    # a mutant the random draws kill (most) costs no extra example.
    @settings(parent=_settings(1), derandomize=True)
    @given(case=strategy)
    def at_length_class(case):
        attempt(case)

    try:
        search()
        for name in strategies.length_classes_reached(strategy):
            with strategies.pinned_length_class(name), contextlib.suppress(Unsatisfiable):  # all discarded: no kill
                at_length_class()
    except BaseException as exc:  # noqa: BLE001 - Hypothesis groups distinct failures; KeyboardInterrupt goes on
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return _verdict_of_failure(exc, dtype, [c for _, c in crashes])
    if crashes:
        return _verdict_of_failure(crashes[0][0], dtype, [crashes[0][1]])
    return Verdict(False, dtype, "")


def _verdict_of_failure(exc: BaseException, dtype: torch.dtype, crashed_on: list[str]) -> Verdict:
    """The verdict of a hunt that raised ``exc``. Hypothesis raises a group when it found
    distinct failures: the check's assertion among them kills, an invalid allowance
    among them is a suite bug, the rest are crashes."""
    # BaseExceptionGroup is a builtin from Python 3.11 (the exceptiongroup backport before).
    # Hypothesis replays a failing example once more, and raises Flaky (a group of what the
    # first run raised) when the replay passes: an implementation with state across calls
    # (a cache, an autotune config in turn) fails once; the first run's failure is the verdict's.
    grouped = getattr(exc, "exceptions", None) \
        if type(exc).__name__.endswith("ExceptionGroup") or isinstance(exc, Flaky) else None
    found = list(grouped) if grouped else [exc]
    invalid = [e for e in found if isinstance(e, InvalidAllowance)]
    if invalid:
        return Verdict(True, dtype, f"{invalid[0]}\non:\n{crashed_on[0] if crashed_on else '?'}", suite_bug=True,
                       ending=CRASH, exception=type(invalid[0]).__name__)
    assertions = [e for e in found if isinstance(e, _CheckFailed)]
    if assertions:
        return Verdict(True, dtype, str(assertions[0]), ending=ASSERTION, exception="AssertionError")
    # a crash on valid input fails a control; for a mutant it is no kill. A refusal is
    # one too (the project's implementations accept the whole contract): named by the
    # exception the implementation raised.
    first = found[0]
    first = first.original if isinstance(first, Refused) else first
    where = f"\non:\n{crashed_on[0]}" if crashed_on else ""
    return Verdict(True, dtype, f"{type(first).__name__}: {first}{where}", ending=CRASH, exception=type(first).__name__)


def _configure(backend_name: str, size: str, tolerance: str) -> None:
    """The parent's backend, size and tolerance mode in a child."""
    from tritoncheck.config import CONFIG
    backend.select(backend_name)  # a spawned child starts with nothing selected
    CONFIG.size = size
    CONFIG.tolerance = tolerance


def _verdict_of(fn, args) -> Verdict:
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        return Verdict(True, None, f"{type(exc).__name__}: {exc}", ending=CRASH, exception=type(exc).__name__)


def _child(conn, backend_name: str, size: str, fn, args, tolerance: str = "derived") -> None:
    """The body of a forked child: one job, then exit."""
    _configure(backend_name, size, tolerance)
    conn.send(_verdict_of(fn, args))
    conn.close()


def _cuda_usable() -> bool:
    """Whether this process's CUDA context still works: a wild or misaligned access
    leaves it broken for good (every later call fails with the same sticky error)."""
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except Exception:  # noqa: BLE001 - any error means the context cannot be trusted
        return False


def _serve(conn, backend_name: str) -> None:
    """The body of a resident CUDA child: jobs one after another until the pipe closes
    or a job leaves the CUDA context broken (it answers, then exits)."""
    backend.select(backend_name)
    registry.load()  # the imports and the registry, before the first job's clock starts
    while True:
        try:
            size, tolerance, device_index, fn, args = conn.recv()
        except EOFError:
            return
        _configure(backend_name, size, tolerance)
        torch.cuda.set_device(device_index)
        verdict = _verdict_of(fn, args)
        usable = _cuda_usable()
        conn.send((verdict, usable))
        if not usable:
            return


class _ResidentChild:
    """A spawned process that runs isolated jobs one after another on CUDA.

    Spawning a child per hunt cost most of a GPU hunt: the child imports torch, Triton
    and the suite and creates a CUDA context before the first example (the self-test's
    median time to kill on an H100 was 22.3 s with a child per hunt). One child serves
    the hunts of a pytest process in turn; a job that leaves its CUDA context broken ends
    it, and a replacement is started at once so that its imports overlap the parent's
    next steps. A child that dies or hangs is replaced the same way."""

    def __init__(self):
        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe(duplex=True)
        self.process = context.Process(target=_serve, args=(child_end, backend.current()), daemon=True)
        self.process.start()
        child_end.close()  # the child holds the only other end: its death reads as EOF here

    def run(self, fn, args) -> tuple[Verdict, bool]:
        """The job's verdict, and whether this child can take another job."""
        from tritoncheck.config import CONFIG
        self.conn.send((CONFIG.size, CONFIG.tolerance, torch.cuda.current_device(), fn, args))
        if not self.conn.poll(ISOLATED_TIMEOUT_S):  # a hang is a failure, never a stuck test run
            return Verdict(True, None, f"did not finish in {ISOLATED_TIMEOUT_S} s: the process hung",
                           ending=HANG), False
        try:
            return self.conn.recv()
        except EOFError:
            self.process.join(5)
            code = self.process.exitcode or 0
            sig = signal.Signals(-code).name if code < 0 else f"exit {code}"
            return Verdict(True, None, f"the process died ({sig}): an out-of-bounds access, or worse",
                           ending=DIED), False

    def close(self) -> None:
        self.conn.close()
        self.process.join(1)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


_resident: _ResidentChild | None = None


def _isolated_on_cuda(fn, args) -> Verdict:
    global _resident
    child = _resident or _ResidentChild()
    _resident = None
    verdict, reusable = child.run(fn, args)
    if reusable:
        _resident = child
    else:
        child.close()
        _resident = _ResidentChild()  # starts now: its imports overlap what the parent does next
    return verdict


def isolated(fn, *args) -> Verdict:
    """Run ``fn(*args)`` in a child process, so that what a planted bug does to the
    process cannot reach the rest of the run: under the interpreter an out-of-bounds
    access can crash the process (design notes); on CUDA a wild or misaligned access
    leaves the CUDA context broken for good, and every later test in the same pytest
    worker would fail with the same error. A crash, a broken context and a hang all
    become a failed verdict. Under the interpreter the child is forked (cheap), one per
    job; CUDA cannot fork after its first use, so there a spawned child serves job after
    job (:class:`_ResidentChild`; fn and args must pickle) until one breaks its context,
    and finds compiled kernels in Triton's on-disk cache."""
    from tritoncheck.config import CONFIG
    if backend.current() == "cuda":
        return _isolated_on_cuda(fn, args)
    # torch's OpenMP pool does not survive fork: a child that enters a parallel region
    # the parent has used waits forever on the pool's futex. One thread per process
    # never enters one (and two xdist workers on two cores want one thread each anyway).
    torch.set_num_threads(1)
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, backend.current(), CONFIG.size, fn, args, CONFIG.tolerance),
                            daemon=True)
    child.start()
    send.close()  # the child holds the only writer: its death reads as EOF here
    try:
        if not receive.poll(ISOLATED_TIMEOUT_S):  # a hang is a failure, never a stuck test run
            child.kill()
            return Verdict(True, None, f"did not finish in {ISOLATED_TIMEOUT_S} s: the process hung", ending=HANG)
        return receive.recv()
    except EOFError:
        child.join()
        sig = signal.Signals(-child.exitcode).name if (child.exitcode or 0) < 0 else f"exit {child.exitcode}"
        return Verdict(True, None, f"the process died ({sig}): an out-of-bounds access, or worse", ending=DIED)
    finally:
        receive.close()
        child.join(5)
        if child.is_alive():
            child.kill()


def _hunt_mutant(target: str, check_name: str, dtype_name: str, examples: int, base_seed: int) -> Verdict:
    """:func:`hunt` by names, so that a spawned child can rebuild what it hunts."""
    m = registry.resolve(target)
    op = registry.load()[m.op]
    check = {c.name: c for c in op.checks}[check_name]
    return hunt(op, as_implementation(m), check, getattr(torch, dtype_name), examples, base_seed)


def not_runnable_here(m, check_name: str) -> str | None:
    """Why mutant ``m`` cannot be hunted with ``check_name`` here in any dtype (the reason of
    the first), or None when some dtype can run: a mutant of a distributed op on a machine
    with fewer GPUs than ranks, say, is not reached here, which is not a survival."""
    op = registry.load()[m.op]
    check = {c.name: c for c in op.checks}.get(check_name)
    if check is None:
        return None  # kill() says so, as a failure
    impl = as_implementation(m)
    reasons = [runnable(op, impl, check, dtype) for dtype in op.dtypes]
    return None if not all(reasons) else reasons[0]


def kill(m, check_name: str) -> Verdict:
    """Hunt mutant ``m`` with ``check_name`` in each dtype until the check's assertion
    fails (:attr:`Verdict.killed`). A crash, hang or death in one dtype is no kill: it
    is kept, the next dtype is hunted, and a mutant that no assertion caught survives
    with those endings in its text. A suite bug (an invalid allowance) stops the hunt."""
    op = registry.load()[m.op]
    check = {c.name: c for c in op.checks}.get(check_name)
    if check is None:
        return Verdict(False, None, f"{m.op} has no check {check_name!r}")
    impl = as_implementation(m)
    tried, broke = [], []
    for dtype in op.dtypes:
        if runnable(op, impl, check, dtype):
            continue
        tried.append(str(dtype).replace("torch.", ""))
        # the seed travels as an argument: a spawned child would import the module's default.
        # A distributed op's ranks are processes of their own already (OpSpec.distributed).
        job = (_hunt_mutant, m.target, check_name, tried[-1], HUNT_EXAMPLES, HUNT_SEED)
        verdict = _verdict_of(job[0], job[1:]) if op.distributed else isolated(*job)
        if verdict.killed or verdict.suite_bug:
            return verdict  # test_mutant_killed reports a suite bug
        if verdict.failed:
            broke.append(verdict if verdict.dtype is not None else dataclasses.replace(verdict, dtype=dtype))
    text = f"survived {check_name} in {tried or 'no runnable dtype'}"
    if not broke:
        return Verdict(False, None, text)
    # failed, but not by the check: the first such ending is the verdict's, every one is in its text
    text += "".join(f"\n{v.describe()}, which is no kill:\n{v.text}" for v in broke)
    return dataclasses.replace(broke[0], text=text)
