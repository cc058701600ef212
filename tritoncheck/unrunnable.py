"""Implementations that cannot run: the same error on every input, reported once and at once.

A missing optional dependency (``ModuleNotFoundError`` from an import inside the
function), a wrapper that cannot bind the arguments, a kernel the Triton interpreter
cannot execute (``InterpreterError: AttributeError("'float' object has no attribute
'to'")``): the implementation raises the same exception whatever it is given. Left
alone, every test of the op fails on its first example and Hypothesis then shrinks
that failure, rerunning it hundreds of times for a minimal case that says nothing the
first one did not (13 tests at about 30 s each for one missing module, issue 25).

The rule, applied per process (each pytest-xdist worker learns it on its own, at the
cost of one extra example):

1. The first exception of a test that is not a check's ``AssertionError`` (nor a
   declared refusal, nor Hypothesis's or pytest's own control flow) is retried once, on a
   second case drawn in the same example, different from the first where the strategy
   allows. Raising the same exception again (type and message: :func:`signature`) makes
   it the implementation's *constant error*; anything else (a pass, a wrong value, a
   different error) leaves the first failure to be what it is, shrunk as usual.
2. A constant error ends the test at once with one verdict, :class:`Unrunnable`, raised
   as a ``BaseException`` that Hypothesis neither catches nor shrinks. Later tests of the
   same implementation run as usual, and end at once on their first example that raises
   that same error: a check that never reaches the failing code (the forward checks of a
   kernel whose backward imports a missing module) still gets its own verdict, and a
   wrong value is an ``AssertionError``, never matched, so it fails and shrinks as ever.
3. Under the Triton interpreter an ``InterpreterError`` as the constant error is not a
   verdict on the kernel at all: the plugin reports such tests skipped, "does not run
   under the interpreter", with the error and the advice to run on a GPU; a run in which
   nothing else ran then ends as a run that verified nothing (exit status 1).

Why not stop every later test of the implementation at once: the first constant error
may sit on one path only (the backward, one variant's binding), and failing the checks
that never take that path would call a verdict on them that nobody made. The cost of
running them is one example each before the known error ends them.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Callable

INTERPRETER_ERROR = "InterpreterError"  # triton.runtime.errors.InterpreterError, matched by name (no triton import)
PROPERTY = "tritoncheck_unrunnable"  # the key of the verdict in a test report's user_properties
TRACEBACK_FRAMES = 12


def signature(exc: BaseException) -> tuple[str, str]:
    """What makes two exceptions "the same error": the type's qualified name and the
    message (notes excluded, so the suite's own case description does not count). A
    wrapped refusal (``refusals.Refused``) is judged by the exception it wraps."""
    exc = getattr(exc, "original", None) or exc
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}", str(exc)


@dataclass(frozen=True)
class ConstantError:
    """An implementation's error that two different inputs raised the same."""

    impl: str
    signature: tuple[str, str]
    first_test: str
    traceback_text: str
    under_interpreter: bool

    @property
    def error(self) -> str:
        kind, message = self.signature
        return f"{kind.rpartition('.')[2]}: {message}" if message else kind.rpartition(".")[2]

    def verdict(self) -> str:
        """The one line that says what happened and what to do."""
        if self.under_interpreter:
            return (f"{self.impl} does not run under the Triton interpreter: {self.error} on every input "
                    "tried. Not a verdict on its numerics: run it on a GPU (--backend cuda).")
        return (f"{self.impl} raises the same error on every input tried: {self.error}. Each test that reaches "
                "it ends at once with this verdict (not shrunk); fix it (a missing dependency? an import inside "
                "the function?) and run again.")

    def summary(self) -> str:
        """The verdict, the test that found it and its traceback: the run's summary, once."""
        return f"{self.verdict()}\n(first seen in {self.first_test}; its traceback:)\n{self.traceback_text}"

    def text(self, test_id: str) -> str:
        """The verdict with the traceback in the test that found it; elsewhere the verdict
        and where that test is (the traceback once is enough; the summary repeats it)."""
        if test_id != self.first_test:
            return f"{self.verdict()}\n(first seen in {self.first_test}, with its traceback)"
        return f"{self.verdict()}\n(first seen in this test; its traceback:)\n{self.traceback_text}"


class Unrunnable(BaseException):  # noqa: N818 - a verdict, raised to end the test, not an error of the suite
    """Ends a test with a :class:`ConstantError`. A ``BaseException`` outside Hypothesis's
    failure types (``Exception``, pytest's ``Failed``), so Hypothesis stops at once instead
    of shrinking; the plugin turns it into the test's report (failed, or skipped under the
    interpreter)."""

    def __init__(self, error: ConstantError, test_id: str):
        self.error, self.test_id = error, test_id
        super().__init__(error.text(test_id))


# per process: each xdist worker learns its own, from its own tests
_known: dict[str, dict[tuple[str, str], ConstantError]] = {}  # impl key -> signature -> error
_retried: set[str] = set()  # test ids whose first exception was retried


def reset() -> None:
    """Forget what this process learnt (tests of this module)."""
    _known.clear()
    _retried.clear()


def known(impl_key: str) -> list[ConstantError]:
    return list(_known.get(impl_key, {}).values())


def judge(exc: BaseException, *, impl_key: str, impl_name: str, test_id: str, backend: str,
          retry: Callable[[], None] | None) -> None:
    """Raise :class:`Unrunnable` when ``exc`` is ``impl_key``'s constant error, known or
    found now by ``retry`` (which runs the check on a second case); return otherwise, and
    the caller re-raises ``exc``. Called for exceptions that are not a check's
    ``AssertionError``, a declared refusal or control flow."""
    sig = signature(exc)
    found = _known.get(impl_key, {}).get(sig)
    if found is not None:
        raise Unrunnable(found, test_id) from None
    if retry is None or test_id in _retried:
        return
    _retried.add(test_id)
    try:
        retry()
    except Exception as again:  # noqa: BLE001 - any exception is compared, none is swallowed
        if signature(again) != sig:
            return
    else:
        return
    frames = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-TRACEBACK_FRAMES))
    error = ConstantError(impl_name, sig, test_id, frames,
                          under_interpreter=backend == "interpret" and sig[0].endswith(f".{INTERPRETER_ERROR}"))
    _known.setdefault(impl_key, {})[sig] = error
    raise Unrunnable(error, test_id) from None
