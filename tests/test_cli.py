"""The installed face of the suite, from a user's directory: the ``tritoncheck`` command, the
pytest entry point, and the plugin staying inert in a run that did not ask for it.

Each test copies ``examples/user_project`` (a package named ``kernels``, like the suite's own
folder, with a correct and a wrong softmax) into an empty temporary directory and runs there
in a subprocess, as a library's CI would. ``scripts/installed_demo.sh`` (run by ``.ci/run``)
does the same with a non-editable install in a fresh virtual environment.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from tritoncheck import registry

ROOT = Path(__file__).resolve().parents[1]
CHEAP = ["--dtype", "float32", "--max-examples", "5"]


@pytest.fixture
def user_dir(tmp_path) -> Path:
    shutil.copytree(ROOT / "examples" / "user_project" / "kernels", tmp_path / "kernels")
    return tmp_path


# what this run's plugin set or a caller's shell may hold: the subprocess starts as a user's would
_INHERITED = ("PYTHONPATH", "TRITON_INTERPRET", "TRITON_CACHE_AUTOTUNING")


def _run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**clean, **(env or {})})


@pytest.mark.smoke
def test_the_command_passes_a_correct_kernel_and_fails_a_wrong_one_with_a_replay(user_dir):
    good = _run(["-m", "tritoncheck", "softmax=kernels.softmax:softmax", *CHEAP], user_dir)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    checks = len(registry.load()["softmax"].checks)  # float32: one test a check
    assert f"{checks} passed" in good.stdout and (user_dir / "reports" / "report.json").is_file()
    bad = _run(["-m", "tritoncheck", "softmax=kernels.softmax:softmax_off_by_a_tenth", *CHEAP], user_dir)
    assert bad.returncode == 1, bad.stdout[-3000:]
    assert "suite.py::test_check[softmax-softmax_off_by_a_tenth-float32-rows_sum_to_one]" in bad.stdout
    replay = re.search(r"python -m tritoncheck\.replay (reports/failures/\S+\.json)", bad.stdout)
    assert replay, bad.stdout[-3000:]
    again = _run(["-m", "tritoncheck.replay", replay.group(1)], user_dir)
    assert again.returncode == 1 and "FAILED" in again.stdout, again.stdout + again.stderr


def test_pytest_with_impl_checks_the_users_kernels_package(user_dir):
    """Through pytest (the plugin's entry point is active with --impl); the suite's checkout
    must not shadow the user's package named kernels."""
    bad = _run(["-m", "pytest", "--pyargs", "tritoncheck.suite", "--confcutdir", str(ROOT / "tritoncheck"),
                "--impl", "softmax=kernels.softmax:softmax_off_by_a_tenth", *CHEAP, "-k", "rows_sum_to_one"],
               user_dir)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    assert "rows_sum_to_one failed for softmax_off_by_a_tenth" in bad.stdout


def test_an_impl_shadowed_by_the_suites_own_folder_is_a_usage_error(user_dir):
    """From the checkout with the user's code on PYTHONPATH, a bare `kernels.softmax` is the
    suite's file: it used to be checked under the user's name (a green for a wrong kernel)."""
    done = _run(["-m", "pytest", "tests/test_checks.py", "--collect-only", "-q", "-p", "no:xdist",
                 "--impl", "softmax=kernels.softmax:softmax_off_by_a_tenth"], ROOT,
                env={"PYTHONPATH": str(user_dir)})
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert str(ROOT / "kernels" / "softmax.py") in out and str(user_dir / "kernels") in out, out


@pytest.mark.parametrize("args, words", [
    ([], "name at least one OP=module:function"),
    (["softmax"], "expected OP=package.module:function"),
    (["nope=kernels.softmax:softmax"], "unknown op 'nope'"),
])
def test_bad_command_lines_are_usage_errors(user_dir, args, words):
    done = _run(["-m", "tritoncheck", *args], user_dir)
    assert done.returncode in (2, pytest.ExitCode.USAGE_ERROR) and words in done.stdout + done.stderr, \
        done.stdout + done.stderr


def test_help_lists_the_options_and_the_declarations(user_dir):
    done = _run(["-m", "tritoncheck", "--help"], user_dir)
    assert done.returncode == 0
    for words in ("OP=module:function", "--dtype", "--max-examples", "--refusals", "fn.supports_backward", "-- "):
        assert words in done.stdout, words


def test_the_plugin_is_inert_in_a_run_that_did_not_ask_for_it(tmp_path):
    """The entry point loads the plugin into every pytest run of the environment: a user's own
    tests run as they would without it (no backend chosen, no reports written)."""
    (tmp_path / "test_unrelated.py").write_text(
        "import os\n\ndef test_untouched():\n    assert 'TRITON_INTERPRET' not in os.environ\n")
    assert "--impl=OP=module:function" in _run(["-m", "pytest", "--help"], tmp_path).stdout  # the entry point loaded it
    done = _run(["-m", "pytest", "-q", "test_unrelated.py"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "reports").exists()


def test_list_ops_prints_the_contract_and_writes_nothing(tmp_path):
    done = _run(["-m", "tritoncheck", "--list-ops"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| `softmax` | `softmax(x, temperature=1.0) -> y` |" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_the_command_runs_pytest_in_xdist_workers_unless_told_otherwise(monkeypatch):
    """The command line built (tritoncheck/cli.py pytest_args): a worker per core but one by
    default (1 to 15), so that a crashing kernel costs its test, not the run, and a cold run's
    compilations proceed in parallel; a worker count chosen, before or after ``--``, or xdist
    turned off, is left alone; none without pytest-xdist installed."""
    from tritoncheck import cli

    def workers(argv: list[str], extra: list[str] = ()) -> list[str]:
        args = cli.pytest_args(cli.parser().parse_args(argv), list(extra), "quick")
        return [args[i + 1] for i, a in enumerate(args) if a == "-n"]

    assert workers(["softmax=m:f"]) == [str(cli.default_workers())]
    for cores, expected in ((1, 1), (2, 1), (16, 15), (64, 15)):
        monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid, n=cores: set(range(n)), raising=False)
        assert cli.default_workers("interpret") == expected
        assert workers(["softmax=m:f", "--backend", "interpret"]) == [str(expected)]
    # on CUDA, also one worker per GIB_PER_WORKER of the smallest GPU, times the GPUs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for gpus, gib, expected in ((1, 80, 15), (1, 24, 4), (1, 8, 1), (2, 24, 8), (2, 4, 1)):
        monkeypatch.setattr(torch.cuda, "device_count", lambda n=gpus: n)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda i, g=gib: types.SimpleNamespace(total_memory=g * 2**30))
        assert cli.default_workers() == expected, (gpus, gib)
        assert cli.default_workers("interpret") == 15
    monkeypatch.undo()
    assert workers(["softmax=m:f", "-n", "4"]) == ["4"]
    assert workers(["softmax=m:f"], ["-n", "2"]) == ["2"]  # the extra options' own, once
    assert workers(["softmax=m:f"], ["-n2"]) == [] and workers(["softmax=m:f"], ["--numprocesses=2"]) == []
    assert workers(["softmax=m:f"], ["-p", "no:xdist"]) == []
    assert workers(["--list-ops"]) == []
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xdist" else find_spec(name, *a))
    assert workers(["softmax=m:f"]) == []


def test_an_impl_run_without_workers_says_how_to_isolate_crashes(user_dir):
    """`pytest --impl` in one process: a crash would end the run, so its first lines say how
    not to (the tritoncheck command needs no telling: it runs -n 1)."""
    done = _run(["-m", "pytest", "--pyargs", "tritoncheck.suite", "--confcutdir", str(ROOT / "tritoncheck"),
                 "-p", "no:xdist", "--collect-only", "-q", "--impl", "softmax=kernels.softmax:softmax", *CHEAP],
                user_dir, env={"PYTHONPATH": str(ROOT)})
    assert "tests collected" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("no crash isolation") == 1 and "add -n 1 (pytest-xdist)" in done.stdout, done.stdout


# six checks: one crash past xdist's own limit of 4 restarts per worker (-n 1: the 5th crash ended the run)
CRASHED_CHECKS = ("matches_reference", "rows_sum_to_one", "inputs_unchanged", "calls_independent",
                  "values_in_unit_interval", "shift_invariant")


# slow: every softmax check through the command with workers that crash and restart, about 75
# CPU-seconds; on every commit tests/test_worker_crashes.py checks the same path in process
@pytest.mark.slow
def test_a_segfaulting_kernel_fails_each_test_by_name_with_a_replay_and_the_run_goes_on(tmp_path):
    """The command's default worker at work: tests/crashing_kernels.py's softmax segfaults on
    every call; each of six checks, more than xdist's default 4 restarts (tritoncheck/
    worker_crashes.py raises it), fails naming the crash, with the case it was running and a
    replay file that describes that case and passes on a correct softmax; the run reaches its
    summary, and the report counts and names the crashes (about 75 s on a 2-core CPU, most
    of it seven processes importing torch)."""
    shutil.copy(ROOT / "tests" / "crashing_kernels.py", tmp_path)
    done = _run(["-m", "tritoncheck", "softmax=crashing_kernels:segfaulting_softmax", "--profile", "quick",
                 "--dtype", "float32", "--max-examples", "2", "--", "-k", " or ".join(CRASHED_CHECKS)],
                tmp_path, env={"PYTHONPATH": str(ROOT)})
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert f"{len(CRASHED_CHECKS)} failed" in done.stdout and "no crash isolation" not in out, done.stdout[-3000:]
    assert "maximum crashed workers" not in out
    verdicts = json.loads((tmp_path / "reports" / "report.json").read_text())["verdicts"]
    for check in CRASHED_CHECKS:
        test = f"softmax-segfaulting_softmax-float32-{check}"
        crash = re.search(rf"worker 'gw\d+' crashed while running '\S*{test}\]'\n{check} crashed the worker .*?\n"
                          r"(softmax\(x, temperature\) in float32.*?)\nreplay: python -m tritoncheck\.replay "
                          r"(reports/failures/\S+\.json)", out, re.S)
        assert crash, out[-3000:]
        case, replay = crash.groups()
        assert verdicts[test] == "failed" and (tmp_path / replay).is_file()
    # the last one's file, read and run (each process imports torch: one is enough for the CPU)
    described = _run(["-m", "tritoncheck.replay", replay, "--describe"], tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert described.returncode == 0 and case in described.stdout, described.stdout + described.stderr
    report = (tmp_path / "reports" / "report.md").read_text()
    assert f"{len(CRASHED_CHECKS)} check(s) took their worker process down" in report
    fixed = _run(["-m", "tritoncheck.replay", replay, "--impl", "tritoncheck.controls.softmax:torch_softmax"],
                 tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert fixed.returncode == 0 and "passed" in fixed.stdout, fixed.stdout + fixed.stderr
