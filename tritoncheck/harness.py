"""From the registry to pytest: one test per (op, implementation, dtype, check).

A :class:`Target` draws a case, runs the check, records the error figures for the
report, and when the check fails writes the case to a replay file and adds to the
error what a person needs: the case in words and the command that replays it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable, UnsatisfiedAssumption
from hypothesis.vendor import pretty

from tritoncheck import autotune_configs, backend, devices, refusals, registry, strategies, unrunnable, worker_crashes
from tritoncheck.config import CONFIG
from tritoncheck.generic import rule_name
from tritoncheck.limits import NotApplicable, OutsideLimits
from tritoncheck.oracle import VACUOUS_EXAMPLES_MAX, VACUOUS_EXAMPLES_MIN, recording
from tritoncheck.poisoning import poisoned_allocations_for
from tritoncheck.refusals import Refused
from tritoncheck.registry import Check, Implementation, OpSpec
from tritoncheck.strategies import Case
from tritoncheck.worker_crashes import failure_stem

RECORDED_CHECKS = ("matches_reference", "gradients_match_reference")
# Examples discarded because the check called the implementation outside its declared limits,
# none run, after which the test is not applicable (Target._outside_limits). Three: a check that
# passes its own value (a softcap of 512) does so on every example; one that passes it only on
# some lets others through long before.
NOT_APPLICABLE_AFTER = 3
_collector = None  # the run's report.Collector, set by the plugin
# The fewest examples that must have counted (run the check to the end: neither discarded
# by assume nor refused) for a test to pass, as a share of the run's max_examples; the
# plugin states it per profile (tritoncheck/plugin.py MIN_COUNTED_SHARE) and sets it here.
_min_counted: int | None = None
# In an xdist worker only: the file the case about to run is written to, each example, so
# that the controller can replay the case of a worker that dies in it (the plugin sets it;
# tritoncheck/worker_crashes.py). None elsewhere: one process's crash ends the run anyway.
_in_flight: Path | None = None


def set_in_flight(path: Path | None) -> None:
    global _in_flight
    _in_flight = path
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


def set_collector(collector) -> None:
    global _collector
    _collector = collector


def collector():
    """The run's report collector (None outside a run of the plugin)."""
    return _collector


