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


# what this run's plugin set or a caller's shell may hold: the subprocess starts as a user's would.
# PYTHONDONTWRITEBYTECODE (set on the development machines): without cached bytecode each of the
# command's processes compiles the package and pytest rewrites its ~200 modules again (6.1 CPU-s a
# start-up, 3.5 with the cache); the smoke test's two commands took 68 s of README command 1's 188
_INHERITED = ("PYTHONPATH", "TRITON_INTERPRET", "TRITON_CACHE_AUTOTUNING", "PYTHONDONTWRITEBYTECODE")


def _run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**clean, **(env or {})})


def _installed_site(tmp_path: Path) -> Path:
    """A folder that makes the checkout look installed, not editable: a dist-info with the
    pytest11 entry point and a RECORD naming the package's files, as a wheel install writes
    (pytest then marks the whole package for assertion rewriting at start)."""
    info = tmp_path / "site" / "tritoncheck-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tritoncheck\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\ntritoncheck.plugin = tritoncheck.plugin\n")
    (info / "RECORD").write_text("tritoncheck/__init__.py,,\ntritoncheck/cli.py,,\n")
    return info.parent


@pytest.mark.smoke
def test_the_command_passes_a_correct_kernel_and_fails_a_wrong_one_with_a_replay(user_dir, tmp_path):
    """The command's output as a person reads it: a line per op x implementation x dtype as
    its verdict comes (from the xdist worker's reports), no dots, no pytest traceback, no
    warning; a failure in brief: its check, message with the worst element, the case in
    words and a replay command that works; only this run's replay files."""
    env = {"PYTHONPATH": f"{_installed_site(tmp_path)}{os.pathsep}{ROOT}"}
    # the quick profile only: without --profile a pass runs the ci profile next, a second session
    # of three processes (README command 1's budget); .ci/run's installed demo runs both
    good = _run(["-m", "tritoncheck", "softmax=kernels.softmax:softmax", *CHEAP, "--profile", "quick"], user_dir, env)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    checks = len(registry.load()["softmax"].checks)  # float32: one test a check
    # in float32 no output narrows (unbiased_rounding) and the kernel declares no autotuned
    # kernels (autotune_configs_agree): those two are skipped as not applicable, with the reason
    skipped = 2
    assert re.search(rf"^passed +softmax +kernels\.softmax:softmax +float32 +{checks - skipped} passed; {skipped} "
                     r"skipped \(unbiased_rounding: not applicable", good.stdout, re.M), good.stdout
    assert f"{checks - skipped} passed, {skipped} skipped in" in good.stdout and "warning" not in good.stdout.lower(), \
        good.stdout
    assert (user_dir / "reports" / "report.json").is_file()
    stale = user_dir / "reports" / "failures" / "softmax-old-float32-matches_reference.json"
    stale.parent.mkdir(exist_ok=True)
    stale.write_text("{}")  # an earlier run's
    bad = _run(["-m", "tritoncheck", "softmax=kernels.softmax:softmax_off_by_a_tenth", *CHEAP], user_dir, env)
    out = bad.stdout
    assert bad.returncode == 1, out[-3000:]
    assert re.search(rf"^FAILED +softmax +kernels\.softmax:softmax_off_by_a_tenth +float32 +\d+ of {checks} failed: "
                     r".*matches_reference.*\d+ passed", out, re.M), out
    block = re.search(r"^FAILED softmax-softmax_off_by_a_tenth-float32-rows_sum_to_one: rows_sum_to_one of "
                      r"softmax_off_by_a_tenth \(kernels\.softmax:softmax_off_by_a_tenth\), assertion\n"
                      r"  rows do not sum to one: .*\n    worst at index \[.*\]: expected .*, got .*, \|error\| .*, "
                      r"allowed .*\n(?:    .*\n)*  case: softmax\(x, temperature\) in float32 .*\n(?:        .*\n)+"
                      r"  replay: python -m tritoncheck\.replay (reports/failures/\S+\.json)\n", out, re.M)
    assert block, out
    for noise in ("Traceback", "def ", "reproduce_failure", "Case(", "E  ", "....", "warning"):
        assert noise not in out, noise
    assert len(out.splitlines()) < 12 * out.count("\nFAILED softmax-"), out  # a failure in about ten lines
    assert not stale.exists() and (user_dir / block.group(1)).is_file()
    # the report files name each failure: its message, case in words and replay
    data = json.loads((user_dir / "reports" / "report.json").read_text())
    failed = {f["check"]: f for f in data["failures"]}
    assert data["verdicts"]["softmax-softmax_off_by_a_tenth-float32-rows_sum_to_one"] == "failed"
    assert set(failed) == {t.rsplit("-", 1)[1] for t, v in data["verdicts"].items() if v == "failed"}
    record = failed["rows_sum_to_one"]
    assert record["message"].startswith("rows do not sum to one") and "worst at index" in record["message"]
    assert record["case"].startswith("softmax(x, temperature) in float32") and record["replay"].endswith(block.group(1))
    for page in ("report.md", "report.html"):
        text = (user_dir / "reports" / page).read_text()
        assert "softmax-softmax_off_by_a_tenth-float32-rows_sum_to_one" in text and block.group(1) in text, page
        assert "rows do not sum to one" in text and "x: shape [" in text, page
    again = _run(["-m", "tritoncheck.replay", block.group(1)], user_dir, env)
    assert again.returncode == 1 and "FAILED" in again.stdout, again.stdout + again.stderr
    assert "the quick profile did not pass" in out and "--profile ci for depth" in out
    verbose = _run(["-m", "tritoncheck", "softmax=kernels.softmax:softmax_off_by_a_tenth", *CHEAP, "-v", "--",
                    "-k", "rows_sum_to_one"], user_dir, env)
    assert verbose.returncode == 1 and "== FAILURES ==" in verbose.stdout, verbose.stdout[-3000:]
    assert "tolerance report" in verbose.stdout and "rows_sum_to_one failed for" in verbose.stdout


