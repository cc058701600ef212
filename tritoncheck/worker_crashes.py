"""A kernel that kills its pytest-xdist worker costs its test, never the run: the controller's side.

xdist replaces a worker that died and fails the test it was running with "worker 'gw0'
crashed while running '<nodeid>'". Two things that leaves out, added here:

- the rest of the run: xdist replaces at most ``--max-worker-restart`` crashed workers, by
  default 4 per worker process, then stops the run, so a kernel that segfaults in every test
  of a ``-n 1`` run (the ``tritoncheck`` command's default then) got 5 verdicts and lost the others
  (xdist 3.8, ``dsession.get_default_max_worker_restart``: ``numprocesses * 4`` when the
  option is not given, read once when its ``DSession`` is created).
  :func:`raise_restart_limit` lets every check of the run crash and still leaves xdist's
  own margin, and :class:`WorkerCrashes` keeps what xdist's limit is for: a worker that dies
  before running any test stops the run after 4 per worker, as before. An explicit
  ``--max-worker-restart`` (0 included) is the user's and stands, alone.
  The cost of each restart is a new worker's start: torch, Triton and the suite imported
  again and the tests collected before the next test runs: 13 checks of a softmax that
  segfaults on every call (``-n 1``, quick profile, float32) took 88 s of pytest, 6.8 s a
  crashed check, on this project's 2-core CPU.
- the case: a failing check saves its case as replay files (``harness.save_failure``); a
  worker that died cannot. Each worker writes the case it is about to run to its in-flight
  file (``harness.set_in_flight``: one small JSON per example, overwritten, only in xdist
  workers); :class:`WorkerCrashes`, on the controller, moves it to the test's replay file
  when xdist reports the crash, and adds the case in words and the replay command to the
  test's failure, which the tritoncheck report then counts and names.

A kernel that breaks its process's CUDA context (a wild or misaligned access) is made to
cost the same: the test in which the error surfaces ends (:class:`ContextBroken`), and its
worker ends itself inside that test (:func:`end_worker`), leaving the error, the case and
its replay for the controller, so that xdist blames that test and runs the others in a
fresh worker (issue 36: one misaligned address in PyTorch's SDPA failed 55-61 other tests
of its worker as "not run: the CUDA context of this process was broken").
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

# the report's user property that carries a crash's text to the session (tritoncheck/plugin.py)
CRASH_PROPERTY = "tritoncheck_crash"
# the exit status of a worker that ends itself because its CUDA context broke (ContextBroken)
CONTEXT_BROKEN_EXIT = 86


class ContextBroken(BaseException):  # noqa: N818 - a verdict, raised to end the test, not an error of the suite
    """Ends a test whose kernel left the process's CUDA context broken (a wild or misaligned
    access: "CUDA error: misaligned address", "an illegal memory access was encountered"),
    with the text that names the error, the case and its replay. A ``BaseException``, so
    Hypothesis neither catches it nor shrinks (every later call would raise the same error,
    whatever the input). The plugin then ends the xdist worker (:func:`end_worker`), whose
    replacement runs the other tests; in a single process later tests cannot run."""

    def __init__(self, text: str):
        self.text = text
        super().__init__(text)


_simulated: str | None = None


def simulate_broken_context(error: str | None) -> None:
    """Make :func:`broken_context` report ``error`` in this process (None: stop): the CPU's
    stand-in for a CUDA error stuck to the context, for the tests of this machinery."""
    global _simulated
    _simulated = error


def broken_context(backend_name: str) -> str | None:
    """The error stuck to this process's CUDA context (its first line), or None where the
    context is sound or there is none (only a CUDA run has one; a simulated one anywhere)."""
    if _simulated is not None:
        return _simulated
    if backend_name != "cuda":
        return None
    import torch
    if not torch.cuda.is_initialized():
        return None  # no context in this process: nothing to break (and none made by asking)
    try:
        torch.cuda.synchronize()  # raises the sticky error of a broken context
    except Exception as exc:  # noqa: BLE001 - torch's class for it varies by version (RuntimeError, AcceleratorError)
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def context_note_path(report_dir: Path, worker: str) -> Path:
    """Where the xdist worker ``worker`` leaves why it ended itself (hidden, read by the controller)."""
    return Path(report_dir) / "failures" / f".context-broken-{worker}.json"


def end_worker(report_dir: Path, worker: str, nodeid: str, text: str) -> None:
    """End this xdist worker at once, leaving ``text`` (the error, the case, the replay) for
    the controller, which fails ``nodeid`` with it (:meth:`WorkerCrashes.pytest_handlecrashitem`).

    Why here and now: the worker must die while ``nodeid`` is still the test xdist counts as
    running. xdist marks a test done when the worker reports its protocol complete, after
    its teardown; a worker that ended later (at the next test's setup, where the plugin
    used to fail every later test as "not run") would have xdist blame that next test, an
    innocent one, as the crash. Dying inside the test's call, the crash is the test's own,
    and xdist hands the worker's other pending tests to its replacement, a fresh process
    with a sound context, where each gets its own verdict."""
    path = context_note_path(report_dir, worker)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"nodeid": nodeid, "text": text}))
    os._exit(CONTEXT_BROKEN_EXIT)
# xdist's default --max-worker-restart per worker process (xdist 3.8: numprocesses * 4)
XDIST_RESTARTS_PER_WORKER = 4


def failure_stem(test_id: str) -> str:
    """The file name (less its suffix) of a test's replay files (here, below the harness that
    writes them, so that a dead worker's case lands where a failing check's would)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", test_id)


