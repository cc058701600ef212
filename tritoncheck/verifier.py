"""``verify(op, fn)``: the suite as a function, for agent loops and review scripts.

    import tritoncheck
    verdict = tritoncheck.verify("softmax", my_softmax, budget_s=120)
    if not verdict:
        print(verdict.failure.message, verdict.failure.replay)

No pytest session: the checks run in one child process per call (spawned), which
draws each (dtype, check) target's cases with Hypothesis from a seed derived from
``seed`` and the target's id, runs them through the same :class:`harness.Target` as
the suite (poisoned allocations, autotune configs in turn, refusals, replay files),
and stops at the first failure. The caller survives the kernel: a segfault or a heap
corruption that kills the child, an example that runs past ``example_timeout_s`` (a
hang) and a run past ``budget_s`` each end in a failed verdict that names it, with the
case that was running and its replay file where one was in flight.

What isolation costs: one spawned child per call, which imports torch, Triton and the
suite before its first example (about 3-5 s on a CPU, plus a CUDA context on a GPU);
the examples themselves run at in-process speed. Counted against ``budget_s``.

Held out: without ``seed`` each call draws a fresh one (``secrets``), so a kernel tuned
against one run's cases meets others in the next; the seed is in the verdict, its
report and on stderr, and passing it back replays the same cases (same code, same
draws: Hypothesis is seeded per target, its example database is off).

Not applied here (the pytest run applies them): the report's vacuity rule (a test
in which most examples would have accepted 0 fails) and the refusal summary. The
minimum of counted examples is applied: a target in which fewer than half of
``max_examples`` ran to the end (the rest refused or discarded) fails as not reached.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import re
import secrets
import signal
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

# What ended a failed target (Failure.ending): the check's assertion, another exception out
# of the implementation, the child's death (a signal), an example past example_timeout_s,
# the whole call past budget_s, or too few examples counted.
ASSERTION, ERROR, DIED, HANG, BUDGET, NOT_REACHED = "assertion", "error", "died", "hang", "budget", "not reached"


@dataclass(frozen=True)
class Failure:
    """The first failure of a :func:`verify` call."""

    target: str  # "dtype/check", e.g. "float16/matches_reference"
    ending: str  # ASSERTION, ERROR, DIED, HANG, BUDGET or NOT_REACHED
    message: str
    case: str | None = None  # the case in words, when one was running
    replay: str | None = None  # the command that replays it, when a case was saved


@dataclass(frozen=True)
class Verdict:
    """What :func:`verify` found. True when every runnable check passed."""

    passed: bool
    op: str
    implementation: str
    seed: int
    failure: Failure | None
    checks_run: tuple[str, ...]  # "dtype/check" targets that ran to a verdict (passed, or the failure)
    checks_skipped: dict[str, str] = field(default_factory=dict)  # target -> why it did not run
    report: Path | None = None
    elapsed_s: float = 0.0

    def __bool__(self) -> bool:
        return self.passed

    def summary(self) -> str:
        head = (f"{self.op} {self.implementation}: {'passed' if self.passed else 'FAILED'} "
                f"({len(self.checks_run)} checks run, {len(self.checks_skipped)} not run, seed {self.seed}, "
                f"{self.elapsed_s:.1f} s)")
        if self.failure is None:
            return head
        f = self.failure
        lines = [head, f"{f.target}: {f.ending}: {f.message}"]
        if f.case and f.case not in f.message:
            lines.append(f"on:\n{f.case}")
        if f.replay and f.replay not in f.message:
            lines.append(f"replay: {f.replay}")
        return "\n".join(lines)


def verify(op: str, fn: Callable | str, *, budget_s: float = 300.0, seed: int | None = None,
           max_examples: int = 10, dtypes: tuple[str, ...] | None = None, checks: tuple[str, ...] | None = None,
           example_timeout_s: float = 60.0, report_dir: str | Path | None = None, backend: str = "auto",
           quiet: bool = False, source: str | None = None) -> Verdict:
    """Check ``fn`` (a callable, or ``"module:function"``) as an implementation of ``op``.

    The checks run in a spawned child, which must import ``fn``: a function of a module
    file is imported by name; one from a notebook cell, a file-less ``__main__`` or an
    ``exec`` whose source is in ``linecache`` is rebuilt from it (tritoncheck/function_source.py);
    ``source`` (the code that defines it, e.g. a kernel-generation loop's draft) is written
    to a module of its own, ``fn`` then naming the function in it (its name, or the
    callable). Where none of these works the call raises a TypeError saying what to pass.

    ``budget_s`` bounds the whole call, the child's start included; ``seed`` fixes the
    cases (fresh when None); ``max_examples`` per (dtype, check) target; ``dtypes`` and
    ``checks`` narrow the targets (names, e.g. ``("float16",)``); ``example_timeout_s``
    is how long one example may run before it counts as a hang. The verdict's
    ``report`` is ``<report_dir>/verdict.json``; failing cases' replay files lie beside it
    (default report_dir: ``reports/verify-<op>-<seed>``). An unknown ``op``, dtype or check
    name raises ``ValueError`` (naming the known ones) before anything runs."""
    start = time.monotonic()
    _check_names(op, dtypes, checks)
    seed = secrets.randbelow(2**32) if seed is None else int(seed)
    folder = Path(report_dir) if report_dir is not None else Path("reports") / f"verify-{op}-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    target, callable_, paths = _shipped(fn, source, folder)
    name = (target or "").rpartition(":")[2] or getattr(fn, "__name__", "impl")
    if not quiet:
        print(f"tritoncheck.verify: {op} {name}, seed {seed} (pass seed={seed} to replay these cases)",
              file=sys.stderr)
    job = dict(op=op, target=target, fn=callable_, seed=seed, max_examples=max_examples,
               dtypes=tuple(dtypes) if dtypes else None, checks=tuple(checks) if checks else None,
               report_dir=str(folder.resolve()), backend=_backend_for(backend), paths=paths)
    run, skipped, failure = _supervise(job, start, budget_s, example_timeout_s)
    if failure is not None and failure.replay and paths:  # the module written for the child: on the replay's path
        failure = dataclasses.replace(failure, replay=f"PYTHONPATH={os.pathsep.join(paths)} {failure.replay}")
    verdict = Verdict(passed=failure is None, op=op, implementation=name, seed=seed, failure=failure,
                      checks_run=tuple(run), checks_skipped=skipped, report=folder / "verdict.json",
                      elapsed_s=time.monotonic() - start)
    data = asdict(verdict)
    data["report"] = str(verdict.report)
    verdict.report.write_text(json.dumps(data, indent=1))
    return verdict


def _check_names(op: str, dtypes, checks) -> None:
    """A misspelt op, dtype or check is the caller's error (a ValueError naming the known ones
    and the closest), not a verdict on the kernel."""
    import difflib

    from tritoncheck import registry
    if op not in registry.load():
        raise registry.unknown_op(op)
    spec = registry.OPS[op]
    for what, given, known in (("dtype", dtypes, [str(d).replace("torch.", "") for d in spec.dtypes]),
                               ("check", checks, [c.name for c in spec.checks])):
        for name in given or ():
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                raise ValueError(f"verify({op!r}, ...): unknown {what} {name!r}"
                                 + (f" (did you mean {close[0]!r}?)" if close else "")
                                 + f"; {op}'s {what}s: {', '.join(known)}")


def _shipped(fn, source: str | None, folder: Path) -> tuple[str | None, Callable | None, list[str]]:
    """How the child gets ``fn``: ``(module:function, None, extra sys.path)`` to import, or
    ``(None, fn, [])`` to unpickle (a top-level function of the caller's ``__main__`` script,
    which the spawned child runs again). A function without an importable module is
    written to a module in ``folder`` from ``source`` or from the source linecache holds
    (:mod:`tritoncheck.function_source`); a TypeError saying what to do where neither exists."""
    from tritoncheck import function_source
    if source is not None:
        name = fn if isinstance(fn, str) else getattr(fn, "__name__", None)
        if not isinstance(source, str) or not isinstance(name, str) or not name.isidentifier():
            raise TypeError("verify: with source=, fn names the function the source defines (its name, or the "
                            f"function itself); got {fn!r}")
        return _written(source, name, folder)
    if isinstance(fn, str):
        return fn, None, []
    target = getattr(fn, "target", None)  # a tritoncheck Mutant names its import path
    if isinstance(target, str):
        return target, None, []
    target = function_source.import_path(fn)
    if target is not None:
        return target, None, []
    if function_source.defined_in_main_script(fn):
        return None, fn, []
    if "<locals>" in getattr(fn, "__qualname__", "") or not getattr(fn, "__name__", "<").isidentifier():
        raise TypeError(f"verify: {fn!r} cannot be sent to a child process (a lambda or a nested function); define "
                        "it at the top level of a module, notebook cell or script, pass 'module:function', or pass "
                        "its source: verify(op, name, source=code)")
    return _written(function_source.module_source(fn), fn.__name__, folder)


def _written(source: str, name: str, folder: Path) -> tuple[str, None, list[str]]:
    """``source`` as a module of ``folder`` (named by its hash: a draft edited and verified
    again is a new module), checked to compile here, and ``module:name`` in it."""
    try:
        compile(source, f"<verify source of {name}>", "exec")
    except SyntaxError as exc:
        raise TypeError(f"verify: the source given for {name} does not compile: {exc}") from None
    module = f"tritoncheck_verify_{name}_{hashlib.sha1(source.encode()).hexdigest()[:10]}"
    folder = folder.resolve()
    (folder / f"{module}.py").write_text(source)
    return f"{module}:{name}", None, [str(folder)]


def _backend_for(choice: str) -> str:
    import torch
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "interpret"
    return choice


def _supervise(job: dict, start: float, budget_s: float, example_timeout_s: float):
    """Run ``job`` in a spawned child; read its messages until it finishes, dies, hangs on
    an example or runs out of budget. Returns (targets run, targets skipped, failure)."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    # the child's `import triton` (its caller's module may import it first) must see the backend
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if job["backend"] == "interpret" else "0"
    # a spawned child runs the caller's __main__ file again; a script read from stdin names
    # "<stdin>", which the child cannot open (it would die before its first line): none then
    main = sys.modules.get("__main__")
    phantom = getattr(main, "__file__", None)
    phantom = phantom if isinstance(phantom, str) and phantom.startswith("<") and phantom.endswith(">") else None
    if phantom is not None:
        del main.__file__
    try:
        child = context.Process(target=_child_main, args=(send, job), daemon=True)
        child.start()
    finally:
        if phantom is not None:
            main.__file__ = phantom
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    send.close()  # the child holds the only writer: its death reads as EOF here
    run, skipped, failure = [], {}, None
    in_flight = None  # (target, case json, case text, since)
    all_targets: list[str] = []
    try:
        while True:
            left = budget_s - (time.monotonic() - start)
            wait = left if in_flight is None else min(left, example_timeout_s - (time.monotonic() - in_flight[3]))
            if wait <= 0 or not receive.poll(max(wait, 0)):
                if left <= 0 or in_flight is None:
                    failure = _stopped(job, in_flight, BUDGET, f"the call ran past its budget of {budget_s:g} s")
                else:
                    failure = _stopped(job, in_flight, HANG, f"an example ran past {example_timeout_s:g} s: "
                                                             "the implementation hung")
                break
            try:
                message = receive.recv()
            except EOFError:
                child.join(5)
                code = child.exitcode
                how = signal.Signals(-code).name if code is not None and code < 0 else f"exit {code}"
                failure = _stopped(job, in_flight, DIED, f"the process died ({how}): a crash in the implementation "
                                                         "(an out-of-bounds access, a corrupted heap, or worse)"
                                   if in_flight else f"the verifier's child process died ({how}) outside any "
                                                     "example (while importing or loading the implementation); "
                                                     "its stderr says why")
                break
            kind = message[0]
            if kind == "targets":
                all_targets = list(message[1])
            elif kind == "example":
                in_flight = (message[1], message[2], message[3], time.monotonic())
            elif kind == "skipped":
                skipped[message[1]] = message[2]
                in_flight = None
            elif kind == "passed":
                run.append(message[1])
                in_flight = None
            elif kind == "failed":
                if message[1] in all_targets:
                    run.append(message[1])
                failure = Failure(**message[2])
                break
            elif kind == "done":
                break
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    if failure is not None and failure.target in all_targets and failure.target not in run:
        run.append(failure.target)  # it ran until it died or was stopped
    done = set(run) | set(skipped)
    for t in all_targets:
        if t not in done:
            skipped[t] = "not run: the call stopped at the failure" if failure and failure.ending != BUDGET \
                else "not run: the budget ran out"
    if failure is None and not all_targets:
        failure = Failure("-", ERROR, "the child finished without naming its targets")
    return run, skipped, failure


