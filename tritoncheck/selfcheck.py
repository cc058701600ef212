"""The suite checked against itself: planted bugs must die, correct code must live.

A mutant (``mutants/``) is killed when a check it claims in ``kills`` fails on it
for some dtype within the hunt's example budget. A control (an op record's ``controls``: correct
plain-PyTorch implementations in the input dtype) must pass every check in every
dtype; a control that fails means a tolerance is too tight or a property is wrong.
"""
from __future__ import annotations

import importlib
import multiprocessing
import signal
import zlib
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, given, seed, settings

from tritoncheck import backend, registry
from tritoncheck.oracle import InvalidAllowance
from tritoncheck.poisoning import poisoned_allocations_for
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
ISOLATED_TIMEOUT_S = 300  # one mutant hunt in one dtype: ~10 s on a CI core; longer is a hang


@dataclass(frozen=True)
class Verdict:
    failed: bool
    dtype: torch.dtype | None
    text: str
    suite_bug: bool = False  # failed on an invalid allowance (oracle.InvalidAllowance): never a kill


def mutants() -> list:
    """Every Mutant object defined in mutants/<family>.py, for the registered ops; a family
    mirrors properties/<family>.py (mutants/offsets.py and memory.py are killed by the
    large-index check and compute-sanitizer, outside the registry's checks)."""
    from tritoncheck.mutation import Mutant
    ops = registry.load()
    found = []
    families = set(registry.modules_of("tritoncheck.properties")) & set(registry.modules_of("tritoncheck.mutants"))
    for family in sorted(families):
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
    limit = backend.limit_for(op.name, dtype, impl.fn)
    if limit is not None:
        return limit.reason
    if impl.unsupported(dtype):
        return impl.unsupported(dtype)
    if check.requires is not None:
        return check.requires(impl)
    return None


def hunt(op: OpSpec, impl: Implementation, check: Check, dtype: torch.dtype, examples: int,
         base_seed: int | None = None) -> Verdict:
    """Run ``check`` on ``impl`` for up to ``examples`` cases; report the first failure.
    The stream is seeded by ``base_seed`` (default HUNT_SEED) and what is hunted."""
    strategy = check.cases(op, dtype) if check.cases is not None else op.cases(dtype)

    crashed_on = []  # an exception other than a check's AssertionError carries no case: keep it here

    base = HUNT_SEED if base_seed is None else base_seed

    @seed(zlib.crc32(f"{base}:{op.name}:{impl.name}:{check.name}:{dtype}".encode()))
    @_settings(examples)
    @given(case=strategy)
    def search(case):
        try:
            with poisoned_allocations_for(impl.fn):  # as in a user's run (harness.Target.run)
                check.run(case, impl)
        except InvalidAllowance:
            crashed_on.append(case.describe())
            raise
        except AssertionError as exc:
            raise AssertionError(f"{exc}\non:\n{case.describe()}") from None
        except Exception:
            crashed_on.append(case.describe())
            raise

    try:
        search()
    except InvalidAllowance as exc:
        return Verdict(True, dtype, f"{exc}\non:\n{crashed_on[0] if crashed_on else '?'}", suite_bug=True)
    except AssertionError as exc:
        return Verdict(True, dtype, str(exc))
    except Exception as exc:  # a crash on valid input is a failure too
        where = f"\non:\n{crashed_on[0]}" if crashed_on else ""
        return Verdict(True, dtype, f"{type(exc).__name__}: {exc}{where}")
    return Verdict(False, dtype, "")


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
        return Verdict(True, None, f"{type(exc).__name__}: {exc}")


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
            return Verdict(True, None, f"did not finish in {ISOLATED_TIMEOUT_S} s: the process hung"), False
        try:
            return self.conn.recv()
        except EOFError:
            self.process.join(5)
            code = self.process.exitcode or 0
            sig = signal.Signals(-code).name if code < 0 else f"exit {code}"
            return Verdict(True, None, f"the process died ({sig}): an out-of-bounds access, or worse"), False

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
            return Verdict(True, None, f"did not finish in {ISOLATED_TIMEOUT_S} s: the process hung")
        return receive.recv()
    except EOFError:
        child.join()
        sig = signal.Signals(-child.exitcode).name if (child.exitcode or 0) < 0 else f"exit {child.exitcode}"
        return Verdict(True, None, f"the process died ({sig}): an out-of-bounds access, or worse")
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
        # the seed travels as an argument: a spawned child would import the module's default
        verdict = isolated(_hunt_mutant, m.target, check_name, tried[-1], HUNT_EXAMPLES, HUNT_SEED)
        if verdict.failed:
            return verdict  # a suite bug stops the hunt too, and test_mutant_killed reports it
    return Verdict(False, None, f"survived {check_name} in {tried or 'no runnable dtype'}")