def test_through_pytest_a_failure_shows_the_code_under_test_not_the_suites(user_dir):
    """Plain pytest keeps its report of a failure, less the noise the suite caused: the
    suite's own frames (its engine's source), Hypothesis's advice to decorate "your test
    function" and the raw case record. The frame of the user's code that raised stays."""
    shutil.copy(ROOT / "tests" / "demo_buggy.py", user_dir)
    done = _run(["-m", "pytest", "-p", "tritoncheck.plugin", "--pyargs", "tritoncheck.suite", "--confcutdir",
                 str(ROOT / "tritoncheck"), "-p", "no:xdist", "--impl", "softmax=demo_buggy:softmax", *CHEAP,
                 "-k", "matches_reference and not gradients", "--hypothesis-seed", "0"], user_dir, {"PYTHONPATH": str(ROOT)})
    # seeded: --impl runs the quick profile, which draws afresh, and 5 fresh draws can miss a row
    # past 64 where the typo raises (a run of .ci/run drew rows of at most 32 and passed the kernel)
    out = done.stdout
    assert done.returncode == 1 and "== FAILURES ==" in out, out[-3000:] + done.stderr[-3000:]
    assert 'demo_buggy.py", line 17, in softmax' in out and "dtpye=x.dtype" in out, out
    for noise in ("harness.py", "suite.py:", "refusals.py", "reproduce_failure", "Case(op="):
        assert noise not in out, noise
    assert "the first such input:\nsoftmax(x, temperature) in float32" in out, out


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
    (["--cp-world-size"], "expected one argument"),
    (["sofmax=kernels.softmax:softmax"], "unknown op 'sofmax' (did you mean 'softmax'?)"),
    (["softmax=kernels.nope:softmax"], "no module named 'kernels.nope'; is it on PYTHONPATH"),
    (["softmax=kernels.broken:softmax"], "importing 'kernels.broken' for kernels.broken:softmax failed inside it: "
                                         "ModuleNotFoundError: No module named 'flash_attn_missing'"),
])
def test_bad_command_lines_are_usage_errors_exit_2_and_say_nothing_more(user_dir, args, words):
    """Exit 2, as --help says (pytest's own usage errors are 4), and no advice to run the
    deep profile after a run that could not start."""
    (user_dir / "kernels" / "broken.py").write_text("import flash_attn_missing  # a dependency not installed\n")
    done = _run(["-m", "tritoncheck", *args], user_dir)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and words in out, out
    assert "did not pass" not in out, out


def test_a_module_whose_own_import_fails_is_told_so_not_to_check_pythonpath(tmp_path, monkeypatch):
    (tmp_path / "own_error.py").write_text("import torch\nfrom torch import not_a_name  # the module's own bug\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"importing 'own_error' for own_error:f failed inside it: ImportError: "
                                         r"cannot import name 'not_a_name'") as info:
        registry.resolve("own_error:f")
    assert f"{tmp_path / 'own_error.py'}:2" in str(info.value) and "PYTHONPATH" not in str(info.value)
    with pytest.raises(ValueError, match=r"no module named 'nowhere_at_all'; is it on PYTHONPATH"):
        registry.resolve("nowhere_at_all.sub:f")