def in_flight_path(report_dir: Path, worker: str) -> Path:
    """Where the xdist worker ``worker`` keeps the case it is running (hidden: not a replay file)."""
    return Path(report_dir) / "failures" / f".in-flight-{worker}.json"


def restart_limit(check_tests: int, workers: int) -> int:
    """How many crashed workers a run may replace: one per check, and xdist's own default
    (4 per worker) besides.

    Why that is enough: xdist counts a restart for every worker that dies. A worker that dies
    running a test takes that test with it (xdist fails it and hands the worker's other tests
    to the new one), so a run can use at most one restart per test it runs; the checks are
    the tests that run the implementations under test (with ``--impl`` the only ones, from
    ``tritoncheck.suite``), and every one of them may now crash. xdist's 4 per worker stay
    as they were for the other tests of a run (the checkout's own), and for what its limit
    is there for (pytest-xdist#226): a worker that dies before any test (while starting or
    collecting) has no test to fail and would be replaced for ever, which
    :meth:`WorkerCrashes.pytest_testnodedown` now stops after 4 per worker on its own."""
    return check_tests + XDIST_RESTARTS_PER_WORKER * workers


# Set before any plugin's configure, where the check count is not known yet: a checkout run
# that loads the plugin from its conftest.py had xdist read the option first (an H200 run
# warned so). One restart per test needs fewer than this; the startup guard of WorkerCrashes
# stops the runaway restarts that xdist's limit is for.
PROVISIONAL_LIMIT = 100_000
_PROVISIONAL = pytest.StashKey[bool]()


def provisional_limit(config) -> None:
    """Before xdist reads it: PROVISIONAL_LIMIT where the user gave no ``--max-worker-restart``
    (:func:`raise_restart_limit` puts the run's own count in its place where xdist reads later)."""
    if config.getoption("maxworkerrestart", None) is None:
        config.option.maxworkerrestart = str(PROVISIONAL_LIMIT)
        config.stash[_PROVISIONAL] = True


def raise_restart_limit(config, check_tests: int) -> bool:
    """Set xdist's ``--max-worker-restart`` to :func:`restart_limit` where the user did not
    give one; whether it is raised. xdist reads it when its controller session is created, in
    its own ``pytest_configure`` (trylast, as this count's caller): where that session exists
    already, the PROVISIONAL_LIMIT set before every configure (:func:`provisional_limit`) is
    what it read, and it stands. Without it (a caller that skipped the provisional step), a
    session already created means xdist's default was read: said as a warning."""
    workers = config.getoption("numprocesses", None)
    if not isinstance(workers, int) or workers < 1:
        return False
    provisional = config.stash.get(_PROVISIONAL, False)
    if config.getoption("maxworkerrestart", None) is not None and not provisional:
        return False  # the user's
    if config.pluginmanager.getplugin("dsession") is not None:
        if provisional:
            return True
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            "tritoncheck: pytest-xdist read --max-worker-restart before the plugin could raise it: a kernel that "
            f"crashes every test ends the run after {XDIST_RESTARTS_PER_WORKER * workers} restarts; pass "
            "--max-worker-restart N to go on"),
            stacklevel=2)
        return False
    config.option.maxworkerrestart = str(restart_limit(check_tests, workers))
    return True


