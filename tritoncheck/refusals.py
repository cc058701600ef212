"""Refusals: an implementation declining an input it does not accept.

The contract says bad input raises ``ValueError`` or ``TypeError``; real kernels use
the same errors (and ``NotImplementedError``) for inputs they do not cover (rows past a
block limit, head dims they were not built for, tables in another dtype). Such an
example says nothing about the kernel's numerics: it is discarded, not failed, and
counted with its message, so that a kernel with a narrow domain is judged on what it
accepts and the report says what it refused.

What is a refusal is decided here, at the one place the suite calls an
implementation (:meth:`tritoncheck.strategies.Case.call`): one of the three exception
types, raised out of the implementation's own frames. Not a refusal: any other
exception (a CUDA error, a crash, an ``AssertionError``); an error raised inside
Triton's launch or compile machinery or its interpreter (a kernel that breaks, not a
wrapper that declines); a ``TypeError`` from calling the function with the contract's
arguments (its signature does not follow the contract); and anything raised after the
implementation returned (a wrong result, the suite's own checks, the backward).
"""
from __future__ import annotations

import functools
import importlib.util
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable

REFUSAL_TYPES = (ValueError, TypeError, NotImplementedError)
MODES = ("auto", "discard", "fail")  # auto: fail for the project's own implementations, discard for users'
_OWNED = ("kernel", "mutant", "control")  # the project's: they accept the whole contract


class Refusal(Exception):
    """The implementation refused the input: ``message`` is its exception, in one line."""

    def __init__(self, exc: BaseException):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        self.message = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        super().__init__(self.message)


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


def call(fn: Callable, args: list, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)``; a refusal comes out as :class:`Refusal`."""
    try:
        return fn(*args, **kwargs)
    except REFUSAL_TYPES as exc:
        here = exc.__traceback__
        if here is None or here.tb_next is None or _raised_in_triton(exc):
            # No frame of fn's own: raised while binding the arguments (a signature that
            # does not follow the contract, which no input can fix) or by a builtin we
            # cannot look into. A frame in triton: a kernel that broke, not a refusal.
            raise
        raise Refusal(exc) from exc


def refusals_fail(kind: str, mode: str) -> bool:
    """Whether a refusal fails the test for an implementation of ``kind``."""
    if mode not in MODES:
        raise ValueError(f"--refusals must be one of {', '.join(MODES)}, got {mode!r}")
    return mode == "fail" or (mode == "auto" and kind in _OWNED)


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