def test_a_users_module_in_a_package_the_checkout_shadows_gets_that_hint():
    """From the checkout, `kernels` is the suite's kernels/: the user's kernels/mysoftmax.py
    is not missing from PYTHONPATH, it is hidden behind the checkout's folder."""
    with pytest.raises(ValueError, match=r"'kernels' is the suite's own .*kernels.*shadows yours") as info:
        registry.resolve("kernels.mysoftmax:softmax")
    assert "PYTHONPATH" not in str(info.value)


def test_a_signature_that_cannot_bind_is_a_usage_error_at_load(user_dir):
    """An --impl whose function takes other parameters than the op passes (rope's x, cos, sin
    to a function of x and freqs): exit status 2 from the command, pytest's usage error under
    pytest, with Python's binding message and both parameter lists, before any test runs."""
    (user_dir / "wrong_rope.py").write_text("def rope(x, freqs):\n    return x\n")
    done = _run(["-m", "tritoncheck", "rope=wrong_rope:rope", *CHEAP], user_dir)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    assert "too many positional arguments" in out and "Its parameters: (x, freqs)" in out, out[-3000:]
    assert "rope(x, cos, sin)" in out and not re.search(r"\d+ passed", out), out[-3000:]
    done = _run(["-m", "pytest", str(ROOT / "tests" / "test_checks.py"), "--collect-only", "-q", "-p", "no:xdist",
                 "--rootdir", str(ROOT), "--impl", "rope=wrong_rope:rope"], user_dir, env={"PYTHONPATH": str(user_dir)})
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, (done.stdout + done.stderr)[-3000:]
    assert "too many positional arguments" in done.stdout + done.stderr




def test_help_lists_the_options_the_declarations_the_report_commands_and_the_profiles(user_dir):
    from hypothesis import settings

    import tritoncheck.plugin  # noqa: F401 - registers the profiles
    from tritoncheck.profiles import EXAMPLES
    done = _run(["-m", "tritoncheck", "--help"], user_dir)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for words in ("OP=module:function", "--dtype", "--max-examples", "--refusals", "fn.supports_backward", "-- ",
                  "--cp-world-size W", "tritoncheck report summary", "tritoncheck report diff",
                  "tritoncheck report merge", "python -m tritoncheck.replay",
                  "needs the plugin turned on: python -m pytest -p tritoncheck.plugin",
                  "2 a usage error"):
        assert words in text, words
    for name, n in EXAMPLES.items():  # one number each, in the code and in the help
        assert settings.get_profile(name).max_examples == n
    assert f"ci ({EXAMPLES['ci']}, small shapes" in text and f"ci (small shapes, {EXAMPLES['ci']})" in text


