"""Refusals: an implementation declining, on purpose, an input it does not accept.

A refusal is what the implementation says is one, never what an exception looks like:
a ``TypeError`` from a typo (``torch.softmax(x, dtpye=...)``) and a ``ValueError`` from
a wrapper that declines long rows are the same to an ``except`` clause. Declared, and
so a refusal:

- :class:`Refusal` (``tritoncheck.Refusal``, a ``ValueError``), or a subclass, raised
  by the implementation: a wrapper written against the suite says so where it refuses;
- an exception that matches ``fn.refuses`` (validated by
  ``tritoncheck.declarations.refuses``): a message pattern for ``ValueError``,
  ``TypeError`` and ``NotImplementedError``, or an ``(exception type, pattern)`` pair
  for a kernel whose refusals it cannot change (an extension's ``RuntimeError``);
- best of all ``fn.limits`` (tritoncheck/limits.py): the strategies draw inside it, so
  nothing is refused and no example is lost.

A ``ValueError``, ``TypeError`` or ``NotImplementedError`` raised out of the
implementation's own frames that no declaration covers is an *undeclared* refusal. By
default (``--refusals auto``) it fails the test with its traceback, as every other
exception does (a user's: at the test's end, the other inputs judged first, with where it
was raised: tritoncheck/unrunnable.py); ``--refusals discard`` counts it as a refusal instead, but a test in
which undeclared refusals took more than :data:`UNDECLARED_SHARE_MAX` of the examples
fails, naming their messages and the first traceback (``harness.unearned_pass``), so
that an undeclared refusal never makes a silent pass. Declared refusals are discarded
(Hypothesis draws another example in their place) and counted; the project's own
kernels, mutants and controls accept the whole contract, so under ``auto`` any refusal
of theirs fails. ``--refusals fail`` fails every refusal, declared or not.

Never a refusal, whatever the declarations say: an ``AssertionError``; an exception
raised while binding the contract's arguments (a signature that does not follow the
contract); and anything raised after the implementation returned (a wrong result, the
suite's own checks, the backward). Never an undeclared refusal (so always a failure):
any other exception type, and an error raised inside Triton's launch or compile
machinery or its interpreter (a kernel that breaks, not a wrapper that declines).
"""
from __future__ import annotations

import functools
import importlib.util
import re
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

MODES = ("auto", "discard", "fail")  # auto: fail for the project's own implementations, declared ones discarded for users'
_OWNED = ("kernel", "mutant", "control")  # the project's: they accept the whole contract
# Under --refusals discard, the share of a test's examples that undeclared refusals may
# take before the test fails. Why a fifth: past it the refused inputs are not an edge of
# the domain but a region the strategies draw routinely (the typo'd softmax of issue 24,
# a TypeError on every row past 64, lost 50-76 % of each test's examples and passed), and
# nothing says the region was refused on purpose. A kernel that refuses that much
# declares it (fn.limits, fn.refuses, tritoncheck.Refusal) and is judged on the rest.
UNDECLARED_SHARE_MAX = 0.2


class Refusal(ValueError):
    """Raise this (or a subclass) from an implementation to refuse an input on purpose:
    the suite discards that example, counts it with its message and draws another. A
    ``ValueError``, so a caller outside the suite sees the contract's bad-input error."""


class Refused(Exception):
    """What :func:`call` raises in place of a refusal. ``message``: the exception in one
    line; ``declared``: whether a declaration covers it (:mod:`tritoncheck.refusals`);
    ``original``: the exception itself, its traceback intact."""

    def __init__(self, exc: BaseException, declared: bool):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        self.message = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        self.declared = declared
        self.original = exc
        super().__init__(self.message)

    def traceback_text(self, limit: int = 12) -> str:
        """The original exception's traceback (its innermost ``limit`` frames), as printed."""
        return code_under_test_traceback(self.original, limit)


def code_under_test_traceback(exc: BaseException, limit: int = 12) -> str:
    """``exc``'s traceback as printed, less the frames of the suite's engine (its call into
    the implementation is no part of the implementation's error), innermost ``limit`` kept."""
    engine = str(Path(__file__).resolve().parent)
    tb = exc.__traceback__
    while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(engine + "/") \
            and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb, limit=-limit))


@functools.cache
def _triton_dir() -> str | None:
    # looked up on first use: importing triton fixes the backend (tritoncheck/backend.py)
    spec = importlib.util.find_spec("triton")
    return str(Path(spec.origin).resolve().parent) if spec and spec.origin else None


