"""What a run prints: its verdicts as they come, and what it found at the end.

Through plain pytest, the end of the run only (pytest's dots, tracebacks and summary stay
as they are): the refusals, the summary (one line per op x implementation x dtype), the
tolerance table and the report's other lines.

With ``--live-verdicts`` (the ``tritoncheck`` command's way), :class:`LiveVerdicts`
replaces pytest's per-test output: one line per op x implementation x dtype as soon as the
last of its checks has a verdict (passed; failed, naming the failed checks; skipped, with
why), with the checks the run has left, whatever xdist worker ran them (the controller
sees every report). At the end, each failure in brief (``tritoncheck.report.failures``:
its headline, message, case and replay command; pytest's traceback and Hypothesis's
detail are the command's ``-v``), then the summary, on one screen.
"""
from __future__ import annotations

import statistics
import time

import pytest

from tritoncheck.report.summary import check_id, parse_test
from tritoncheck.worker_crashes import CRASH_PROPERTY

CHECKS_NAMED = 4  # failed checks a verdict line names before "+N more"
REASON_WIDTH = 100  # of a skip reason on a verdict line


def _reason(report) -> str:
    text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return getattr(report, "wasxfail", None) or text.replace("Skipped: ", "", 1)


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


class LiveVerdicts:
    """The controller's verdict lines. ``targets``: (check id, implementation shown) of
    every check the run may collect, in order; ``verdicts``: the session's check id ->
    outcome, read once a check's last report is in."""

    def __init__(self, terminal, targets: list[tuple[str, str]], verdicts: dict[str, str], header: str):
        self.terminal = terminal
        self.shown = dict(targets)
        self.verdicts = verdicts
        self.header = header
        self.groups: dict[tuple[str, str, str], list[str]] = {}
        for test, _ in targets:
            parsed = parse_test(test)
            if parsed:
                self.groups.setdefault(parsed[:3], []).append(test)
        self.collected: set[str] | None = None
        self.done: set[str] = set()
        self.reasons: dict[str, str] = {}
        self.printed: set[tuple[str, str, str]] = set()
        self.start = time.monotonic()

    def _collected(self, node_ids) -> None:
        if self.collected is not None:
            return
        self.collected = {check_id(n) for n in node_ids} & set(self.shown)
        self.groups = {k: [t for t in tests if t in self.collected] for k, tests in self.groups.items()}
        self.groups = {k: tests for k, tests in self.groups.items() if tests}
        self.widths = [max((len(self._cells(k)[i]) for k in self.groups), default=0) for i in range(3)]
        self.terminal.write_line(f"{self.header}: {len(self.collected)} checks, "
                                 f"{len(self.groups)} op x implementation x dtype")

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self._collected(ids)

    def pytest_collection_finish(self, session) -> None:
        if session.items or not session.config.pluginmanager.hasplugin("dsession"):
            self._collected(item.nodeid for item in session.items)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report, config):
        """No dot for a check (its verdict line says it); its word stays, for -v's line per
        test and the -r summary."""
        result = yield
        if result and check_id(report.nodeid) in self.shown:
            return result[0], "", result[2]
        return result

    @pytest.hookimpl(trylast=True)  # after the session has recorded the verdict
    def pytest_runtest_logreport(self, report) -> None:
        test = check_id(report.nodeid)
        if self.collected is None or test not in self.collected:
            return
        if report.skipped:
            self.reasons.setdefault(test, _reason(report))
        # a check's last report is its teardown's, or xdist's for a worker that died in it
        if report.when in ("teardown", "???") or (report.when == "call" and any(
                k == CRASH_PROPERTY for k, _ in report.user_properties)):
            self.done.add(test)
            parsed = parse_test(test)
            if parsed is None:  # not a check's id (op-impl-dtype-check): nothing to group
                return
            key = parsed[:3]
            if key not in self.printed and all(t in self.done for t in self.groups.get(key, ())):
                self.printed.add(key)
                self.terminal.write_line(self.line(key), **self._markup(key))

    def _cells(self, key: tuple[str, str, str]) -> tuple[str, str, str]:
        op, impl, dtype = key
        return op, self.shown.get(self.groups[key][0], impl), dtype

    def _markup(self, key) -> dict:
        outcomes = [self.verdicts.get(t) for t in self.groups[key]]
        if any(o in ("failed", "error", "xpassed") for o in outcomes):
            return {"red": True}
        return {"green": True} if "passed" in outcomes else {"yellow": True}

    def line(self, key: tuple[str, str, str]) -> str:
        """One op x implementation x dtype: its verdict, what failed or why it skipped, and
        how many of the run's checks are left."""
        tests = self.groups[key]
        outcome = {t: self.verdicts.get(t, "error") for t in tests}
        failed = [parse_test(t)[3] for t in tests if outcome[t] in ("failed", "error", "xpassed")]
        skipped = [t for t in tests if outcome[t] in ("skipped", "xfailed")]
        passed = sum(o == "passed" for o in outcome.values())
        parts = []
        if failed:
            named = failed[:CHECKS_NAMED] + ([f"+{len(failed) - CHECKS_NAMED} more"] if len(failed) > CHECKS_NAMED
                                             else [])
            parts.append(f"{len(failed)} of {len(tests)} failed: {', '.join(named)}")
        if passed:
            parts.append(f"{passed} passed")
        if skipped:
            reasons = sorted({self.reasons.get(t, "") for t in skipped})
            why = (reasons[0] if len(reasons) == 1 else
                   "; ".join(f"{parse_test(t)[3]}: {self.reasons.get(t, '')}" for t in skipped))
            parts.append(f"{len(skipped)} skipped ({_clip(why, REASON_WIDTH)})")
        word = "FAILED" if failed else "passed" if passed else "skipped"
        cells = "  ".join(c.ljust(w) for c, w in zip(self._cells(key), self.widths))
        left = len(self.collected) - len(self.done)
        return (f"{word:<7}  {cells}  {'; '.join(parts)}  "
                f"[{left} check{'s' if left != 1 else ''} left, {time.monotonic() - self.start:.0f} s]")