def test_the_plugin_is_inert_in_a_run_that_did_not_ask_for_it(tmp_path):
    """The entry point loads the plugin into every pytest run of the environment: a user's own
    tests run as they would without it (no backend chosen, no reports written)."""
    (tmp_path / "test_unrelated.py").write_text(
        "import os\n\ndef test_untouched():\n    assert 'TRITON_INTERPRET' not in os.environ\n")
    assert "--impl=OP=module:function" in _run(["-m", "pytest", "--help"], tmp_path).stdout  # the entry point loaded it
    done = _run(["-m", "pytest", "-q", "test_unrelated.py"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "reports").exists()


def test_list_ops_prints_the_contract_and_writes_nothing_without_pytest_or_triton(tmp_path):
    done = _run(["-c", "import sys; from tritoncheck import cli; status = cli.main(['--list-ops']); "
                       "print('started:', sorted(m for m in ('pytest', 'triton', 'xdist') if m in sys.modules)); "
                       "sys.exit(status)"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| `softmax` | `softmax(x, temperature=1.0) -> y` |" in done.stdout
    assert "started: []" in done.stdout
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
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xdist" else find_spec(name, *a))
    assert workers(["softmax=m:f"]) == []


def test_live_verdicts_print_a_line_per_op_impl_dtype_when_its_last_check_reports():
    """The controller's lines (tritoncheck/terminal.py), fed reports as xdist hands them over:
    a group's line once all its checks are in, whatever the order, with the failed checks
    named, skips with their reason, and the checks the run has left."""
    from tritoncheck.terminal import LiveVerdicts
    written = []
    terminal = types.SimpleNamespace(write_line=lambda line, **markup: written.append(line))
    ids = [f"softmax-mine-{d}-{c}" for d in ("float32", "float16") for c in ("matches_reference", "rows_sum_to_one")]
    verdicts: dict[str, str] = {}
    live = LiveVerdicts(terminal, [(i, "pkg.mod:mine") for i in ids], verdicts, "tritoncheck: a run")
    live.pytest_xdist_node_collection_finished(None, [f"suite.py::test_check[{i}]" for i in ids])
    assert written == ["tritoncheck: a run: 4 checks, 2 op x implementation x dtype"]

    def finish(test: str, outcome: str, reason: str = "") -> None:
        verdicts[test] = outcome  # what the session records first
        for when in ("setup", "call", "teardown"):
            skipped = outcome == "skipped" and when == "setup"
            live.pytest_runtest_logreport(types.SimpleNamespace(
                nodeid=f"suite.py::test_check[{test}]", when=when, skipped=skipped, user_properties=[],
                longrepr=("suite.py", 1, f"Skipped: {reason}") if skipped else None))

    finish("softmax-mine-float32-matches_reference", "passed")
    finish("softmax-mine-float16-rows_sum_to_one", "skipped", "mine declares dtypes ['float32']")
    assert len(written) == 1  # neither group is complete
    finish("softmax-mine-float32-rows_sum_to_one", "failed")
    assert re.fullmatch(r"FAILED +softmax +pkg\.mod:mine +float32 +1 of 2 failed: rows_sum_to_one; 1 passed +"
                        r"\[1 check left, \d+ s\]", written[-1]), written[-1]
    finish("softmax-mine-float16-matches_reference", "skipped", "mine declares dtypes ['float32']")
    assert re.fullmatch(r"skipped +softmax +pkg\.mod:mine +float16 +2 skipped \(mine declares dtypes "
                        r"\['float32'\]\) +\[0 checks left, \d+ s\]", written[-1]), written[-1]


def test_the_command_line_passes_what_it_was_given_and_asks_pytest_for_verdict_lines():
    from tritoncheck import cli

    def args(argv: list[str]) -> list[str]:
        return cli.pytest_args(cli.parser().parse_args(argv), [], "quick")

    quiet = args(["cp_attention=m:f", "--cp-world-size", "3", "--max-examples", "4"])
    assert "--live-verdicts" in quiet and {"-q", "--tb=no"} <= set(quiet) and "-v" not in quiet
    assert quiet[quiet.index("--cp-world-size") + 1] == "3" and quiet[quiet.index("--max-examples") + 1] == "4"
    verbose = args(["softmax=m:f", "-v"])  # pytest's tracebacks, its -r summary and its -v
    assert "--live-verdicts" in verbose and "--tb=no" not in verbose and verbose.count("-v") == 1
    assert cli.EXIT_STATUS[pytest.ExitCode.USAGE_ERROR] == 2 and cli.EXIT_STATUS[pytest.ExitCode.INTERRUPTED] == 130


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
    # in brief: the first crash whole (the worker, the case it was running, its replay), the others named
    assert re.search(r"^FAILED softmax-segfaulting_softmax-float32-\w+: \w+ of segfaulting_softmax "
                     r"\(crashing_kernels:segfaulting_softmax\), crash\n  worker 'gw\d+' crashed while running "
                     r"'\S+': the process died in the implementation .*\n  case: softmax\(x, temperature\) in float32",
                     done.stdout, re.M), done.stdout[-3000:]
    assert f"the same crash failed {len(CRASHED_CHECKS) - 1} more check(s)" in done.stdout
    data = json.loads((tmp_path / "reports" / "report.json").read_text())
    records = {f["test"]: f for f in data["failures"]}
    for check in CRASHED_CHECKS:
        test = f"softmax-segfaulting_softmax-float32-{check}"
        assert data["verdicts"][test] == "failed" and records[test]["kind"] == "crash", records.get(test)
        case, replay = records[test]["case"], records[test]["replay"].split()[-1]
        assert case.startswith("softmax(x, temperature) in float32") and (tmp_path / replay).is_file()
    # the last one's file, read and run (each process imports torch: one is enough for the CPU)
    described = _run(["-m", "tritoncheck.replay", replay, "--describe"], tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert described.returncode == 0 and case in described.stdout, described.stdout + described.stderr
    report = (tmp_path / "reports" / "report.md").read_text()
    assert f"{len(CRASHED_CHECKS)} check(s) took their worker process down" in report
    fixed = _run(["-m", "tritoncheck.replay", replay, "--impl", "tritoncheck.controls.softmax:torch_softmax"],
                 tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert fixed.returncode == 0 and "passed" in fixed.stdout, fixed.stdout + fixed.stderr
