"""pytest wiring: backend choice, Hypothesis profiles, --op/--dtype/--impl, reports.

Hypothesis profiles are registered and loaded here, once. CI machines set
``CI=true``, on which Hypothesis would load its own built-in ``ci`` profile; ours,
registered under the same name, replaces it and is loaded explicitly.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from properties import backend
from properties.config import CONFIG, PROFILE_SIZES

_COMMON = dict(
    deadline=None,  # first calls compile kernels; time is not what is checked
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.differing_executors],
)
settings.register_profile("dev", max_examples=20, **_COMMON)
# Sized for the Triton interpreter on a 2-core CPU: small shapes (CONFIG.size),
# derandomized so CI is reproducible. 20 examples: tests/test_checks.py takes ~3.5 min
# with -n 2 (6 took 1 min; 30, 5.4 min, found an fp64 reference NaN that 6 and 15 missed).
settings.register_profile("ci", max_examples=20, derandomize=True, database=None, **_COMMON)
settings.register_profile("gpu", max_examples=100, **_COMMON)
settings.register_profile("nightly", max_examples=1000, **_COMMON)


def pytest_addoption(parser):
    group = parser.getgroup("tritoncheck", "Triton kernel checks")
    group.addoption("--backend", choices=backend.BACKENDS, default="auto",
                    help="cuda, interpret (Triton interpreter on CPU) or auto (cuda if available)")
    group.addoption("--op", action="append", default=[], help="run only this op (repeatable)")
    group.addoption("--dtype", action="append", default=[], help="run only this dtype: float32, float16, bfloat16")
    group.addoption("--impl", action="append", default=[], metavar="OP=module:function",
                    help="test this function for OP instead of the project's kernel (repeatable); only the ops named run")
    group.addoption("--report-dir", default="reports", help="where the tolerance report and failing cases go")
    group.addoption("--max-examples", type=int, default=None,
                    help="examples per test, overriding the profile's (sizes still follow the profile)")
    group.addoption("--list-ops", action="store_true", help="print the contract table of every op and exit")


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)  # after Hypothesis's plugin loads --hypothesis-profile, so --max-examples caps it
def pytest_configure(config):
    try:
        chosen = backend.select(config.getoption("--backend"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    profile = config.getoption("hypothesis_profile", None) or ("gpu" if chosen == "cuda" else "ci")
    settings.load_profile(profile)
    if config.getoption("--max-examples"):
        settings.register_profile(f"{profile}-capped", parent=settings.get_profile(profile),
                                  max_examples=config.getoption("--max-examples"))
        settings.load_profile(f"{profile}-capped")
    CONFIG.size = PROFILE_SIZES.get(profile, "small")
    CONFIG.report_dir = Path(config.getoption("--report-dir"))
    CONFIG.ops = tuple(config.getoption("--op")) or None
    try:
        from properties.strategies import dtype_from_name
        CONFIG.dtypes = tuple(dtype_from_name(d) for d in config.getoption("--dtype")) or None
        from properties import registry
        for spec in config.getoption("--impl"):
            op, sep, target = spec.partition("=")
            if not sep:
                raise ValueError(f"--impl {spec!r}: expected OP=package.module:function")
            registry.register_implementation(op.strip(), target.strip())
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    from properties import harness, report
    harness.set_collector(report.Collector())
    config._tritoncheck = {"skipped": [], "profile": profile, "backend": chosen, "counted": 0, "kills": []}
    if not _is_worker(config):
        report.clear_parts(CONFIG.report_dir)
    else:
        # Each xdist worker's fp64 references would otherwise start one thread per core:
        # 14 workers on 16 cores ran 14 x 16 threads and spent the GPU run waiting on them.
        workers = int(config.workerinput.get("workercount", 1))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_cmdline_main(config):
    if config.getoption("--list-ops"):
        backend.select(config.getoption("--backend"))
        from properties import contract
        print(contract.markdown_table())
        return 0
    return None


def pytest_collection_modifyitems(config, items):
    """With --impl, run only the checks of the user's implementation: the suite's own
    kernel tests and self-tests are about the suite, not about the user's kernel."""
    from properties import registry
    if registry._user_impls:
        keep = [i for i in items if i.nodeid.startswith("tests/test_checks.py")]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


