"""Inputs an implementation raised on: recorded, the other inputs judged, one verdict at the end.

A user's implementation that raises on an input (not a check's ``AssertionError``, not a
declared refusal) fails its test, always: a crash never passes. What the verdict says is
what was seen (issue 36). A rope that refuses cos in another dtype than x, or a
causal-only attention, raises on part of the domain; a missing optional dependency raises
on every input. Each input it raised on is recorded and discarded (Hypothesis draws
another in its place), so that the check still judges the inputs the implementation
accepts: a wrong value there fails and shrinks as ever. At the test's end (in the plugin,
``harness.raised_inputs_failure``) the test fails with each error, on how many of how many
inputs, what sets those inputs apart from the accepted ones (tritoncheck/case_contrast.py:
"on every input with causal=False (6 of 6 such inputs); inputs with causal=True were
accepted"), the declaration that would say so where the limits vocabulary has one, the
first such input with its replay file, and its traceback.

A test whose first :data:`EVERY_INPUT_AFTER` distinct inputs all raised, none accepted,
ends at once with that verdict ("on every input this test tried"), as a ``BaseException``
(:class:`Unrunnable`) that Hypothesis neither catches nor shrinks: an implementation that
cannot run at all (a missing module) costs each test ten quick examples, not a budget of
draws. Nothing is carried from one test to another: each test, each dtype, judges its own
inputs (a float16 verdict once ended the bfloat16 tests, and one edge-case input the first
test drew ended every test of the op). The plugin's summary joins the tests of one
implementation and error, per dtype, and says once where every dtype was the same.

Under the Triton interpreter an ``InterpreterError`` is the interpreter's limit, not a
verdict on the kernel: a test whose only errors are such is skipped with the advice to run
on a GPU (a run in which nothing else ran then verified nothing, exit status 1).

Only an ``ImportError`` (``ModuleNotFoundError``) is called a missing dependency; any other
error gets the advice to declare what the implementation does not take, if it does not
take it on purpose (``fn.limits``, ``fn.refuses``, ``tritoncheck.Refusal``), or to fix it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from tritoncheck import case_contrast, refusals
from tritoncheck.strategies import Case

INTERPRETER_ERROR = "InterpreterError"  # triton.runtime.errors.InterpreterError, matched by name (no triton import)
PROPERTY = "tritoncheck_unrunnable"  # the key of the summary entries in a test report's user_properties
TRACEBACK_FRAMES = 12
# Distinct inputs raised on, none accepted, after which a test ends at once. Ten: the quick
# profile's budget; a part of the domain that takes 80 % of the draws still shows an
# accepted input among ten with probability 0.89, and the verdict says how many were tried.
EVERY_INPUT_AFTER = 10
# Messages that differ only in their numbers ("rows of 1024", "rows of 2049") or dtype names
# ("cos has dtype float32 but x ...", "cos has dtype bfloat16 but x ...") are one error.
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(\.\d+)?(e[-+]?\d+)?(?![\w.])")
_DTYPE = re.compile(r"\b(torch\.)?(b?float|half|double|u?int|bool|complex)(\d+)?\b")
_REGEX_SPECIAL = re.compile(r"([.^$*+?{}\[\]\\|()])")


def signature(exc: BaseException) -> tuple[str, str]:
    """What makes two exceptions the same error: the type's qualified name and the first
    line of the message up to its numbers (notes excluded). A wrapped refusal
    (``refusals.Refused``) is judged by the exception it wraps."""
    exc = getattr(exc, "original", None) or exc
    kind = type(exc)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{kind.__module__}.{kind.__qualname__}", _NUMBER.sub("#", _DTYPE.sub("<dtype>", first))


_COMPILE_LOCATION = re.compile(r"at \d+:\d+:")


def headline(exc: BaseException) -> str:
    """The first line of ``exc``'s message; for Triton's CompilationError, whose first line is
    only a location (``at 52:20:``, the source and a caret following), also the source line
    it points at and the error it wraps (a bare ``AssertionError`` inside ``tl.dot``, say):
    without them a verdict said "raised CompilationError: at 52:20:" and nothing more."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    if _COMPILE_LOCATION.fullmatch(first.strip()):
        caret = next((i for i, line in enumerate(lines) if line.strip() == "^"), None)
        where = lines[caret - 1].strip() if caret else ""
        cause = exc.__cause__
        why = (f"{type(cause).__name__}: {headline(cause)}".rstrip(": ") if cause is not None else "")
        first = " ".join(p for p in (first, where, f"({why})" if why else "") if p)
    return first


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, as the report counts it."""
    first = headline(exc)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def refuses_pattern(message: str) -> str:
    """A ``fn.refuses`` pattern for ``message`` (as a raw string literal): its first line, its
    numbers and dtype names matching any number and any dtype name."""
    first = message.strip().splitlines()[0][:120] if message.strip() else ""
    out, last = [], 0
    holes = sorted([(m.start(), m.end(), r"[-+.\de]+") for m in _NUMBER.finditer(first)]
                   + [(m.start(), m.end(), r"[\w.]+") for m in _DTYPE.finditer(first)])
    for start, end, hole in holes:
        if start < last:
            continue
        out += [_REGEX_SPECIAL.sub(r"\\\1", first[last:start]), hole]
        last = end
    pattern = "".join([*out, _REGEX_SPECIAL.sub(r"\\\1", first[last:])])
    return f'r"{pattern}"' if '"' not in pattern and not pattern.endswith("\\") else repr(pattern)


@dataclass
class Raised:
    """One error (:func:`signature`) of one test: the inputs it was raised on, in order."""

    kind: str
    message: str  # the first one's first line
    cases: list[Case]
    traceback_text: str
    replay: str | None
    import_error: bool
    interpreter: bool  # an InterpreterError under the interpreter
    shown_in: str | None = None  # the earlier test of this process that printed its traceback, if any

    @property
    def error(self) -> str:
        name = self.kind.rpartition(".")[2]
        return f"{name}: {self.message}" if self.message else name


@dataclass(frozen=True)
class Entry:
    """One line of the run's summary: an implementation's error in one dtype, and where."""

    impl: str
    dtype: str
    error: str
    where: str  # "on every input tried", or the inputs it was raised on


@dataclass(frozen=True)
class Verdict:
    """A test's verdict on the inputs its implementation raised on: ``text`` (the failure,
    or the skip's reason where ``skip``), and the summary's entries."""

    text: str
    skip: bool
    entries: tuple[Entry, ...]


class Unrunnable(BaseException):  # noqa: N818 - a verdict, raised to end the test, not an error of the suite
    """Ends a test whose every input raised, with its :class:`Verdict`. A ``BaseException``
    outside Hypothesis's failure types (``Exception``, pytest's ``Failed``), so Hypothesis
    stops at once instead of shrinking; the plugin turns it into the test's report."""

    def __init__(self, verdict: Verdict):
        self.verdict = verdict
        super().__init__(verdict.text)