def _raised_in_triton(exc: BaseException) -> bool:
    """Whether any frame of the traceback lies inside the triton package: compiling,
    launching or interpreting a kernel, where an error is a broken kernel."""
    triton_dir = _triton_dir()
    if triton_dir is None:
        return False
    tb = exc.__traceback__
    while tb is not None:
        if str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(triton_dir):
            return True
        tb = tb.tb_next
    return False


def declared_refusal(exc: BaseException, refuses: tuple) -> bool:
    """Whether ``exc`` is a refusal the implementation declared: a :class:`Refusal`, or
    a match of one of its parsed ``fn.refuses`` entries ((exception types, pattern))."""
    if isinstance(exc, AssertionError):
        return False
    return isinstance(exc, Refusal) or any(isinstance(exc, types) and pattern.search(str(exc))
                                           for types, pattern in refuses)


def call(fn: Callable, args: list, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)``; a refusal, declared or not, comes out as :class:`Refused`."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        here = exc.__traceback__
        if here is None or here.tb_next is None:
            # No frame of fn's own: raised while binding the arguments (a signature that
            # does not follow the contract, which no input can fix) or by a builtin we
            # cannot look into.
            raise
        from tritoncheck.declarations import REFUSAL_TYPES, refuses  # the declarations import torch: on first use
        if declared_refusal(exc, refuses(getattr(fn, "refuses", None), getattr(fn, "__name__", "fn"))):
            raise Refused(exc, declared=True) from exc
        if isinstance(exc, REFUSAL_TYPES) and not isinstance(exc, AssertionError) and not _raised_in_triton(exc):
            # A frame in triton: a kernel that broke, not a wrapper that declined.
            raise Refused(exc, declared=False) from exc
        raise


def gradients(fn: Callable, *args, **kwargs):
    """``torch.autograd.grad(*args, **kwargs)`` through a graph that ``fn`` built; an exception
    that ``fn`` declares a refusal (``fn.refuses``, a :class:`Refusal`) comes out as a declared
    :class:`Refused`. A backward may decline inputs where its forward did not (fla's chunked
    gated delta rule raises in backward on Hopper with Triton 3.4-3.7.0, a known miscompilation):
    :func:`call` sees only the forward. An undeclared exception propagates: the forward took the
    inputs, so a backward that raises on them is a failure, not a refusal."""
    import torch
    try:
        return torch.autograd.grad(*args, **kwargs)
    except Exception as exc:
        from tritoncheck.declarations import refuses  # the declarations import torch: on first use
        if declared_refusal(exc, refuses(getattr(fn, "refuses", None), getattr(fn, "__name__", "fn"))):
            raise Refused(exc, declared=True) from exc
        raise


def refusal_fails(kind: str, mode: str, declared: bool) -> bool:
    """Whether a refusal (``declared`` or not) by an implementation of ``kind`` fails the
    example: ``fail`` fails every refusal, ``discard`` none (undeclared ones then answer
    to :data:`UNDECLARED_SHARE_MAX` at the end of the test), ``auto`` the project's own
    implementations' and every undeclared one."""
    if mode not in MODES:
        raise ValueError(f"--refusals must be one of {', '.join(MODES)}, got {mode!r}")
    return mode == "fail" or (mode == "auto" and (kind in _OWNED or not declared))


def how_to_declare(name: str) -> str:
    return (f"if {name} refuses such inputs on purpose, declare it: {name}.limits (the strategies then draw "
            f"inside them), {name}.refuses (message patterns), or raise tritoncheck.Refusal; "
            "--refusals=discard counts undeclared refusals instead (docs/contract.md, Refusals)")


# Messages that differ only in their numbers ("rows of 1024", "rows of 2049") are one refusal.
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(\.\d+)?(e[-+]?\d+)?")
ALL_REFUSED_AFTER = 50  # refusals with no accepted example before a test is called all-refused


def distinct(messages: dict[str, int]) -> list[tuple[str, int, int]]:
    """(first message, count, variants) per message up to its numbers, most frequent first."""
    groups: dict[str, list] = {}
    for msg, n in messages.items():
        g = groups.setdefault(_NUMBER.sub("#", msg), [msg, 0, 0])
        g[1] += n
        g[2] += 1
    return sorted((tuple(g) for g in groups.values()), key=lambda g: (-g[1], g[0]))


def summarise(messages: dict[str, int] | Counter, limit: int = 3, width: int = 120) -> str:
    """The distinct messages (up to their numbers), most frequent first, each with its count."""
    items = distinct(dict(messages))
    text = "; ".join(f"{count}x {msg[:width]}" + (f" (and {variants - 1} variant(s))" if variants > 1 else "")
                     for msg, count, variants in items[:limit])
    if len(items) > limit:
        text += f"; and {len(items) - limit} other message(s)"
    return text
