"""Each failed check as a record a person can act on: the check, the implementation, what
failed (the check's message, or the exception and where the implementation raised it), the
case in words and the command that replays it.

A record is made where the check ran (:func:`of_exception`, in the process or xdist worker
that ran it) from the exception and the replay file the harness wrote for the case
(``<report-dir>/failures/<id>.json``, :func:`tritoncheck.harness.save_failure`), and
travels to the controller on the test's report; a check whose worker died gets one there
(:func:`of_crash`). The run's records are ``report.json``'s ``failures``, a section of
report.md and report.html, and, in brief, what the ``tritoncheck`` command prints for a
failure (:func:`brief`).
"""
from __future__ import annotations

import json
import os
import sys
import sysconfig
import traceback
from pathlib import Path

import tritoncheck
from tritoncheck.report.summary import parse_test

# what ended the check: its assertion (a value off, a property broken), an exception out of
# the implementation, the same exception on every input (tritoncheck/unrunnable.py), a pass
# that was not earned (too few examples counted, most vacuous, too many refusals), a worker
# that died (tritoncheck/worker_crashes.py)
ASSERTION, ERROR, UNRUNNABLE, NOT_EARNED, CRASH = "assertion", "error", "unrunnable", "not earned", "crash"
RUNTIME = ("torch", "triton", "numpy", "hypothesis", "_pytest", "pluggy")  # not where a kernel is wrong
MESSAGE_LINES = 6  # of a check's message in the brief; the reports and -v keep it whole


def replay_command(path: Path | str) -> str:
    return f"python -m tritoncheck.replay {path}"


def _replayed(report_dir: Path, stem: str) -> dict:
    """The case in words and the replay command (and the implementation's import path), from
    the test's replay file; empty where none was written."""
    path = Path(report_dir) / "failures" / f"{stem}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    from tritoncheck.strategies import Case
    return {"case": Case.from_json(data["case"]).describe(), "replay": replay_command(path), "impl": data.get("impl")}


def _first(exc: BaseException) -> tuple[BaseException, int]:
    """The first of a group of failures (Hypothesis groups distinct ones), and how many more."""
    more = 0
    while getattr(exc, "exceptions", None):
        more += len(exc.exceptions) - 1
        exc = exc.exceptions[0]
    return exc, more


def _message_of_assertion(text: str, test: str, check: str) -> str:
    """The check's own message: without the headline (``<id> failed; replay: ...``, for JUnit)
    and the case and replay the harness appends (the record has them apart)."""
    lines = text.strip().splitlines()
    if lines and lines[0].startswith(f"{test} failed"):
        lines = lines[1:]
    text = "\n".join(lines)
    cut = text.find(f"\n{check} failed for ")
    return (text[:cut] if cut >= 0 else text).strip()


_ROOT = Path(tritoncheck.__file__).resolve().parent
# the suite's checks, installed (inside the package) and in a checkout (beside it); the
# implementations under test (kernels/, controls/, mutants/) are not the suite's frames
_CHECKS = tuple(str(base / d) + os.sep for base in (_ROOT, _ROOT.parent) for d in ("properties", "references"))


def suite_frame(filename: str) -> bool:
    """Whether a traceback frame in ``filename`` is the suite's own machinery (the engine,
    its report, the checks and references), not the code under test."""
    path = Path(filename)
    return path.parent == _ROOT or path.parent == _ROOT / "report" or filename.startswith(_CHECKS)


def raised_at(exc: BaseException) -> str | None:
    """Where the implementation raised ``exc``: the innermost frame outside the suite, the
    standard library and the runtime it calls (torch, Triton, NumPy): the implementation's
    own code, a library's included; else the innermost frame outside the suite;
    ``file:line in function: source``."""
    frames = traceback.extract_tb(exc.__traceback__)
    runtime = [sysconfig.get_paths()["stdlib"]] + [
        str(Path(sys.modules[m].__file__).parent) + os.sep for m in RUNTIME if getattr(sys.modules.get(m), "__file__", None)]
    theirs = [f for f in frames if not suite_frame(f.filename)]
    own = [f for f in theirs if not f.filename.startswith(tuple(runtime))]
    frame = (own or theirs or [None])[-1]
    if frame is None:
        return None
    try:
        name = os.path.relpath(frame.filename)
    except ValueError:  # another drive
        name = frame.filename
    name = frame.filename if name.startswith("..") else name  # relative only under the run's directory
    return f"{name}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"


def of_exception(target, exc: BaseException, report_dir: Path) -> dict:
    """The record of ``target``'s check (a ``harness.Target``), failed with ``exc``."""
    import pytest

    from tritoncheck import unrunnable
    from tritoncheck.harness import dtype_name, failure_stem
    exc, more = _first(exc)
    test, check = target.id, target.check.name
    where = error = None
    if isinstance(exc, unrunnable.Unrunnable):
        verdict = exc.verdict
        kind, message = UNRUNNABLE, verdict.text.split("\nits traceback")[0].strip()
        error = verdict.entries[0].error if verdict.entries else message.splitlines()[0]
    elif isinstance(exc, AssertionError):
        kind, message = ASSERTION, _message_of_assertion(str(exc), test, check)
    elif isinstance(exc, pytest.fail.Exception):
        kind, message = NOT_EARNED, str(exc).strip()
    else:
        kind, message, where = ERROR, f"{type(exc).__name__}: {exc}".strip(), raised_at(exc)
        error = message.splitlines()[0]
    if more:
        message += f"\n(and {more} other distinct failure(s) of this check: -v shows them)"
    replayed = _replayed(report_dir, failure_stem(test))
    return {"test": test, "op": target.op.name, "impl": target.impl.name, "impl_target": target.impl.target,
            "impl_kind": target.impl.kind, "dtype": dtype_name(target.dtype), "check": check, "kind": kind,
            "message": message, "error": error, "raised_at": where, "case": replayed.get("case"),
            "replay": replayed.get("replay")}


