"""tritoncheck/worker_crashes.py and its harness side, in process: xdist's restart limit
raised unless the user set one, each example's in-flight case in a worker, and the crash
report xdist builds turned into a failed check with its replay. The same through the
``tritoncheck`` command, with a kernel that segfaults: tests/test_cli.py."""
from __future__ import annotations

import json
import types
import warnings

import pytest

from tritoncheck import harness, registry, report, worker_crashes
from tritoncheck.plugin import CHECK
from tritoncheck.report import html_page
from tritoncheck.report import markdown as report_markdown

NODE = "suite.py::test_check[{}]"


class FakeConfig:
    """What raise_restart_limit reads of a pytest config: the two xdist options and whether
    xdist's controller session exists yet."""

    def __init__(self, numprocesses, maxworkerrestart=None, dsession=None):
        self.option = types.SimpleNamespace(numprocesses=numprocesses, maxworkerrestart=maxworkerrestart)
        self.pluginmanager = types.SimpleNamespace(getplugin=lambda name: dsession if name == "dsession" else None)
        self.stash = pytest.Stash()
        self.warned = []

    def getoption(self, name, default=None):
        return getattr(self.option, name, default)

    def issue_config_time_warning(self, warning, stacklevel):
        self.warned.append(str(warning))


@pytest.mark.parametrize("workers, given, expected", [
    (1, None, "17"),  # 13 checks and xdist's own 4 a worker
    (3, None, "25"),
    (1, "0", "0"),  # restarts turned off by the user: kept
    (2, "7", "7"),
    (0, None, None),  # no workers: nothing to restart
])
def test_the_restart_limit_is_raised_unless_the_user_gave_one(workers, given, expected):
    config = FakeConfig(workers, given)
    worker_crashes.raise_restart_limit(config, check_tests=13)
    assert config.option.maxworkerrestart == expected and not config.warned


def test_a_limit_read_before_the_plugin_could_raise_it_is_said():
    config = FakeConfig(1, dsession=object())
    worker_crashes.raise_restart_limit(config, check_tests=13)
    assert config.option.maxworkerrestart is None
    assert len(config.warned) == 1 and "--max-worker-restart" in config.warned[0]


@pytest.mark.parametrize("xdist_read_first", [True, False])
def test_a_provisional_limit_stands_where_xdist_read_it_and_gives_way_to_the_count(xdist_read_first):
    """The plugin sets PROVISIONAL_LIMIT before every configure (a checkout run that loads it
    from conftest.py had xdist read the option first, on an H200); where xdist reads later,
    the run's own count replaces it. A user's value is never touched."""
    config = FakeConfig(1, dsession=object() if xdist_read_first else None)
    worker_crashes.provisional_limit(config)
    assert config.option.maxworkerrestart == str(worker_crashes.PROVISIONAL_LIMIT)
    assert worker_crashes.raise_restart_limit(config, check_tests=13) and not config.warned
    assert config.option.maxworkerrestart == (str(worker_crashes.PROVISIONAL_LIMIT) if xdist_read_first else "17")
    users = FakeConfig(1, "3")
    worker_crashes.provisional_limit(users)
    assert not worker_crashes.raise_restart_limit(users, check_tests=13) and users.option.maxworkerrestart == "3"


def test_workers_that_die_before_any_test_still_stop_the_run(tmp_path):
    """What xdist's limit was for (pytest-xdist#226), kept once the limit is raised: a worker
    that dies while starting or collecting has no test to fail and would be replaced for ever."""
    handler = worker_crashes.WorkerCrashes(tmp_path, set(), CHECK, startup_crashes_max=4)
    ran = object()
    handler.pytest_xdist_node_collection_finished(node=ran, ids=["t"])
    for _ in range(10):
        handler.pytest_testnodedown(node=ran, error="crashed")  # died in a test: that test's restart
        handler.pytest_testnodedown(node=object(), error=None)  # finished: no crash
    for _ in range(4):
        handler.pytest_testnodedown(node=object(), error="crashed while collecting")
    with pytest.raises(pytest.exit.Exception, match="5 pytest-xdist workers died before running any test"):
        handler.pytest_testnodedown(node=object(), error="crashed while collecting")
    unbounded = worker_crashes.WorkerCrashes(tmp_path, set(), CHECK, startup_crashes_max=None)
    for _ in range(10):
        unbounded.pytest_testnodedown(node=object(), error="crashed")  # the user's --max-worker-restart rules


def _target(check: str = "rows_sum_to_one") -> harness.Target:
    op = registry.load()["softmax"]
    impl = registry.implementations("softmax")[0]
    return harness.Target(op, impl, op.dtypes[0], {c.name: c for c in op.checks}[check])