def _stopped(job: dict, in_flight, ending: str, message: str) -> Failure:
    """The failure of a child that died or was stopped, naming the example that was running,
    whose case is saved as a replay file (the child could not save it)."""
    if in_flight is None:
        return Failure("-", ending, message)
    target, case_json, text, _ = in_flight
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{job['op']}-{target}")
    path = Path(job["report_dir"]) / "failures" / f"{stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"check": target.partition("/")[2], "impl": job["target"],
                                "impl_name": (job["target"] or "").rpartition(":")[2] or None,
                                "backend": job["backend"], "case": case_json}, indent=1))
    replay = f"python -m tritoncheck.replay {path}" + ("" if job["target"] else " --impl module:function")
    return Failure(target, ending, message, case=text, replay=replay)


def _child_main(conn, job: dict) -> None:
    """The spawned child: every (dtype, check) target of the job in turn, a message per
    example and per target, stop at the first failure. An error before the first target
    (an implementation that does not import or declares something wrong) is the verdict's
    failure, with its message."""
    try:
        targets = _targets_of(job)
    except Exception as exc:  # noqa: BLE001 - the parent reports it; the child has nothing else to do
        conn.send(("failed", "-", dict(target="-", ending=ERROR, message=f"{type(exc).__name__}: {exc}")))
        return
    _run_targets(conn, job, targets)