class WorkerCrashes:
    """The controller's handler of xdist's crashed workers (registered only where xdist runs).

    ``check_ids``: the ids of the run's checks (``harness.Target.id``), the parameter part
    of their node ids; ``report_dir``: where the workers keep their in-flight files and the
    replay files go; ``startup_crashes_max``: how many workers may die before running any
    test (None: xdist's own limit alone, the one the user gave)."""

    def __init__(self, report_dir: Path, check_ids: set[str], check_marker: str,
                 startup_crashes_max: int | None = None):
        self.report_dir = Path(report_dir)
        self.check_ids = check_ids
        self.check_marker = check_marker
        self.startup_crashes_max = startup_crashes_max
        self.startup_crashes = 0
        self._collected: set = set()  # the worker controllers that finished collecting
        # a file left by a run that was itself killed would name a case of that run
        for pattern in (".in-flight-*.json", ".context-broken-*.json"):
            for stale in (self.report_dir / "failures").glob(pattern):
                stale.unlink(missing_ok=True)

    @pytest.hookimpl
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self._collected.add(node)

    @pytest.hookimpl
    def pytest_testnodedown(self, node, error) -> None:
        """A worker that died before it collected its tests (xdist calls this first, then
        replaces it) counts toward ``startup_crashes_max``; past it the run stops, as xdist's
        own limit stopped it before :func:`raise_restart_limit` raised that."""
        if error is None or node in self._collected or self.startup_crashes_max is None:
            return
        self.startup_crashes += 1
        if self.startup_crashes > self.startup_crashes_max:
            pytest.exit(f"tritoncheck: {self.startup_crashes} pytest-xdist workers died before running any test "
                        f"(while starting or collecting; the last: {error}); the run stops, as xdist's own limit "
                        "would (--max-worker-restart N sets that limit instead)", returncode=pytest.ExitCode.INTERNAL_ERROR)

    @pytest.hookimpl
    def pytest_handlecrashitem(self, crashitem: str, report, sched) -> None:
        """Called by xdist before it logs the crash's report: for a check, the report is
        made a failed check (the session's verdicts and counts, the tritoncheck report)
        with the case that was running and its replay, from the worker's in-flight file."""
        test = crashitem.partition("[")[2].rstrip("]")
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else None
        broken = self._context_note(crashitem, worker) if worker is not None else None
        if broken is not None:
            # the worker ended itself, on purpose, in this test (end_worker): its text says why
            report.when = "call"
            report.longrepr = (f"{broken}\n(worker {worker!r} ended itself there, its CUDA context unusable; xdist "
                               "replaced it, and the other tests ran in the fresh worker)")
            if test in self.check_ids:
                report.keywords[self.check_marker] = 1
                in_flight_path(self.report_dir, worker).unlink(missing_ok=True)
            report.user_properties.append((CRASH_PROPERTY, f"{report.longrepr}"))
            return None
        if test not in self.check_ids:
            return None  # not a check: xdist's report as it is
        replay = self._replay_file(test, worker) if worker is not None else None
        report.keywords[self.check_marker] = 1
        if replay is None:
            text = (f"\n{test}: the worker died outside any example of this check (no case was running): "
                    "no replay file")
        else:
            path, data = replay
            from tritoncheck.strategies import Case
            # an example runs in the test's call phase: say so, and the session counts a failed check
            report.when = "call"
            text = (f"\n{data['check']} crashed the worker (a segfault, an abort, or worse) for {data['impl_name']} "
                    f"on the last case it started:\n{Case.from_json(data['case']).describe()}\n"
                    f"replay: python -m tritoncheck.replay {path}")
        report.longrepr = f"{report.longrepr}{text}"
        report.user_properties.append((CRASH_PROPERTY, f"{report.longrepr}"))
        return None  # firstresult: None leaves other plugins' handlers (a rerun) to run

    def _context_note(self, nodeid: str, worker: str) -> str | None:
        """The text a worker left when it ended itself in ``nodeid`` (:func:`end_worker`), or None."""
        source = context_note_path(self.report_dir, worker)
        try:
            data = json.loads(source.read_text())
        except (OSError, ValueError):
            return None
        source.unlink(missing_ok=True)
        return data.get("text") if data.get("nodeid") == nodeid else None

    def _replay_file(self, test: str, worker: str) -> tuple[Path, dict] | None:
        """The worker's in-flight case moved to the test's replay file, or None when the
        worker's last case belongs to another test (it died before this one's first example)."""
        source = in_flight_path(self.report_dir, worker)
        try:
            data = json.loads(source.read_text())
        except (OSError, ValueError):
            source.unlink(missing_ok=True)  # none written, or cut short: the worker died while writing it
            return None
        if data.pop("test", None) != test:
            source.unlink(missing_ok=True)  # an earlier test's case: its worker is gone, and so is its use
            return None
        path = self.report_dir / "failures" / f"{failure_stem(test)}.json"
        path.write_text(json.dumps(data, indent=1))
        source.unlink(missing_ok=True)
        return path, data