def pytest_runtest_logreport(report):
    state = getattr(pytest, "_tritoncheck_state", None)
    if state is None:
        return
    if "test_mutant_killed" in report.nodeid and report.when == "call":
        state["kills"].append(report.passed)
    if "test_checks.py" not in report.nodeid:
        return
    if report.when == "call" or (report.when == "setup" and report.skipped):
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            outcome = "xfail" if hasattr(report, "wasxfail") else "skipped"
            state["skipped"].append({"test": report.nodeid.split("::")[-1], "outcome": outcome,
                                     "reason": getattr(report, "wasxfail", None) or reason.replace("Skipped: ", "")})
        elif report.passed or report.failed:
            state["counted"] += 1


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A check whose examples all passed still fails when most of them were vacuous
    (the allowance would have accepted 0: ``properties.harness.vacuity_failure``)."""
    result = yield
    target = getattr(item, "callspec", None) and item.callspec.params.get("target")
    if target is not None and "test_checks.py" in item.nodeid:
        from properties import harness
        problem = harness.vacuity_failure(target)
        if problem:
            pytest.fail(problem, pytrace=False)
    return result


# A wild or misaligned access on the GPU leaves the process's CUDA context broken for
# good: every later CUDA call in it fails with the same error, so every later test in
# this pytest process (or xdist worker) would fail too and blame itself.
_cuda_broken_by: str | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    global _cuda_broken_by
    report = (yield).get_result()
    if call.when == "call" and report.failed and _cuda_broken_by is None and backend.current() == "cuda":
        try:
            torch.cuda.synchronize()  # returns the sticky error if the context is broken
        except Exception as exc:  # noqa: BLE001 - torch's class for it varies by version
            _cuda_broken_by = f"{item.nodeid} ({type(exc).__name__}: {str(exc).splitlines()[0]})"


def pytest_runtest_setup(item):
    if _cuda_broken_by:
        pytest.fail(f"not run: the CUDA context of this process was broken by {_cuda_broken_by}; "
                    "every CUDA call here now fails. Fix that failure first (run that test alone "
                    "to see it), or deselect it.", pytrace=False)


def pytest_sessionstart(session):
    pytest._tritoncheck_state = session.config._tritoncheck


def pytest_sessionfinish(session, exitstatus):
    from properties import harness, report
    config = session.config
    state = config._tritoncheck
    name = config.workerinput["workerid"] if _is_worker(config) else "main"
    harness._collector.dump(CONFIG.report_dir / "parts", name)
    if _is_worker(config):
        return
    device = torch.cuda.get_device_name() if state["backend"] == "cuda" else "cpu (Triton interpreter)"
    import triton
    meta = {"backend": state["backend"], "profile": state["profile"], "device": device,
            "torch": torch.__version__, "triton": triton.__version__}
    data = report.build(CONFIG.report_dir, state["skipped"], meta)
    report.write(CONFIG.report_dir, data)
    state["report"] = data
    from properties import registry
    if registry._user_impls and state["counted"] == 0 and exitstatus in (0, 5):
        # Every check of the user's implementation was skipped: nothing was verified.
        state["nothing_checked"] = True
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = getattr(config, "_tritoncheck", None)
    if not state or "report" not in state:
        return
    from properties import report
    tr = terminalreporter
    if state["kills"]:
        killed = sum(state["kills"])
        tr.section("mutation self-test")
        tr.write_line(f"kill rate: {killed}/{len(state['kills'])} claimed (mutant, check) kills "
                      f"({100 * killed / len(state['kills']):.1f}%)")
    if not state["report"]["outputs"] and not state["skipped"]:
        return
    tr.section("tolerance report")
    if state["report"]["outputs"]:
        tr.write_line(report.table(state["report"]))
    tr.write_line(f"full report: {CONFIG.report_dir / 'report.html'} (also .md, .json)")
    if state.get("nothing_checked"):
        tr.write_line("ERROR: no check could run on the implementation(s) given with --impl "
                      "(every one was skipped); nothing was verified", red=True)