@dataclass
class Record:
    """What one test's implementation raised on and what it accepted (ran to the end)."""

    test_id: str
    impl: str  # the implementation's name
    impl_key: str  # op-impl
    dtype: str
    backend: str
    raised: dict[tuple[str, str], Raised] = field(default_factory=dict)
    accepted: list[Case] = field(default_factory=list)
    ran: int = 0  # examples that ran the check to the end, kept or not
    outside: int = 0  # examples discarded for a call outside the declared limits (harness.Target._outside_limits)
    _seen: set = field(default_factory=set)

    def accept(self, case: Case, keep: bool = True) -> None:
        """Count ``case`` as run to the end; ``keep`` it (once) for the verdict's contrast,
        where its implementation's raised inputs are recorded (not the project's own: their
        cases would only take memory, hundreds of thousands in a nightly run)."""
        self.ran += 1
        key = ("accepted", case.describe()) if keep else None
        if keep and key not in self._seen:
            self._seen.add(key)
            self.accepted.append(case)

    def add(self, case: Case, exc: BaseException, replay: str | None) -> Raised:
        """Record that ``exc`` was raised on ``case`` (its traceback and replay kept for the first)."""
        exc = getattr(exc, "original", None) or exc
        sig = signature(exc)
        found = self.raised.get(sig)
        if found is None:
            frames = refusals.code_under_test_traceback(exc, TRACEBACK_FRAMES)
            first = headline(exc)
            found = self.raised[sig] = Raised(
                sig[0], first, [], frames, replay, import_error=isinstance(exc, ImportError),
                interpreter=self.backend == "interpret" and sig[0].endswith(f".{INTERPRETER_ERROR}"),
                shown_in=_tracebacks.setdefault((self.impl_key, sig), self.test_id))
            if found.shown_in == self.test_id:
                found.shown_in = None
        key = (sig, case.describe())
        if key not in self._seen:
            self._seen.add(key)
            found.cases.append(case)
        return found

    def raised_count(self) -> int:
        return sum(len(r.cases) for r in self.raised.values())

    def every_input(self) -> bool:
        """Whether the test has seen enough to end: EVERY_INPUT_AFTER inputs raised, none accepted."""
        return not self.accepted and self.raised_count() >= EVERY_INPUT_AFTER

    def verdict(self, op, judged: str | None = None) -> Verdict | None:
        """The verdict on what was raised, or None. ``judged`` says what became of the
        accepted inputs ("each passed the check"), where the caller knows."""
        if not self.raised:
            return None
        total = self.raised_count() + len(self.accepted)
        blocks, entries = [], []
        for raised in sorted(self.raised.values(), key=lambda r: -len(r.cases)):
            where, text = self._where(op, raised, total, judged)
            entries.append(Entry(self.impl_key, self.dtype, raised.error, where))
            blocks.append(text)
        skip = all(r.interpreter for r in self.raised.values())
        return Verdict(f"{self.test_id}: " + "\n\n".join(blocks), skip, tuple(entries))

    def _where(self, op, raised: Raised, total: int, judged: str | None) -> tuple[str, str]:
        n = len(raised.cases)
        head = f"{self.impl} raised {raised.error} on {n} of the {total} inputs this test tried"
        accepted = len(self.accepted)
        splits = case_contrast.contrast(op, raised.cases, self.accepted)
        if not self.accepted:
            where = "on every input tried"
            ended = "; the test ended there" if self.every_input() else ""
            seen = f"{where} ({n} of {n}{ended}): none was accepted, so nothing tells the inputs it raised on apart"
        elif splits:
            where = f"on inputs with {splits[0].inside}"
            such = sum(splits[0].holds(c) for r in self.raised.values() for c in r.cases)
            count = f"{n} of {n} such inputs" if such == n else \
                f"{n} of the {such} such inputs; the other {such - n} raised another error"
            seen = (f"on every input with {splits[0].inside} ({count}); the {accepted} input(s) with "
                    f"{splits[0].outside} were accepted{f' ({judged})' if judged else ''}")
            if len(splits) > 1:
                seen += f"; the same inputs also had {' and '.join(s.inside for s in splits[1:])}"
        else:
            where = "on some inputs"
            seen = (f"no single property of the drawn cases sets them apart from the {accepted} accepted input(s)"
                    f"{f' ({judged})' if judged else ''}")
        first = raised.cases[0]
        replay = f"\nreplay: python -m tritoncheck.replay {raised.replay}" if raised.replay else ""
        frames = f"its traceback: as in {raised.shown_in}" if raised.shown_in else \
            f"its traceback:\n{raised.traceback_text}"
        text = (f"{head}: {seen}.\n{self._advice(op, raised, splits)}\nthe first such input:\n{first.describe()}"
                f"{replay}\n{frames}")
        return where, text

    def _advice(self, op, raised: Raised, splits: list) -> str:
        if raised.interpreter:
            return ("Not a verdict on its numerics: it does not run under the Triton interpreter there; run it on "
                    "a GPU (--backend cuda).")
        if raised.import_error:
            return ("A missing dependency? Install it, or import it where the implementation is loaded so that its "
                    "absence is seen there.")
        kind = raised.kind.rpartition(".")[2]
        pattern = refuses_pattern(raised.message)
        from tritoncheck.declarations import REFUSAL_TYPES
        refuses = pattern if kind in {t.__name__ for t in REFUSAL_TYPES} else f"({kind}, {pattern})"
        declared = _declaration(op, self.impl, splits)
        limits = f"{self.impl}.limits = {declared!r} (the strategies then draw inside it), " if declared else ""
        return (f"This is not a declared refusal, so the test fails. If {self.impl} does not take such inputs on "
                f"purpose, declare it: {limits}{self.impl}.refuses = {refuses}, or raise tritoncheck.Refusal; if it "
                "should take them, it is a bug.")