def kill_summary(kills: list[tuple[str, bool, float]]) -> list[str]:
    """The kill rate, and the time to kill (seconds from the start of a hunt to the failure
    that kills, child start and compiles included) of the kills made: median, 90th
    percentile, max and the slowest five."""
    killed = sorted((seconds, name) for name, passed, seconds in kills if passed)
    lines = [f"kill rate: {len(killed)}/{len(kills)} claimed (mutant, check) kills "
             f"({100 * len(killed) / len(kills):.1f}%)"]
    if killed:
        times = [s for s, _ in killed]
        lines.append(f"time to kill: median {statistics.median(times):.1f} s, "
                     f"90th percentile {times[int(0.9 * (len(times) - 1))]:.1f} s, max {times[-1]:.1f} s "
                     f"over {len(times)} kills; slowest: "
                     + ", ".join(f"{name} {s:.1f} s" for s, name in reversed(killed[-5:])))
    return lines


def end_of_run(tr, session, report_dir, live: bool) -> None:
    """What the run found, under pytest's own end of run. ``session``: the plugin's
    ``Session`` (its report, kills, constant errors); ``live``: the command's way (the
    failures in brief, the summary on one screen; the per-output table is ``-v``'s)."""
    from tritoncheck.report import failures
    from tritoncheck.report import markdown as text
    from tritoncheck.report.summary import summary_text
    data = session.report
    if data is None:
        return
    verbose = tr.config.getoption("verbose") > 0
    if session.unrunnable:
        from tritoncheck import unrunnable
        tr.section("inputs the implementations raised on (each test failed, or skipped under the interpreter)")
        for line in unrunnable.summary_lines(session.unrunnable):
            tr.write_line(line, red=True)
    if live and data.get("failures"):
        tr.section(f"failures ({len(data['failures'])})", red=True)
        for line in failures.brief(data["failures"]):
            tr.write_line(line)
    refused = text.refusal_lines(data)
    if refused:
        tr.section("refusals per op and dtype")
        for line in refused:
            tr.write_line(line, yellow=True)
    if session.kills:
        tr.section("mutation self-test")
        for line in kill_summary(session.kills):
            tr.write_line(line)
    if not data["summary"] and not data["outputs"] and not session.skipped and not data["statistical"]["tests"] \
            and not data["crashes"]:
        return
    if summary_text(data):
        tr.section("tritoncheck summary")
        tr.write_line(summary_text(data, named=0 if live else None))  # live: the lines above name them
    if data["crashes"] and not live:
        tr.write_line(f"{len(data['crashes'])} check(s) took their worker process down (failed; the case and "
                      f"its replay are in each failure above): {', '.join(data['crashes'])}", red=True)
    if verbose or not live:
        tr.section("tolerance report")
        if data["outputs"]:
            tr.write_line(text.table(data))
        discards = text.discard_table(data)
        if discards:
            tr.write_line("")
            tr.write_line(f"examples that did not count (refused, vacuous, or over {text.DISCARD_SHOWN:.0%} "
                          "discarded by assume):")
            tr.write_line(discards)
    for line in text.vacuous_lines(data):
        tr.write_line(line)
    for name, limits in sorted(data.get("limits", {}).items()):
        tr.write_line(f"declared limits of {name}: {limits}")
    if verbose or not live:
        for line in (text.timing_line(data), text.gpu_line(data), text.statistical_line(data)):
            if line:
                tr.write_line(line)
    tr.write_line(f"full report: {report_dir / 'report.html'} (also .md, .json)"
                  + (f"; the failing cases' replay files: {report_dir / 'failures'}/" if data.get("failures") else "")
                  + ("; -v adds the per-output table and pytest's tracebacks" if live and not verbose else ""))
    if session.nothing_checked:
        tr.write_line("ERROR: no check could run on the implementation(s) given with --impl "
                      "(every one was skipped); nothing was verified", red=True)