def set_min_counted(n: int | None) -> None:
    global _min_counted
    _min_counted = n


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True, repr=False)
class Target:
    op: OpSpec
    impl: Implementation
    dtype: torch.dtype
    check: Check

    def __repr__(self) -> str:
        return self.id

    @property
    def id(self) -> str:
        return f"{self.op.name}-{self.impl.name}-{dtype_name(self.dtype)}-{self.check.name}"

    def strategy(self) -> st.SearchStrategy[Case]:
        """The check's cases, drawn inside the implementation's declared limits: the
        op's strategy takes them as a parameter (sizes, scalar choices), and dtype and
        layout limits map each drawn case (tritoncheck/limits.py)."""
        limits = self.impl.limits
        op = dataclasses.replace(self.op, cases=functools.partial(self.op.cases, limits=limits)) if limits else self.op
        cases = self.check.cases(op, self.dtype) if self.check.cases is not None else op.cases(self.dtype)
        return cases.map(limits.fit) if limits else cases

    def draw(self, data) -> Case:
        """A case from ``data``; a check that needs cases the declared limits exclude is skipped."""
        try:
            return data.draw(self.strategy(), label="case")
        except NotApplicable as exc:
            pytest.skip(str(exc))
        except OutsideLimits as exc:
            pytest.skip(f"{self.impl.name}'s declared limits exclude the cases this check needs: {exc}")

    def skip_reason(self) -> str | None:
        limit = backend.limit_for(self.op, self.dtype, self.impl.fn)
        if limit is not None:
            return f"{backend.current()}: {limit.reason}"
        reason = self.impl.unsupported(self.dtype)
        if reason:
            return reason
        reason = self.impl.not_applicable(self.check)
        if reason:
            return f"{reason} ({self.check.name} needs it)"
        if self.check.requires is not None:
            return self.check.requires(self.impl)
        return None

    def run(self, case: Case) -> None:
        """Run the check on ``case``: its verdict, or, for an input a user's implementation
        raised on, the example discarded and the input recorded for the test's verdict at
        its end (tritoncheck/unrunnable.py)."""
        self._write_in_flight(case)
        # every check's comparisons with a reference count toward its vacuity verdict; the
        # reference checks' are also the rows of the tolerance report
        sink = _collector.sink(self, case, rows=self.check.name in RECORDED_CHECKS) if _collector is not None else None
        invalid, refused, broken, start = False, False, False, time.perf_counter()
        config = autotune_configs.each_in_turn(self.impl.fn, CONFIG.autotune_config)
        try:
            with poisoned_allocations_for(self.impl.fn), autotune_configs.pinned_all(self.impl.fn, config), \
                    (recording(sink) if sink is not None else contextlib.nullcontext()):
                self.check.run(case, self.impl)
        except UnsatisfiedAssumption:
            invalid = True
            raise  # Hypothesis discards the example: not a failure, nothing to save
        except OutsideLimits as exc:
            invalid = True
            self._outside_limits(exc)
        except Refused as exc:
            refused = True
            if refusals.refusal_fails(self.impl.kind, CONFIG.refusals, exc.declared):
                if self._records_raised() and CONFIG.refusals == "auto":
                    self._raised(case, exc)
                self._fail_refusal(case, exc)
            if _collector is not None:
                _collector.refuse(self, exc.message, declared=exc.declared,
                                  traceback_text=None if exc.declared else exc.traceback_text())
                self._skip_if_all_refused()
            reject()  # discarded: Hypothesis draws another example in its place
        except Exception as exc:
            error = worker_crashes.broken_context(backend.current())
            if error is not None:
                broken = True  # nothing more on this device: every call would raise it again
                raise self._context_broken(case, exc, error) from exc
            if not isinstance(exc, AssertionError) and self._records_raised():
                refused = True
                self._raised(case, exc)
            self.record.accept(case, keep=self._records_raised())  # it ran: the check judged its outputs
            path = save_failure(self, case, autotune_config=config)
            note = (f"\n{self.check.name} failed for {self.impl.name} on:\n{case.describe()}\n"
                    f"replay: python -m tritoncheck.replay {path}")
            if isinstance(exc, AssertionError):
                # the headline first: JUnit's failure message keeps the first 500 characters
                headline = f"{self.id} failed; replay: python -m tritoncheck.replay {path}"
                raise AssertionError(f"{headline}\n{exc}\n{note}") from None
            if hasattr(exc, "add_note"):
                exc.add_note(note)
            raise
        else:
            self.record.accept(case, keep=self._records_raised())
        finally:
            if not broken:
                devices.release_cache(backend.current())
            if _collector is not None:
                _collector.count(self, invalid, refused, time.perf_counter() - start, case=case)

    @property
    def impl_key(self) -> str:
        return f"{self.op.name}-{self.impl.name}"

    @property
    def record(self) -> unrunnable.Record:
        """What this test's implementation raised on and accepted, in this process."""
        return unrunnable.record_of(self.id, impl=self.impl.name, impl_key=self.impl_key,
                                    dtype=dtype_name(self.dtype), backend=backend.current())

    def _write_in_flight(self, case: Case) -> None:
        """In an xdist worker, ``case`` as the replay file a crash in it would need: a spec of
        shapes and seeds, no tensors (1.4 kB, 0.5 ms an example on this project's 2-core CPU,
        where an example's kernel calls and fp64 reference under the interpreter take tens of
        ms or more)."""
        if _in_flight is not None:
            _in_flight.write_text(json.dumps({"test": self.id, **replay_record(self, case)}))

    def _records_raised(self) -> bool:
        """Whether an input the implementation raised on is recorded and discarded (a user's
        implementation in a run of the plugin), rather than failing the example at once (the
        project's own implementations accept the whole contract; ``verify`` ends on it)."""
        return _collector is not None and self.impl.kind == "user"

    def _raised(self, case: Case, exc: BaseException) -> None:
        """Record ``case`` as an input the implementation raised ``exc`` on (the first of each
        error with its replay files), then end the test if every input so far raised, else
        discard the example."""
        record = self.record
        original = getattr(exc, "original", None) or exc
        new = unrunnable.signature(original) not in record.raised
        path = save_failure(self, case, suffix="-raised") if new else None
        raised = record.add(case, original, str(path) if path else None)
        if _collector is not None:
            _collector.refuse(self, unrunnable.one_line(original), declared=False, traceback_text=raised.traceback_text)
        if record.every_input():
            raise unrunnable.Unrunnable(record.verdict(self.op)) from None
        reject()

    def _outside_limits(self, exc: OutsideLimits) -> None:
        """The check called the implementation outside its declared limits (a value of its
        own, e.g. a softcap of 512 where ``values`` declares softcap in (0.0,)): the example
        is discarded, and a test that ran nothing else in NOT_APPLICABLE_AFTER of them is
        not applicable, skipped with the reason."""
        record = self.record
        record.outside += 1
        if not record.ran and not record.raised and record.outside >= NOT_APPLICABLE_AFTER:
            pytest.skip(f"not applicable: {exc}")
        reject()

    def _context_broken(self, case: Case, exc: BaseException, error: str) -> worker_crashes.ContextBroken:
        """What ends the test at once where ``exc`` left this process's CUDA context broken
        with ``error`` (tritoncheck/worker_crashes.py): every later call would raise it again,
        so Hypothesis's shrinking means nothing. It names the error, the case and its replay."""
        path = save_failure(self, case)
        return worker_crashes.ContextBroken(
            f"{self.id}: {self.check.name} broke the CUDA context of this process for {self.impl.name}: {error}\n"
            f"raised as: {unrunnable.one_line(exc)}\non the last case it started:\n{case.describe()}\n"
            f"replay: python -m tritoncheck.replay {path}\n(CUDA reports a kernel's error at a later call: run the "
            "replay with CUDA_LAUNCH_BLOCKING=1 to see which launch raised it)")

    def _fail_refusal(self, case: Case, exc: Refused) -> None:
        """A refusal that fails the example: the project's own implementations accept the
        whole contract; a user's undeclared refusal is the exception it is, with its
        traceback (``--refusals=discard`` counts it instead); ``--refusals=fail`` fails all."""
        path = save_failure(self, case)
        where = f"{self.check.name} on:\n{case.describe()}\nreplay: python -m tritoncheck.replay {path}"
        if self.impl.kind != "user" or CONFIG.refusals == "fail":
            raise AssertionError(
                f"{self.impl.name} refused the input: {exc.message}\n({self.impl.kind} implementations must accept "
                f"the whole contract; --refusals={CONFIG.refusals})\n{where}\n{exc.traceback_text()}") from None
        original = exc.original
        original.add_note(f"\nan exception out of {self.impl.name}, not a declared refusal: a failure. "
                          f"{refusals.how_to_declare(self.impl.name)}.\n{where}")
        raise original from None

    def _skip_if_all_refused(self) -> None:
        """Hypothesis would draw hundreds of cases before giving up on an implementation
        that refuses them all (each after the fp64 reference, for gradient checks): a
        test with ALL_REFUSED_AFTER refusals and no accepted example is skipped with them.
        Only when they were all declared: an implementation that says it takes none of
        this check's inputs is not checked by it, and says why; undeclared refusals
        (--refusals=discard) fail instead (:func:`unearned_pass` says how)."""
        refused = _collector.refusals_of(self.id)
        n = sum(refused.values())
        # this example is refused but not yet counted (``count`` runs in run's ``finally``)
        if n >= refusals.ALL_REFUSED_AFTER and _collector.examples[self.id] + 1 == n + _collector.invalid[self.id]:
            undeclared = _collector.undeclared_of(self.id)
            if undeclared:
                # pytest's outcome, not an AssertionError: Hypothesis would try to shrink
                # a verdict that depends on the count, not on the example
                pytest.fail(f"every example was refused ({n} drawn), {sum(undeclared.values())} of them by "
                            f"undeclared refusals: {refusals.summarise(undeclared)}\n"
                            f"{refusals.how_to_declare(self.impl.name)}\nthe first, with its traceback:\n"
                            f"{_collector.first_traceback.get(self.id, '')}", pytrace=False)
            pytest.skip(f"every example was refused ({n} drawn): {refusals.summarise(refused)}")