def _case(target: harness.Target):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    drawn = []

    @settings(max_examples=1, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data):
        drawn.append(target.draw(data))

    draw()
    return drawn[0]


def _as_json(record: dict) -> dict:
    return json.loads(json.dumps(record))


@pytest.fixture
def in_flight(tmp_path):
    path = worker_crashes.in_flight_path(tmp_path, "gw3")
    harness.set_in_flight(path)
    yield path
    harness.set_in_flight(None)


def test_a_worker_writes_each_case_before_running_it_and_no_other_process_does(tmp_path, in_flight):
    target = _target()
    case = _case(target)
    target._write_in_flight(case)
    data = json.loads(in_flight.read_text())
    assert data == _as_json({"test": target.id, **harness.replay_record(target, case)})
    harness.set_in_flight(None)
    in_flight.unlink()
    target._write_in_flight(case)
    assert not in_flight.exists()


def _crash_report(test_id: str, worker: str = "gw3") -> pytest.TestReport:
    """The report xdist's DSession.handle_crashitem builds (xdist 3.8) before the hook."""
    nodeid = NODE.format(test_id)
    report = pytest.TestReport(nodeid=nodeid, location=("suite.py", None, "suite.py"), keywords={},
                               outcome="failed", longrepr=f"worker {worker!r} crashed while running {nodeid!r}",
                               when="???")
    report.node = types.SimpleNamespace(gateway=types.SimpleNamespace(id=worker))
    return report


def test_a_crash_in_an_example_becomes_a_failed_check_with_its_replay(tmp_path, in_flight):
    target = _target()
    case = _case(target)
    handler = worker_crashes.WorkerCrashes(tmp_path, {target.id}, CHECK)  # at configure, before any worker
    target._write_in_flight(case)
    report = _crash_report(target.id)
    assert handler.pytest_handlecrashitem(crashitem=report.nodeid, report=report, sched=None) is None
    replay = tmp_path / "failures" / f"{harness.failure_stem(target.id)}.json"
    assert json.loads(replay.read_text()) == _as_json(harness.replay_record(target, case))
    assert not in_flight.exists()
    assert report.failed and report.when == "call" and CHECK in report.keywords
    text = str(report.longrepr)
    assert text.startswith("worker 'gw3' crashed while running") and case.describe() in text
    assert f"replay: python -m tritoncheck.replay {replay}" in text
    assert report.user_properties == [(worker_crashes.CRASH_PROPERTY, text)]


def test_a_crash_outside_any_example_of_the_check_names_no_case(tmp_path, in_flight):
    """The worker's last case is another test's (it died before this one's first example):
    no replay of the wrong case; the check still fails, as the report's error."""
    earlier, crashed = _target("rows_sum_to_one"), _target("matches_reference")
    handler = worker_crashes.WorkerCrashes(tmp_path, {earlier.id, crashed.id}, CHECK)
    earlier._write_in_flight(_case(earlier))
    report = _crash_report(crashed.id)
    handler.pytest_handlecrashitem(crashitem=report.nodeid, report=report, sched=None)
    assert "no case was running" in str(report.longrepr) and "replay:" not in str(report.longrepr)
    assert report.when == "???" and CHECK in report.keywords and report.failed
    assert not in_flight.exists() and not list((tmp_path / "failures").glob("*.json"))


def test_a_crash_in_another_test_is_left_as_xdist_reported_it(tmp_path):
    handler = worker_crashes.WorkerCrashes(tmp_path, {"softmax-triton-float32-rows_sum_to_one"}, CHECK)
    report = _crash_report("not-a-check")
    before = str(report.longrepr)
    handler.pytest_handlecrashitem(crashitem=report.nodeid, report=report, sched=None)
    assert str(report.longrepr) == before and report.keywords == {} and report.user_properties == []


def test_a_stale_in_flight_file_of_an_earlier_run_is_removed(tmp_path):
    stale = worker_crashes.in_flight_path(tmp_path, "gw0")
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    worker_crashes.WorkerCrashes(tmp_path, set(), CHECK)
    assert not stale.exists()