def _declaration(op, name: str, splits: list) -> dict | None:
    """The first split's limits, validated against the op (the names of every split's
    ``same_dtype`` joined: cos and sin drawn together split the same way)."""
    from tritoncheck.limits import Limits
    declared = next((dict(s.limits) for s in splits if s.limits), None)
    if declared is None:
        return None
    if "same_dtype" in declared:
        declared["same_dtype"] = tuple(dict.fromkeys(n for s in splits for n in (s.limits or {}).get("same_dtype", ())))
    try:
        Limits.parse(op, declared, name)
    except (TypeError, ValueError):
        return None
    return declared


# per process: each test's own record (a test runs in one process, xdist worker or not)
_records: dict[str, Record] = {}
# per process: (impl key, error) -> the test that printed its traceback (later ones point there)
_tracebacks: dict[tuple, str] = {}


def reset() -> None:
    """Forget what this process recorded (tests of this module)."""
    _records.clear()
    _tracebacks.clear()


def record_of(test_id: str, **fields) -> Record:
    """The record of ``test_id``, created with ``fields`` (impl, impl_key, dtype, backend) on first use."""
    if test_id not in _records:
        _records[test_id] = Record(test_id, **fields)
    return _records[test_id]


def recorded(test_id: str) -> Record | None:
    return _records.get(test_id)


def summary_lines(entries: list[Entry]) -> list[str]:
    """The run's summary: one line per implementation, error and place, naming its dtypes
    and tests (one line for the whole op where every dtype saw the same)."""
    grouped: dict[tuple[str, str, str], dict[str, int]] = {}
    for e in entries:
        tally = grouped.setdefault((e.impl, e.error, e.where), {})
        tally[e.dtype] = tally.get(e.dtype, 0) + 1
    lines = []
    for (impl, error, where), dtypes in sorted(grouped.items()):
        n = sum(dtypes.values())
        per = ": " + ", ".join(f"{d} ({k})" for d, k in sorted(dtypes.items())) if len(dtypes) > 1 \
            else f" of {next(iter(dtypes))}"
        lines.append(f"{impl} raised {error} {where}, in {n} test{'s' if n > 1 else ''}{per}")
    return lines