# test id -> [(length class, row length, "ran" or why not)]: what run_length_classes did
length_classes_run: dict[str, list[tuple[str, int, str]]] = {}


def _first_draw(target: Target, body) -> None:
    """``body(case)`` on the first case of ``target``'s strategy that it accepts (a case
    that a precondition discards or the implementation refuses is replaced, as in the
    test itself), derandomized: the same case in every run of every profile."""
    @settings(max_examples=1, derandomize=True, database=None, deadline=None, print_blob=False,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def length_class_example(data):
        body(target.draw(data))

    length_class_example()


def length_classes_of(target: Target) -> dict[str, int]:
    """The length classes (``strategies.LENGTH_CLASSES``) that ``target``'s row lengths
    reach, with their lengths (empty for a check whose cases have no row length drawn by
    ``strategies.lengths``, or that the declared limits exclude: the test skips)."""
    try:
        return strategies.length_classes_reached(target.strategy())
    except OutsideLimits:
        return {}


def run_length_classes(target: Target) -> list[tuple[str, int, str]]:
    """Run ``target``'s check once at each length class its rows can reach, the rest of
    each case drawn as ever (derandomized), before Hypothesis draws at random: coverage
    by intent of the sizes kernels and cheats key on. A failure fails the test as any
    example's does (the case in words and its replay). A class whose every draw was
    discarded (the check's preconditions) or refused is recorded as such, not run."""
    done = []
    for name, n in length_classes_of(target).items():
        try:
            with strategies.pinned_length_class(name):
                _first_draw(target, target.run)
            done.append((name, n, "ran"))
        except Unsatisfiable:
            done.append((name, n, "every draw discarded or refused"))
        except Exception as exc:
            exc.add_note(f"(at the length class {name}, a row of {n}: tried on purpose before the random draws)")
            raise
    length_classes_run[target.id] = done
    return done


def account_refusals(target: Target, excinfo, report, item) -> None:
    """The verdict's part of what ``target``'s implementation refused: a test in which
    Hypothesis found no accepted example (``Unsatisfiable``, before ALL_REFUSED_AFTER) is
    skipped with the refusals, as ``Target._skip_if_all_refused`` skips one past it; a
    failure or a pass lists the refusals it saw beside it."""
    from hypothesis.errors import Unsatisfiable
    refused = _collector.refusals_of(target.id) if _collector is not None else {}
    if not refused:
        return
    if report.failed and excinfo is not None and excinfo.errisinstance(Unsatisfiable) \
            and not _collector.undeclared_of(target.id):  # undeclared ones never make a skip: it stays failed
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: every example was refused: {refusals.summarise(refused)}")
        return
    report.sections.append(("refusals", f"{sum(refused.values())} example(s) refused by the implementation: "
                                        f"{refusals.summarise(refused, limit=10)}"))


def finish(target: Target, exhausted: bool = False) -> None:
    """The end of a test whose examples all passed: it fails where its implementation raised
    on inputs (:func:`raised_inputs_verdict`; skipped instead where every error was the
    Triton interpreter's) or where the pass was not earned (:func:`unearned_pass`; its
    minimum of counted examples is moot where raised inputs took them)."""
    verdict = raised_inputs_verdict(target, judged="each passed the check")
    if verdict is not None and verdict.skip:
        pytest.skip(verdict.text)
    problems = [verdict.text] if verdict is not None else []
    problem = unearned_pass(target, exhausted or verdict is not None)
    if problem:
        problems.append(problem)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def raised_inputs_verdict(target: Target, judged: str | None = None) -> unrunnable.Verdict | None:
    """The verdict on the inputs ``target``'s implementation raised on in this process, or None."""
    record = unrunnable.recorded(target.id)
    return record.verdict(target.op, judged) if record is not None else None


def unearned_pass(target: Target, exhausted: bool = False) -> str | None:
    """Why ``target``'s test must fail although every example that ran passed, or None:
    most examples were vacuous (:func:`vacuity_failure`), undeclared refusals took more
    than their share (:func:`undeclared_refusal_failure`), or too few examples counted
    (:func:`below_min_counted`; ``exhausted``: Hypothesis tried every case there is)."""
    problems = [p for p in (vacuity_failure(target), undeclared_refusal_failure(target),
                            below_min_counted(target, exhausted)) if p]
    return "\n".join(problems) or None


def undeclared_refusal_failure(target: Target) -> str | None:
    """Under ``--refusals=discard``: a test in which undeclared refusals took more than
    ``refusals.UNDECLARED_SHARE_MAX`` of the examples fails, naming their messages and
    the first one's traceback (the default, ``auto``, fails a test with the inputs its
    implementation raised on: :func:`raised_inputs_verdict`)."""
    record = unrunnable.recorded(target.id)
    if _collector is None or (record is not None and record.raised):  # the raised inputs' verdict says it
        return None
    undeclared = _collector.undeclared_of(target.id)
    n, examples = sum(undeclared.values()), _collector.examples[target.id]
    if not examples or n <= refusals.UNDECLARED_SHARE_MAX * examples:
        return None
    return (f"{target.id}: {n} of {examples} examples ({n / examples:.0%}) raised undeclared refusals, more than "
            f"{refusals.UNDECLARED_SHARE_MAX:.0%}: {refusals.summarise(undeclared, limit=5)}\n"
            f"{refusals.how_to_declare(target.impl.name)}\nthe first, with its traceback:\n"
            f"{_collector.first_traceback.get(target.id, '')}")


def below_min_counted(target: Target, exhausted: bool = False) -> str | None:
    """A test in which fewer than the run's minimum of examples counted has not been
    reached, and fails with where its examples went.

    A failure, not a skip: every example that ran passed, but a pass on a handful of
    examples says the check held on the stated budget when it was not run on it. The
    cause is a broken promise either way: the suite's strategies drawing cases that its
    own preconditions (assume) then discard, which must be fixed there, or an
    implementation refusing nearly everything the check draws, which its declared
    limits should have kept from being drawn. A skip would be counted beside the
    skips that are right (a dtype the kernel does not take) and read as one. Not
    applied when Hypothesis ran out of distinct cases (``exhausted``): then every case
    there is was run."""
    if _collector is None or _min_counted is None or exhausted:
        return None
    counted = _collector.counted(target.id)
    if counted >= _min_counted:
        return None
    refused = _collector.refusals_of(target.id)
    return (f"{target.id}: not reached: {counted} example(s) counted, fewer than the minimum of {_min_counted} "
            f"(half the run's examples): of {_collector.examples[target.id]} run, {_collector.invalid[target.id]} "
            f"were discarded by the check's preconditions (assume) and {sum(refused.values())} refused"
            + (f" ({refusals.summarise(refused)})" if refused else ""))


def vacuity_failure(target: Target) -> str | None:
    """:func:`vacuous_test` for a registry check, naming the rule of the compared outputs:
    the op's for the reference checks, the check's own for a property."""
    if target.check.name == "gradients_match_reference":
        rule = rule_name(target.op.grad_tolerance)
    elif target.check.name == "matches_reference":
        rule = rule_name(target.op.tolerance)
    else:
        rule = f"the rule that {rule_name(target.check.run)} compares with"
    return vacuous_test(target.id, rule)


def vacuous_test(test_id: str, rule: str) -> str | None:
    """Why the test ``test_id`` must fail although every example passed, or None.

    The policy: an example is vacuous for an output when more than half of that
    output's counted elements would have accepted 0 (``Comparison.mostly_vacuous``);
    a test in which at least ``oracle.VACUOUS_EXAMPLES_MAX`` (half) of the examples that
    compared an output, and at least ``VACUOUS_EXAMPLES_MIN``, were vacuous for it has not
    shown that the output is right, so it
    fails, naming the output and the tolerance ``rule``. Fewer vacuous examples show in
    the report only (``vacuous`` and ``vacuous_examples`` per output)."""
    if _collector is None:
        return None
    problems = [f"output {output!r}: {vacuous} of {examples} examples were vacuous, at least "
                f"{VACUOUS_EXAMPLES_MAX:.0%} (the allowance of {rule} reached |expected| in most elements, so an "
                "output of 0 would have passed)"
                for output, (examples, vacuous) in sorted(_collector.vacuity.get(test_id, {}).items())
                if vacuous >= max(VACUOUS_EXAMPLES_MIN, VACUOUS_EXAMPLES_MAX * examples)]
    if not problems:
        return None
    return (f"{test_id}: every example passed, but the check could not have failed in too many of them:\n  "
            + "\n  ".join(problems))


# Hypothesis's "Failing test case: test_check(target=...)" would print the whole registry
# record; the case is already printed in words above it, so name the target by its id.
pretty.for_type_by_name(__name__, "Target", lambda target, p, cycle: p.text(f"Target({target.id!r})"))


def replay_record(target: Target, case: Case, autotune_config: int | None = None) -> dict:
    """What ``python -m tritoncheck.replay`` reads: the check, the implementation and the case,
    and the autotune config its declared autotuned kernels ran (None: autotuning)."""
    record = {"check": target.check.name, "impl": target.impl.target, "impl_name": target.impl.name,
              "backend": backend.current(), "case": case.to_json()}
    if autotune_config is not None:
        record["autotune_config"] = autotune_config
    if target.op.origin:  # a defined op (tritoncheck.op): the module a replay imports to find it
        record["definition"] = target.op.origin
    return record


def save_failure(target: Target, case: Case, suffix: str = "", autotune_config: int | None = None) -> Path:
    """Write what replays the failure: ``<id><suffix>.json`` (the case, for
    ``python -m tritoncheck.replay``), ``<id>.pt`` (the inputs themselves, strides and
    storage offsets included) and ``<id>.py`` (a script that needs neither pytest nor
    Hypothesis: it loads the inputs, runs the implementation and the fp64 reference,
    prints the error, then replays the failed check)."""
    folder = Path(CONFIG.report_dir) / "failures"
    folder.mkdir(parents=True, exist_ok=True)
    stem = failure_stem(target.id) + suffix
    path = folder / f"{stem}.json"
    path.write_text(json.dumps(replay_record(target, case, autotune_config), indent=1))
    torch.save(case.materialise("cpu"), folder / f"{stem}.pt")
    (folder / f"{stem}.py").write_text(_SCRIPT.format(
        id=target.id, check=target.check.name, impl=target.impl.target, op=target.op.name,
        definition=target.op.origin.partition(":")[0],
        args=tuple(case.args), kwargs=dict(case.kwargs), outputs=tuple(target.op.outputs), stem=stem,
        backend=backend.current(), root=Path(__file__).resolve().parents[1], cwd=Path.cwd()))
    return path


_SCRIPT = '''"""Standalone reproducer for {id} (written by the suite; no pytest or Hypothesis needed).

Run from the directory the suite ran in:  python {stem}.py   (or: python -m tritoncheck.replay {stem}.json)
"""
import importlib
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the implementation imports as it did in the run (from its directory, first); tritoncheck
# from where it is installed, else from the checkout that wrote this file (last: its
# kernels/ must not shadow a user's package of that name)
sys.path.insert(0, os.getcwd())
sys.path.insert(1, "{cwd}")
sys.path.append("{root}")
os.environ.setdefault("TRITON_INTERPRET", "1" if "{backend}" == "interpret" else "0")
import numpy as np  # noqa: E402
import torch  # noqa: E402


def load(target):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


device = "cuda" if "{backend}" == "cuda" else "cpu"
# data only: a case shared as a CI artefact or a bug report must not run code when loaded
inputs = {{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in torch.load(HERE / "{stem}.pt", weights_only=True).items()}}
args = [inputs[a] for a in {args}]
from tritoncheck import registry  # noqa: E402

if "{definition}":  # an op defined with tritoncheck.op: its module registers it
    importlib.import_module("{definition}")
impl, reference = load("{impl}"), registry.load()["{op}"].reference

# called as the run called it: its signature, declared argument names, layout and returns
under_test = registry.Implementation.of("{op}", impl)
got = under_test.outputs(under_test.call(inputs, {args}, {kwargs}))
try:
    expected = reference(*[a.detach().cpu().double().numpy() if torch.is_tensor(a) and a.is_floating_point()
                           else (a.cpu().numpy() if torch.is_tensor(a) else a) for a in args])
    expected = expected if isinstance(expected, tuple) else (expected,)
except ValueError as exc:  # dropout: the reference needs the implementation's own mask
    print(f"no fp64 reference from these arguments alone: {{exc}}")
    expected = ()
for name, e in zip({outputs}, expected):
    if name not in got:  # an output it does not return (declared returns)
        continue
    g = got[name].detach().cpu().double().numpy()
    err = np.where(np.isfinite(e) & np.isfinite(g), np.abs(g - e), np.where(np.isnan(e) == np.isnan(g), 0.0, np.inf))
    i = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
    print(f"{op} output {{name}}: max |error| {{err.max() if err.size else 0:.3g}} at {{list(map(int, i))}} "
          f"(expected {{e[i] if err.size else 0:.9g}}, got {{g[i] if err.size else 0:.9g}})")
print("replaying the failed check, {check}:")
from tritoncheck import replay  # noqa: E402

sys.exit(replay.main([str(HERE / "{stem}.json")]))
'''


def targets() -> list[Target]:
    """Every (op, implementation, dtype, check) of the run; ``--op`` names outside the
    registry (the distributed ``cp_attention``, run on ranks) select none here."""
    ops = registry.load()
    chosen = tuple(o for o in CONFIG.ops if o in ops) if CONFIG.ops else tuple(ops)
    out = []
    for name in chosen:
        op = ops[name]
        for impl in registry.implementations(name):
            for dtype in op.dtypes:
                if CONFIG.dtypes and dtype not in CONFIG.dtypes:
                    continue
                out.extend(Target(op, impl, dtype, check) for check in op.checks)
    return out


def params(items: list[Target]) -> list:
    """pytest parameters: skips and expected failures carry their reasons."""
    out = []
    for t in items:
        marks = []
        reason = t.skip_reason()
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        elif (expected := t.impl.expected_failure(t.check.name, t.dtype)) is not None:
            marks.append(pytest.mark.xfail(reason=expected.reason, strict=expected.strict))
        out.append(pytest.param(t, id=t.id, marks=marks))
    return out