def test_the_report_counts_a_crashed_check_as_failed_and_names_the_crash(tmp_path):
    test = "softmax-segfaulting_softmax-float32-rows_sum_to_one"
    text = "worker 'gw0' crashed while running '...'\nreplay: python -m tritoncheck.replay x.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = report.build(tmp_path, [], {"backend": "interpret", "profile": "quick"},
                            verdicts={test: "failed"}, crashes={test: text})
    [entry] = data["summary"]
    assert entry["failed"] == 1 and entry["failed_checks"] == ["rows_sum_to_one"]
    markdown = report_markdown.markdown(data)
    assert "## Crashed workers" in markdown and f"- `{test}`:" in markdown
    assert "  replay: python -m tritoncheck.replay x.json" in markdown
    assert "<h2>Crashed workers</h2>" in html_page.page(data) and "x.json" in html_page.page(data)


# ------------------------------------------------------------------ a broken CUDA context costs its own test

GRADIENT_CHECKS = ("gradients_match_reference", "backward_repeatable", "deterministic")


def _run_softmax(tmp_path, impl: str, *extra: str):
    """The suite on softmax float32 in a child pytest (quick profile, seed 0): outcomes by
    test id ('passed', or 'failed: <message>'), and the output."""
    import os
    import subprocess
    import sys
    import xml.etree.ElementTree as ET
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    xml = tmp_path / "run.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/test_checks.py", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
           "--op", "softmax", "--dtype", "float32", "--report-dir", str(tmp_path / "reports"), f"--junitxml={xml}",
           "--hypothesis-seed", "0", "--max-examples", "5", "--impl", f"softmax={impl}", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")}
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600, env=env)
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test_id = case.get("name").partition("[")[2].rstrip("]")
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        outcomes[test_id] = "passed" if failed is None and case.find("skipped") is None else \
            f"failed: {failed.get('message')} {failed.text}" if failed is not None else \
            f"skipped: {case.find('skipped').get('message')}"
    return outcomes, proc.stdout + proc.stderr


def _breaking_impl(kind: str) -> str:
    if kind == "cuda":
        from tritoncheck import backend
        if backend.current() != "cuda":
            pytest.skip("a real broken CUDA context needs a GPU (the simulated one runs everywhere)")
        return "tests.context_breaking_kernels:softmax_misaligned_backward"
    return "tests.context_breaking_kernels:softmax_breaking_backward_simulated"


@pytest.mark.parametrize("kind", ["simulated", "cuda"])
def test_a_kernel_that_breaks_the_cuda_context_costs_only_the_tests_that_broke_it(tmp_path, kind):
    """Issue 36: each check that runs the breaking backward fails, naming the CUDA error, its
    case and replay file; its worker ends inside that test (so xdist blames it, not the next
    one) and is replaced; every forward check gets its own verdict, a pass, also those run
    after a break (before: "not run: the CUDA context of this process was broken by ...")."""
    from tests.context_breaking_kernels import CUDA_ERROR
    outcomes, out = _run_softmax(tmp_path, _breaking_impl(kind), "-n", "1")
    assert len(outcomes) == len(registry.load()["softmax"].checks), out[-3000:]
    for test_id, outcome in outcomes.items():
        if test_id.endswith(GRADIENT_CHECKS):
            assert outcome.startswith("failed") and CUDA_ERROR in outcome, (test_id, outcome, out[-3000:])
            assert f"{test_id}: {test_id.rpartition('-')[2]} broke the CUDA context" in outcome, outcome
            assert "replay: python -m tritoncheck.replay" in outcome and "ended itself there" in outcome, outcome
            replay = outcome.partition("replay: python -m tritoncheck.replay ")[2].split()[0]
            assert json.loads(open(replay).read())["check"] == test_id.rpartition("-")[2]
        else:  # passed, or skipped up front as not applicable (no narrowing output in float32, no autotuning)
            assert outcome == "passed" or outcome.startswith("skipped: not applicable"), (test_id, outcome[:2000])
    assert "not run: the CUDA context" not in out
    print(next(o for t, o in outcomes.items() if t.endswith(GRADIENT_CHECKS))[:1500])  # for the GPU run's log


def test_without_workers_the_test_that_broke_the_context_says_so_and_the_rest_name_it(tmp_path):
    outcomes, out = _run_softmax(tmp_path, _breaking_impl("simulated"), "-p", "no:xdist")
    first = "softmax-softmax_breaking_backward_simulated-float32-gradients_match_reference"
    assert "gradients_match_reference broke the CUDA context of this process" in outcomes[first], outcomes[first]
    assert "a single process runs every test here" in outcomes[first] and "replay:" in outcomes[first]
    later = [o for t, o in outcomes.items() if list(outcomes).index(t) > list(outcomes).index(first)
             and not o.startswith("skipped: not applicable")]  # skipped up front, before any call
    assert later and all("not run: the CUDA context of this process was broken by" in o and first in o
                         and "-n 1" in o for o in later), later[:2]