def _targets_of(job: dict) -> list:
    """The job's (dtype, check) targets, after selecting the backend and loading the implementation."""
    from tritoncheck import backend
    backend.select(job["backend"])
    from tritoncheck import harness, registry
    from tritoncheck.config import CONFIG
    from tritoncheck.registry import Implementation

    CONFIG.size = "small" if job["backend"] == "interpret" else "large"
    CONFIG.report_dir = Path(job["report_dir"])
    CONFIG.configured = True
    sys.path[:0] = [p for p in job.get("paths", ()) if p not in sys.path]  # where a module written for the child lies
    ops = registry.load()
    op = ops[job["op"]]
    fn = job["fn"] if job["fn"] is not None else registry.resolve(job["target"])
    impl = Implementation.of(op.name, fn, target=job["target"])
    return [harness.Target(op, impl, dtype, check) for dtype in op.dtypes for check in op.checks
            if (job["dtypes"] is None or harness.dtype_name(dtype) in job["dtypes"])
            and (job["checks"] is None or check.name in job["checks"])]


def _run_targets(conn, job: dict, targets: list) -> None:
    """Each target's seeded search in turn; a message per example and per target."""
    import pytest
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as seeded
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable, UnsatisfiedAssumption

    from tritoncheck import harness

    label = {t.id: f"{harness.dtype_name(t.dtype)}/{t.check.name}" for t in targets}
    conn.send(("targets", [label[t.id] for t in targets]))
    need = math.ceil(job["max_examples"] / 2)  # the plugin's minimum: half the examples counted
    for t in targets:
        name = label[t.id]
        reason = t.skip_reason()
        expected = t.impl.expected_failure(t.check.name, t.dtype) if reason is None else None
        if reason or expected:
            conn.send(("skipped", name, reason or f"declared expected failure: {expected.reason}"))
            continue
        counted = [0]
        search = seeded(zlib.crc32(f"{job['seed']}:{t.id}".encode()))(settings(
            max_examples=job["max_examples"], derandomize=False, database=None, deadline=None,
            phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck),
            verbosity=Verbosity.quiet, print_blob=False)(given(data=st.data())(_example(conn, t, name, counted))))
        try:
            search()
        except pytest.skip.Exception as exc:
            conn.send(("skipped", name, str(exc)))
            continue
        except (Unsatisfiable, UnsatisfiedAssumption):
            pass  # every example refused or discarded: not reached, below
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent as a verdict
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            conn.send(("failed", name, _failure_of(name, exc)))
            return
        if counted[0] < need:
            conn.send(("failed", name, dict(target=name, ending=NOT_REACHED, message=(
                f"{counted[0]} of {job['max_examples']} examples ran to the end, fewer than {need}: the rest "
                "were refused or outside the check's domain"))))
            return
        conn.send(("passed", name))
    conn.send(("done",))


def _example(conn, target, name: str, counted: list[int]):
    """One example of ``target``: draw, tell the parent what is running, run, count."""
    def example(data):
        case = target.draw(data)
        conn.send(("example", name, case.to_json(), case.describe()))
        target.run(case)
        counted[0] += 1
    return example


def _failure_of(name: str, exc: BaseException) -> dict:
    """A failed search as Failure fields: the first of a group (Hypothesis groups distinct
    failures, and flags a failure that did not recur on replay as Flaky)."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]
    text = "\n".join([str(exc), *getattr(exc, "__notes__", [])]).strip()
    replay = re.search(r"replay: (python -m tritoncheck\.replay \S+)", text)
    case = re.search(r"failed for .+? on:\n(.*?)\nreplay:", text, re.S)
    return dict(target=name, ending=ASSERTION if isinstance(exc, AssertionError) else ERROR,
                message=text if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {text}",
                case=case.group(1) if case else None, replay=replay.group(1) if replay else None)