def of_crash(test: str, text: str, report_dir: Path) -> dict:
    """The record of a check whose worker died: what worker_crashes said of it, and the case
    that was running (its replay file) where there was one."""
    from tritoncheck.harness import failure_stem
    op, impl, dtype, check = parse_test(test) or ("", "", "", test)
    replayed = _replayed(report_dir, failure_stem(test))
    first = text.strip().splitlines()
    return {"test": test, "op": op, "impl": impl, "impl_target": replayed.get("impl"), "impl_kind": None,
            "dtype": dtype, "check": check, "kind": CRASH, "error": CRASH, "raised_at": None,
            "case": replayed.get("case"), "replay": replayed.get("replay"),
            "message": (f"{first[0]}: the process died in the implementation (a segfault, an abort, or worse)"
                        if first else "the worker process died")}


def _headline(f: dict) -> str:
    impl = f"{f['impl']} ({f['impl_target']})" if f.get("impl_target") else f["impl"]
    return f"FAILED {f['test']}: {f['check']} of {impl}, {f['kind']}"


def _clip(text: str, lines: int) -> list[str]:
    kept = text.splitlines()
    return kept[:lines] + ([f"... ({len(kept) - lines} more lines in the report and under -v)"]
                           if len(kept) > lines else [])


def _block(f: dict) -> list[str]:
    lines = [_headline(f), *(f"  {x}" for x in _clip(f["message"], MESSAGE_LINES))]
    if f.get("raised_at"):
        lines.append(f"  raised at {f['raised_at']}")
    if f["kind"] == ERROR and f.get("impl_kind") == "user":
        lines.append("  (an exception out of the implementation fails the check unless it is a declared refusal: "
                     "docs/contract.md, Refusals)")
    if f.get("case"):
        case = f["case"].splitlines()
        lines += [f"  case: {case[0]}", *(f"        {x.strip()}" for x in case[1:])]
    if f.get("replay"):
        lines.append(f"  replay: {f['replay']}")
    return lines


def brief(records: list[dict]) -> list[str]:
    """The failures as the terminal shows them by default: per failure its headline, the
    message (its first lines: for a value off, the worst element), where the implementation
    raised it, the case in words and the replay command. The checks of one implementation
    that failed on the same exception (a typo on every long row, a missing import) are one
    such block, and a line naming the others."""
    groups: dict[tuple, list[dict]] = {}
    for f in records:
        same = (f["op"], f["impl"], f["error"]) if f.get("error") else (f["test"],)
        groups.setdefault(same, []).append(f)
    lines: list[str] = []
    for group in groups.values():
        shown = next((f for f in group if f.get("raised_at")), group[0])
        others = [f for f in group if f is not shown]
        lines += ([""] if lines else []) + _block(shown)
        if others:
            several = len({f["dtype"] for f in group}) > 1
            names = ", ".join(f"{f['dtype']} {f['check']}" if several else f["check"] for f in others)
            folder = Path(shown["replay"].split()[-1]).parent if shown.get("replay") else None
            lines.append(f"  the same {'crash' if shown['kind'] == CRASH else 'exception'} failed "
                         f"{len(others)} more check(s): {names}"
                         + (f" (each with its replay file in {folder}/)" if folder else ""))
    return lines


def markdown(report: dict) -> list[str]:
    """report.md's section: every failure whole, with its case and replay."""
    records = report.get("failures") or []
    if not records:
        return []
    lines = ["## Failures", "", f"{len(records)} check(s) failed. Each replay command runs from the directory the "
             "run ran in; its files (`<id>.json` the case, `<id>.pt` the inputs, `<id>.py` a standalone script) are "
             "in `failures/` beside this report.", ""]
    for f in records:
        impl = f"`{f['impl']}`" + (f" (`{f['impl_target']}`)" if f.get("impl_target") else "")
        lines += [f"### `{f['test']}`", "", f"{f['check']} of {impl} in {f['dtype']}: {f['kind']}.", "",
                  "```text", *f["message"].splitlines(), "```", ""]
        if f.get("raised_at"):
            lines += [f"Raised at `{f['raised_at']}`.", ""]
        if f.get("case"):
            lines += ["Case:", "", "```text", *f["case"].splitlines(), "```", ""]
        if f.get("replay"):
            lines += [f"Replay: `{f['replay']}`", ""]
    return lines


def clear(report_dir: Path) -> None:
    """Remove an earlier run's replay files, so that ``failures/`` holds this run's only.
    Called once, by the process that starts the run, before any test (or xdist worker) runs."""
    folder = Path(report_dir) / "failures"
    if folder.is_dir():
        for path in folder.iterdir():
            if path.is_file():
                path.unlink(missing_ok=True)
