"""The pytest plugin: options, Hypothesis profiles, the run's settings, verdicts and reports.

Registered through the ``pytest11`` entry point, so an installed tritoncheck is picked up
by every pytest run in that environment. It stays inert there (its options exist, nothing
else happens) until a run asks for it: ``--impl``, ``--list-ops``, ``-p tritoncheck.plugin``,
or the ini option ``tritoncheck = true`` (the suite's own ``pyproject.toml`` sets it; the
``tritoncheck`` command passes it). An active run registers one :class:`Session`, which
holds the run's state and the hooks that need it.

Tests are told apart by markers, never by their node ids: ``tritoncheck_check`` (a check of
an implementation under test: ``tritoncheck.suite``), ``tritoncheck_cp_check`` (the same
for context-parallel attention) and ``tritoncheck_mutant`` (a self-test kill).

Hypothesis profiles are registered here, once. CI machines set ``CI=true``, on which
Hypothesis would load its own built-in ``ci`` profile; ours, registered under the same
name, replaces it and is loaded explicitly.
"""
from __future__ import annotations

import importlib.util
import math
import os
import traceback
from pathlib import Path

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import InvalidArgument
from hypothesis.vendor import pretty

from tritoncheck import backend, devices, unrunnable
from tritoncheck.config import CONFIG, PROFILE_SIZES, RunConfig
from tritoncheck.profiles import EXAMPLES, PROFILES
from tritoncheck.worker_crashes import CRASH_PROPERTY

FAILURE_ATTRIBUTE = "tritoncheck_failure"  # a failed check's record, on its test report
NAME = "tritoncheck.plugin"  # the entry point's name: `-p tritoncheck.plugin` is then the same plugin
CHECK, MUTANT, IMPL = "tritoncheck_check", "tritoncheck_mutant", "tritoncheck_impl"
MARKERS = {
    CHECK: "a check of an implementation under test (tritoncheck.suite); --impl keeps these",
    IMPL: "another test of the implementations under test (the large-index check); --impl keeps these too",
    MUTANT: "a mutation self-test kill: counted in the kill rate and the time to kill",
    "large": "inputs past 2**31 elements (CUDA only, skipped with the reason elsewhere)",
}
# The Triton interpreter evaluates kernels with NumPy, which warns on IEEE results the GPU
# computes silently (log(0) = -inf on a fully masked row).
INTERPRETER_WARNINGS = ("ignore:invalid value encountered:RuntimeWarning",
                        "ignore:overflow encountered:RuntimeWarning",
                        "ignore:divide by zero encountered:RuntimeWarning:triton.runtime.interpreter")

# Each suppressed health check with its reason; the others stay on.
SUPPRESSED = {
    # Kernels compile on their first call and the fp64 references are slow by design: a
    # slow example is the cost of the check, not a strategy drawing too much.
    HealthCheck.too_slow: "first calls compile kernels; fp64 references are slow by design",
    # Cases are descriptions (shapes, seeds), never bulk data; the few large ones are
    # the multi-block sizes the suite exists to reach.
    HealthCheck.data_too_large: "large shapes are drawn on purpose (rows past every block)",
    # Hypothesis's filter_too_much judges the first draws only (50 discarded before 10
    # kept) and ends the test in an error that names neither the refusals nor the
    # preconditions. Its equivalent here judges the whole test: fewer counted examples
    # than MIN_COUNTED_SHARE of the budget fail it as not reached, naming where the
    # examples went (tritoncheck/harness.py below_min_counted), and undeclared refusals
    # past their share fail it (UNDECLARED_SHARE_MAX); declared refusals are rejected
    # examples and must end in a pass on what the kernel accepts, or a skip naming them.
    HealthCheck.filter_too_much: "replaced by the minimum of counted examples per test (MIN_COUNTED_SHARE)",
    # the checks are one function parametrised over every (op, impl, dtype, check): its
    # executor is the Target, which differs by design.
    HealthCheck.differing_executors: "one parametrised test function runs every target",
}
_COMMON = dict(
    deadline=None,  # first calls compile kernels; time is not what is checked
    # no "@reproduce_failure(...) as a decorator on your test function": the function is the
    # suite's, and a failed check's replay files (tritoncheck/harness.py save_failure) replay
    # its case without Hypothesis; the example database replays it first in the next run
    print_blob=False,
    suppress_health_check=list(SUPPRESSED),
)
# Hypothesis prints each value a failing test drew ("Draw 1 (case): Case(op='softmax', ...)",
# 20 lines of dataclass fields): a case is printed in words, on one line, instead.
pretty.for_type_by_name("tritoncheck.strategies", "Case",
                        lambda case, p, cycle: p.text("; ".join(line.strip() for line in case.describe().splitlines())))
# Per profile, the share of max_examples that must have counted (run the check to the end:
# neither discarded by assume nor refused) for a test to pass; fewer fail it as not reached
# (tritoncheck/harness.py below_min_counted). Half: dev 10 of 20, ci 5 of 10, gpu 50 of 100,
# nightly 500 of 1000; --max-examples N: ceil(N / 2). Hypothesis itself stops only once
# discards pass 458 + 100 per counted example, so a test can otherwise pass on one.
MIN_COUNTED_SHARE = {"quick": 0.5, "dev": 0.5, "ci": 0.5, "gpu": 0.5, "nightly": 0.5}
# A first verdict on every check of an op in under a minute on one GPU, compilation
# included (issue 25: at the gpu profile third-party ops gave none in 480 s, most of it
# Triton compiling a kernel per new shape and constexpr). Cheap on three counts:
# - few examples: 10, so the minimum of counted examples is 5 a test;
# - bounded compilations: the dims kernels specialise or autotune on come from a pool of
#   QUICK_SHAPES sizes per (op, dim) besides the block boundaries (tritoncheck/shape_pool.py;
#   --shapes overrides), at the interpreter's small sizes (config.PROFILE_SIZES), whatever
#   the example count. 4, not 1: at 1 the pool is nearly all powers of two, and softmax's
#   padded_lanes_zero (a row off a power of two) survived all 12 float32 checks;
# - no shrinking, which reruns a failure hundreds of times (new shapes, new compilations)
#   for a smaller case: a failure is reported as found, replay files and all; the gpu
#   profile that follows (the tritoncheck command runs it next) shrinks;
# - the pool's sizes in any power-of-two class (--shape-classes K, opt-in, narrows them to
#   K classes a dim, and with it couples the variants and narrows chunk sizes and seeds): kernels derive block constexprs by next_power_of_2,
#   so each class is a compilation of every kernel of the op (attention drew 4 head-dim
#   classes: 95 compile keys in float32, benchmarks/compile_keys.py), but one class is
#   one range of row lengths: at 1, the default CPU run's softmax with a TypeError on rows
#   past 64 and one refusing them passed (every row drawn was at most 64: issue 24's
#   unearned green), and a planted attention bug in a wide causal window passed;
# - autotuned kernels an implementation declares run config 0 only (--autotune-config
#   overrides): each config is a compilation per key, and the configs in turn, one per
#   example, compiled a config per example. Checking every config on fresh NaN outputs (the
#   cheat of a config that writes nothing, autotune_configs.each_in_turn) is the gpu
#   profile's, which the tritoncheck command runs next.
settings.register_profile("quick", max_examples=EXAMPLES["quick"], phases=(Phase.explicit, Phase.reuse, Phase.generate),
                          **_COMMON)
QUICK_SHAPES = 4
QUICK_AUTOTUNE_CONFIG = 0
settings.register_profile("dev", max_examples=EXAMPLES["dev"], **_COMMON)
# Sized for the Triton interpreter on a 2-core CPU: small shapes (CONFIG.size),
# derandomized so CI is reproducible. 10 examples (5 must count), besides the length
# classes every row-wide test runs on purpose first (harness.run_length_classes): with 15
# ops, the cheat gauntlet and the meta-tests, 20 put the default run at 30+ minutes on two
# cores, twice the CI budget. Depth is the gpu profile's (100) and nightly's (1000); when
# the ci profile had 20, 30 examples found an fp64 reference NaN that 6 and 15 missed.
settings.register_profile("ci", max_examples=EXAMPLES["ci"], derandomize=True, database=None, **_COMMON)
settings.register_profile("gpu", max_examples=EXAMPLES["gpu"], **_COMMON)
settings.register_profile("nightly", max_examples=EXAMPLES["nightly"], **_COMMON)


def pytest_addoption(parser):
    parser.addini("tritoncheck", type="bool", default=False,
                  help="activate tritoncheck's plugin for this run (the suite's checkout sets it)")
    group = parser.getgroup("tritoncheck", "Triton kernel checks")
    group.addoption("--backend", choices=backend.BACKENDS, default="auto",
                    help="cuda, interpret (Triton interpreter on CPU) or auto (cuda if available)")
    group.addoption("--op", action="append", default=[], help="run only this op (repeatable)")
    group.addoption("--dtype", action="append", default=[], help="run only this dtype: float32, float16, bfloat16")
    group.addoption("--impl", action="append", default=[], metavar="OP=module:function",
                    help="test this function for OP instead of the project's kernel (repeatable); only the ops named run, "
                         "at the quick profile unless --hypothesis-profile names another (gpu for depth)")
    group.addoption("--op-module", action="append", default=[], metavar="MODULE",
                    help="import MODULE, whose tritoncheck.op definitions become ops of the run (repeatable; also "
                         "[tool.tritoncheck] op-modules in pyproject.toml, and OP=... written module:op)")
    group.addoption("--report-dir", default="reports", help="where the tolerance report and failing cases go")
    group.addoption("--max-examples", type=int, default=None,
                    help="examples per test, overriding the profile's (sizes still follow the profile)")
    group.addoption("--list-ops", action="store_true", help="print the contract table of every op and exit")
    group.addoption("--refusals", choices=("auto", "discard", "fail"), default="auto",
                    help="a refusal: an implementation raising tritoncheck.Refusal or an error its fn.refuses "
                         "declares (declared), or ValueError/TypeError/NotImplementedError (undeclared). discard: "
                         "every refusal is counted and shown, a test past 20%% undeclared ones fails; fail: every "
                         "refusal fails; auto (default): undeclared ones fail with their traceback, declared ones "
                         "are discarded, and every refusal of the project's own kernels, mutants and controls fails")
    group.addoption("--shapes", type=int, default=None, metavar="N",
                    help="draw the dims kernels specialise or autotune on (head dims, heads, batch, last dims) from "
                         "a pool fixed for the run per (op, dtype, dim): the block boundaries and N other sizes (default 4 in "
                         "the quick profile, else no pool); "
                         "sequence and row counts stay free (bounds compilations of autotuned kernels)")
    group.addoption("--shapes-seed", type=int, default=0, help="which N values --shapes picks")
    group.addoption("--shape-classes", type=int, default=None, metavar="K",
                    help="with --shapes: the pool keeps sizes of K power-of-two classes (2^(k-1), 2^k] only, chosen "
                         "per run (--shapes-seed): one compilation of a kernel's block constexprs per class (off by "
                         "default: every class)")
    group.addoption("--autotune-config", default=None, metavar="tuned|I",
                    help="tuned (default, but 0 in the quick profile): the kernels an implementation declares in fn.autotuned run their configs "
                         "in turn, one per example, each on fresh NaN-filled outputs (undeclared ones autotune as "
                         "they do); an index I: every kernel an "
                         "implementation declares in fn.autotuned runs its config I (modulo its count) only, one "
                         "compilation per new size instead of a sweep (benchmarks/autotune_sweep.py checks each config)")
    group.addoption("--cp-world-size", type=int, default=None, metavar="W",
                    help="ranks (processes; on CUDA one GPU each) a distributed op's implementation runs on "
                         "(cp_attention; gloo on CPU, NCCL on GPUs); default 2")
    group.addoption("--tolerance", choices=("derived", "parity"), default="derived",
                    help="derived (default): fail past the derived allowance; parity: fail only past both it and "
                         "2x plain PyTorch's error in the input dtype on the same input (tritoncheck/parity.py)")
    group.addoption("--live-verdicts", action="store_true",
                    help="print one line per op x implementation x dtype as its checks' verdicts come and the "
                         "failures in brief at the end, instead of a dot per test (the tritoncheck command's "
                         "output, with -q --tb=no -o console_output_style=classic: no header, tracebacks or "
                         "progress percentage)")
    group.addoption("--shard", default=None, metavar="K/N",
                    help="run only the K-th of N deterministic shares of the tests (by a hash of each test id: the "
                         "same on every machine and in every order); `tritoncheck report merge` joins the shards' "
                         "report.json files into the whole run's report")


def active(config) -> bool:
    """Whether this run asked for the suite (see the module docstring)."""
    plugins = getattr(config.option, "plugins", None) or []
    return bool(config.getini("tritoncheck") or config.getoption("--impl") or config.getoption("--list-ops")
                or NAME in plugins)


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's plugin loads the profile (an unknown one is an internal error there)
def pytest_cmdline_main(config):
    if not active(config):
        return None
    profile = config.getoption("hypothesis_profile", None)
    if profile is not None:
        try:
            settings.get_profile(profile)
        except InvalidArgument:
            raise pytest.UsageError(f"--hypothesis-profile {profile!r}: unknown; the suite's profiles are "
                                    f"{', '.join(PROFILES)}") from None
    if config.getoption("--shard"):
        from tritoncheck.report import shards
        try:
            shards.parse(config.getoption("--shard"))
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    n = config.getoption("--max-examples")
    if n is not None and n < 1:
        raise pytest.UsageError(f"--max-examples {n}: must be at least 1")
    if config.getoption("--list-ops"):
        backend.select(config.getoption("--backend"))
        from tritoncheck import contract
        print(contract.markdown_table())
        return 0
    report_dir = Path(config.getoption("--report-dir"))
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        # one probe a process: xdist's workers run this too, and a shared name raced (one worker
        # unlinked the probe another had just written: "cannot write there", a crashed worker)
        probe = report_dir / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink(missing_ok=True)
    except OSError as exc:
        raise pytest.UsageError(f"--report-dir {str(report_dir)!r}: cannot write there ({exc.strerror or exc})") from None
    return None


@pytest.hookimpl(tryfirst=True, specname="pytest_configure")  # before xdist's (trylast) reads the option
def _restart_limit_before_xdist(config):
    if active(config) and not _is_worker(config) and _distributed(config):
        from tritoncheck import worker_crashes
        worker_crashes.provisional_limit(config)


@pytest.hookimpl(trylast=True)  # after Hypothesis's plugin loads --hypothesis-profile, so --max-examples caps it
def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if not active(config):
        return
    for warning in INTERPRETER_WARNINGS:
        config.addinivalue_line("filterwarnings", warning)
    # Triton's compile cache ($TRITON_CACHE_DIR, default ~/.triton/cache) is already one
    # directory shared by every process; autotune timings are not written there unless
    # asked: ask, so that each config sweep runs once per key for all xdist workers (and
    # later runs) instead of once per worker. Before --impl imports the user's kernels:
    # triton.autotune reads it when a kernel is decorated. The interpreter ignores it.
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    try:
        chosen = backend.select(config.getoption("--backend"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    # One GPU per xdist worker (gw<i> -> GPU i % G), before anything (a --impl module at
    # import, below) can make a tensor on CUDA's default device
    devices.select_worker_gpu(config.workerinput["workerid"] if _is_worker(config) else None, chosen)
    profile = config.getoption("hypothesis_profile", None) or default_profile(config, chosen)
    settings.load_profile(profile)
    if config.getoption("--max-examples"):
        settings.register_profile(f"{profile}-capped", parent=settings.get_profile(profile),
                                  max_examples=config.getoption("--max-examples"))
        settings.load_profile(f"{profile}-capped")
    from tritoncheck import harness
    harness.set_min_counted(math.ceil(MIN_COUNTED_SHARE.get(profile, 0.5) * settings.default.max_examples))
    try:
        _configure_run(config, profile)
    except (ValueError, TypeError) as exc:  # a bad --impl, or a kernel's declarations that do not validate
        raise pytest.UsageError(str(exc)) from None
    session = Session(config, profile, chosen)
    config.pluginmanager.register(session, "tritoncheck-session")
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if config.getoption("--live-verdicts") and not _is_worker(config) and terminal is not None:
        from tritoncheck.terminal import LiveVerdicts
        workers = config.getoption("numprocesses", None) if _distributed(config) else None
        header = f"tritoncheck: profile {profile}, {chosen} backend" + (f", {workers} worker(s)" if workers else "")
        config.pluginmanager.register(LiveVerdicts(terminal, [(t.id, t.impl.target or t.impl.name)
                                                               for t in harness.targets()], session.verdicts, header),
                                      "tritoncheck-live-verdicts")
    if not _is_worker(config) and _distributed(config):
        from tritoncheck import worker_crashes
        check_ids = {t.id for t in harness.targets()}
        raised = worker_crashes.raise_restart_limit(config, len(check_ids))
        workers = config.getoption("numprocesses", None) or 1
        config.pluginmanager.register(worker_crashes.WorkerCrashes(
            CONFIG.report_dir, check_ids, CHECK, startup_crashes_max=worker_crashes.XDIST_RESTARTS_PER_WORKER * workers if raised else None),
            "tritoncheck-worker-crashes")


def _distributed(config) -> bool:
    """Whether pytest-xdist runs this session's tests in workers (its own test of it)."""
    return config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") != "no" \
        and bool(config.getoption("tx", None))


@pytest.hookimpl(trylast=True)  # after the session's header, printed at every verbosity (-q hides the header)
def pytest_sessionstart(session):
    """One line for a run of the user's own kernels (--impl) in a single process: a kernel
    that crashes it takes the whole run down, where an xdist worker would be replaced and
    the crash reported as that test's failure (the ``tritoncheck`` command runs xdist workers).
    At the start: a run that crashes prints no summary."""
    config = session.config
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None or not active(config) or not config.getoption("--impl") or _is_worker(config) \
            or config.getoption("numprocesses", None):
        return
    terminal.write_line(crash_isolation_hint(importlib.util.find_spec("xdist") is not None))


def crash_isolation_hint(xdist_installed: bool) -> str:
    how = "add -n 1 (pytest-xdist)" if xdist_installed else "pip install pytest-xdist, then add -n 1"
    return (f"tritoncheck: no crash isolation: one process runs every check, so a kernel that crashes (segfault, "
            f"abort) ends the run; {how} to have a crashed worker replaced and that test failed, named")


def default_profile(config, chosen_backend: str) -> str:
    """Without --hypothesis-profile: ``quick`` for a run of the user's own functions
    (--impl), a verdict in a minute first; else ``gpu`` on CUDA and ``ci`` elsewhere."""
    if config.getoption("--impl"):
        return "quick"
    return "gpu" if chosen_backend == "cuda" else "ci"


def _configure_run(config, profile: str) -> None:
    """The run's settings (``CONFIG``) and implementations from the command line."""
    from tritoncheck import registry
    from tritoncheck.strategies import FLOAT_DTYPES, dtype_from_name

    CONFIG.size = PROFILE_SIZES.get(profile, "small")
    CONFIG.report_dir = Path(config.getoption("--report-dir"))
    CONFIG.tolerance = config.getoption("--tolerance")
    CONFIG.shapes, CONFIG.shapes_seed = config.getoption("--shapes"), config.getoption("--shapes-seed")
    if CONFIG.shapes is None and profile == "quick":
        CONFIG.shapes = QUICK_SHAPES  # bounded compilations (see the quick profile)
    if CONFIG.shapes is not None and CONFIG.shapes < 1:
        raise ValueError(f"--shapes must be at least 1, got {CONFIG.shapes}")
    CONFIG.shape_classes = config.getoption("--shape-classes")
    if CONFIG.shape_classes is not None and CONFIG.shape_classes < 1:
        raise ValueError(f"--shape-classes must be at least 1, got {CONFIG.shape_classes}")
    autotune = config.getoption("--autotune-config")
    if autotune is None:
        autotune = str(QUICK_AUTOTUNE_CONFIG) if profile == "quick" else "tuned"
    if autotune != "tuned" and not autotune.isdigit():
        raise ValueError(f"--autotune-config must be 'tuned' or a config index >= 0, got {autotune!r}")
    CONFIG.autotune_config = None if autotune == "tuned" else int(autotune)
    from tritoncheck.define import discovery
    discovery.load(config.getoption("--op-module"),
                   [spec.partition("=")[0] for spec in config.getoption("--impl")])
    CONFIG.ops = tuple(config.getoption("--op")) or None
    CONFIG.refusals = config.getoption("--refusals")
    CONFIG.dtypes = tuple(dtype_from_name(d) for d in config.getoption("--dtype")) or None
    known = [*FLOAT_DTYPES, *(d for spec in registry.load().values() for d in spec.dtypes if d not in FLOAT_DTYPES)]
    for name, dtype in zip(config.getoption("--dtype"), CONFIG.dtypes or ()):
        if dtype not in known:
            raise ValueError(f"--dtype {name}: the contract's dtypes are "
                             f"{', '.join(str(d).replace('torch.', '') for d in dict.fromkeys(known))}")
    unknown = sorted(set(CONFIG.ops or ()) - set(registry.load()))
    if unknown:
        raise ValueError(f"--op {', '.join(unknown)}: {registry.unknown_op(unknown[0])}")
    world = config.getoption("--cp-world-size")
    if world is not None and world < 1:
        raise ValueError(f"--cp-world-size {world}: must be at least 1")
    CONFIG.world_size = world or RunConfig.world_size
    for spec in config.getoption("--impl"):
        op, sep, target = spec.partition("=")
        if not sep:
            raise ValueError(f"--impl {spec!r}: expected OP=package.module:function")
        registry.register_implementation(discovery.op_name(op), target.strip())
    user = registry.user_implementations()
    if user and CONFIG.ops and not set(CONFIG.ops) & set(user):
        raise ValueError(f"--op {', '.join(CONFIG.ops)} selects none of the ops given with --impl "
                         f"({', '.join(sorted(user))}): nothing would run")
    CONFIG.configured = True


def _report_unrunnable(exc: unrunnable.Unrunnable, report, item) -> None:
    """A test ended because every input it tried raised (tritoncheck/unrunnable.py): failed
    with the verdict, no Hypothesis output; skipped, with the verdict, when every error is
    the Triton interpreter's (not a verdict on the kernel)."""
    if exc.verdict.skip:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {exc.verdict.text}")
    else:
        report.longrepr = exc.verdict.text


def _report_raised_inputs(target, excinfo, report) -> None:
    """A check whose implementation raised on inputs: the summary's entries travel in
    ``user_properties`` (serialised by xdist); a failure that is not the raised inputs'
    verdict itself (a wrong value on an accepted input) carries it as a section, and a
    Hypothesis ``Unsatisfiable`` (no input accepted before its own limit) is replaced by it."""
    from hypothesis.errors import Unsatisfiable

    from tritoncheck import harness
    verdict = harness.raised_inputs_verdict(target)
    if verdict is None:
        return
    report.user_properties.append((unrunnable.PROPERTY, tuple(tuple(vars(e).values()) for e in verdict.entries)))
    if not report.failed or f"{target.id}: {target.impl.name} raised" in str(report.longrepr):
        return
    if excinfo is not None and excinfo.errisinstance(Unsatisfiable):
        report.longrepr = verdict.text
    else:
        report.sections.append(("inputs the implementation raised on", verdict.text))


def _hide_suite_frames(excinfo) -> bool:
    """A failed check's traceback as pytest will print it, without the suite's own frames
    (its engine, checks and references, as ``__tracebackhide__`` would hide them): from the
    test down to the code under test, and the frame that raised. Whether every frame was the
    suite's (the check's own verdict, not an exception out of the code under test).
    ``--full-trace`` keeps them all."""
    import _pytest
    import pluggy
    from _pytest._code import Traceback

    from tritoncheck.report.failures import suite_frame
    # pytest's, pluggy's and Hypothesis's frames (above the test) pytest cuts or hides itself
    runners = tuple(str(Path(m.__file__).parent) for m in (_pytest, pluggy, hypothesis))
    entries = list(excinfo.traceback)
    kept = [e for e in entries if not suite_frame(str(e.path)) and not str(e.path).startswith(runners)]
    excinfo.traceback = Traceback(kept if kept and kept[-1] is entries[-1] else kept + entries[-1:])
    return not kept


class Session:
    """One active run: what it counted, skipped and killed, and the hooks that read it."""

    def __init__(self, config, profile: str, chosen_backend: str):
        from tritoncheck import harness
        from tritoncheck.report import collect
        self.config = config
        self.profile = profile
        self.backend = chosen_backend
        self.worker = config.workerinput["workerid"] if _is_worker(config) else None
        self.skipped: list[dict] = []
        self.counted = 0  # checks of an implementation under test that passed or failed
        self.kills: list[tuple[str, bool, float]] = []
        self.report: dict | None = None
        self.nothing_checked = False
        self.unrunnable: list[unrunnable.Entry] = []  # the raised inputs' summary entries, every check's
        self.verdicts: dict[str, str] = {}  # check id -> passed, failed, skipped, xfailed, xpassed, error
        self.crashes: dict[str, str] = {}  # check id -> what xdist and tritoncheck said of its crashed worker
        self.failures: dict[str, dict] = {}  # check id -> its record (tritoncheck/report/failures.py)
        from tritoncheck.report import shards
        self.shard = shards.parse(config.getoption("--shard")) if config.getoption("--shard") else None
        # A wild or misaligned access on the GPU leaves the process's CUDA context broken
        # for good: every later CUDA call in it fails with the same error, so every later
        # test in this process (or xdist worker) would fail too and blame itself.
        self.cuda_broken_by: str | None = None
        harness.set_collector(collect.Collector())
        if self.worker is None:
            from tritoncheck.report import failures
            collect.clear_parts(CONFIG.report_dir)
            failures.clear(CONFIG.report_dir)
        else:
            # Each xdist worker's fp64 references would otherwise start one thread per core:
            # 14 workers on 16 cores ran 14 x 16 threads and spent the GPU run waiting on them.
            import torch
            workers = int(config.workerinput.get("workercount", 1))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
            from tritoncheck import worker_crashes
            harness.set_in_flight(worker_crashes.in_flight_path(CONFIG.report_dir, self.worker))

    @staticmethod
    def user_implementations() -> bool:
        from tritoncheck import registry
        return bool(registry.user_implementations())

    def pytest_collection_modifyitems(self, config, items):
        """With --impl, only the tests of the user's implementations run: the suite's own
        kernel tests and self-tests are about the suite, not about the user's kernel."""
        keep = [i for i in items if not self.user_implementations()
                or i.get_closest_marker(CHECK) or i.get_closest_marker(IMPL)]
        if self.shard is not None:
            from tritoncheck.report.shards import shard_of
            keep = [i for i in keep if shard_of(i.nodeid, self.shard[1]) == self.shard[0]]
        if len(keep) < len(items):
            config.hook.pytest_deselected(items=[i for i in items if i not in keep])
            items[:] = keep

    def pytest_runtest_logreport(self, report):
        if MUTANT in report.keywords and report.when == "call":
            # the call's duration is the time to kill: the hunt in each dtype until one fails
            self.kills.append((report.nodeid.partition("[")[2].rstrip("]"), report.passed, report.duration))
        if CHECK not in report.keywords:
            return
        for key, value in report.user_properties:
            if key == unrunnable.PROPERTY:
                self.unrunnable.extend(unrunnable.Entry(*entry) for entry in value)
            if key == CRASH_PROPERTY:
                from tritoncheck.report import failures
                test = report.nodeid.partition("[")[2].rstrip("]")
                self.crashes[test] = value
                self.failures.setdefault(test, failures.of_crash(test, value, CONFIG.report_dir))
        if getattr(report, FAILURE_ATTRIBUTE, None):  # the first: a teardown error keeps the call's failure
            self.failures.setdefault(report.nodeid.partition("[")[2].rstrip("]"), getattr(report, FAILURE_ATTRIBUTE))
        self._record_verdict(report)
        if report.when == "call" or (report.when == "setup" and report.skipped):
            if report.skipped:
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                outcome = "xfail" if hasattr(report, "wasxfail") else "skipped"
                self.skipped.append({"test": report.nodeid.split("::")[-1], "outcome": outcome,
                                     "reason": getattr(report, "wasxfail", None) or reason.replace("Skipped: ", "")})
            elif report.passed or report.failed:
                self.counted += 1

    def _record_verdict(self, report) -> None:
        """The check's outcome in the report (``verdicts``), keyed by its id (the nodeid's
        parameter part): what ``report diff`` compares and the summary counts."""
        test = report.nodeid.partition("[")[2].rstrip("]") or report.nodeid
        if report.when == "call" or report.skipped or report.failed:
            if hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.skipped else "xpassed"
            elif report.failed and report.when != "call":
                outcome = "error"
            else:
                outcome = report.outcome
            if self.verdicts.get(test) not in ("failed", "error"):  # a teardown error keeps the call's failure
                self.verdicts[test] = outcome

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        """A check whose examples all passed still fails when its pass was not earned:
        most examples vacuous, undeclared refusals past their share, or fewer counted
        examples than the minimum (``tritoncheck.harness.unearned_pass``). Before
        Hypothesis draws at random, the check runs once at each length class its rows can
        reach (``tritoncheck.harness.run_length_classes``), in every profile."""
        if item.get_closest_marker(CHECK):
            from tritoncheck import harness
            harness.run_length_classes(item.callspec.params["target"])
        result = yield
        if item.get_closest_marker(CHECK):
            from tritoncheck import harness
            # Hypothesis's statistics (set by its plugin's wrapper, inside this one) say
            # when it stopped because there was no distinct case left to draw
            exhausted = "nothing left to do" in getattr(item, "hypothesis_statistics", "")
            harness.finish(item.callspec.params["target"], exhausted)
        return result

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        suite_only = False
        # a skip or an xfail keeps its frames: pytest reports it from its last visible one
        if call.excinfo is not None and item.get_closest_marker(CHECK) and not item.config.getoption("fulltrace") \
                and not call.excinfo.errisinstance((pytest.skip.Exception, pytest.xfail.Exception)):
            suite_only = _hide_suite_frames(call.excinfo)
        report = (yield).get_result()
        if call.when != "call":
            return
        if suite_only and report.failed:
            # the check's own verdict (a value off, too few examples): its message says it all
            # (the worst element, the case, the replay); the suite's source would not
            report.longrepr = "".join(traceback.format_exception_only(call.excinfo.type, call.excinfo.value)).rstrip()
        ended = call.excinfo is not None and call.excinfo.errisinstance(unrunnable.Unrunnable)
        if ended:
            _report_unrunnable(call.excinfo.value, report, item)
        if item.get_closest_marker(CHECK):
            from tritoncheck import harness
            target = item.callspec.params["target"]
            if not ended:
                harness.account_refusals(target, call.excinfo, report, item)
            _report_raised_inputs(target, call.excinfo, report)
        self._broken_context(item, call, report)
        if report.failed and call.excinfo is not None and item.get_closest_marker(CHECK):
            from tritoncheck.report import failures
            # an attribute of the report: xdist carries it to the controller with the report
            setattr(report, FAILURE_ATTRIBUTE, failures.of_exception(item.callspec.params["target"],
                                                                     call.excinfo.value, CONFIG.report_dir))

    def _broken_context(self, item, call, report) -> None:
        """A test that left this process's CUDA context broken (tritoncheck/worker_crashes.py)
        fails, naming the error (and, for a check, its case and replay). In an xdist worker
        the worker then ends itself, inside this test, so that xdist counts this test as the
        crash and runs the others in a fresh worker; in a single process the later tests
        cannot run (:meth:`pytest_runtest_setup` fails them, naming this one)."""
        from tritoncheck import worker_crashes
        if call.excinfo is not None and call.excinfo.errisinstance(worker_crashes.ContextBroken):
            text = call.excinfo.value.text
        elif self.cuda_broken_by is None and (error := worker_crashes.broken_context(self.backend)):
            text = (f"{item.nodeid}: the CUDA context of this process was found broken at the end of this test: "
                    f"{error} (the test itself {report.outcome}; CUDA reports a kernel's error at a later call)")
        else:
            return
        self.cuda_broken_by = f"{item.nodeid} ({text.splitlines()[0].partition(': ')[2]})"
        if self.worker is not None:
            from tritoncheck import harness
            try:  # the report's rows of this worker's earlier tests; the worker ends whether or not
                harness.collector().dump(CONFIG.report_dir / "parts", self.worker, gpu=devices.current_gpu(self.backend))
            except Exception:  # noqa: BLE001, S110 - a broken context may refuse even this
                pass
            worker_crashes.in_flight_path(CONFIG.report_dir, self.worker).unlink(missing_ok=True)
            worker_crashes.end_worker(CONFIG.report_dir, self.worker, item.nodeid, text)
        report.outcome, report.longrepr = "failed", (
            f"{text}\n(a single process runs every test here, so the tests after this one cannot run: with "
            "pytest-xdist (-n 1) or the tritoncheck command a broken worker is replaced instead)")

    def pytest_runtest_setup(self, item):
        if self.cuda_broken_by:
            pytest.fail(f"not run: the CUDA context of this process was broken by {self.cuda_broken_by}; "
                        "every CUDA call here now fails. Run with pytest-xdist (-n 1) or the tritoncheck command, "
                        "whose broken worker is replaced and this test run, or fix or deselect that test.",
                        pytrace=False)

    def pytest_sessionfinish(self, session, exitstatus):
        import torch

        from tritoncheck import harness, report
        harness.collector().dump(CONFIG.report_dir / "parts", self.worker or "main",
                                 gpu=devices.current_gpu(self.backend))
        if self.worker is not None:
            from tritoncheck import worker_crashes
            worker_crashes.in_flight_path(CONFIG.report_dir, self.worker).unlink(missing_ok=True)
            return
        device = torch.cuda.get_device_name() if self.backend == "cuda" else "cpu (Triton interpreter)"
        import triton
        meta = {"backend": self.backend, "profile": self.profile, "device": device,
                "torch": torch.__version__, "triton": triton.__version__, "tolerance": CONFIG.tolerance,
                "shapes": CONFIG.shapes, "shape_classes": CONFIG.shape_classes,
                "autotune_config": CONFIG.autotune_config,
                "shard": "{}/{}".format(*self.shard) if self.shard else None}
        from tritoncheck.report import files
        self.report = report.build(CONFIG.report_dir, self.skipped, meta, limits=self._declared_limits(),
                                   verdicts=self.verdicts, crashes=self.crashes,
                                   failures=list(self.failures.values()))
        files.write(CONFIG.report_dir, self.report)
        if self.user_implementations() and self.counted == 0 and exitstatus in (0, 5):
            # Every check of the user's implementation was skipped: nothing was verified.
            self.nothing_checked = True
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @staticmethod
    def _declared_limits() -> dict[str, str]:
        from tritoncheck import harness
        return {f"{t.op.name}-{t.impl.name}": t.impl.limits.describe() for t in harness.targets() if t.impl.limits}

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        from tritoncheck import terminal
        terminal.end_of_run(terminalreporter, self, CONFIG.report_dir, live=config.getoption("--live-verdicts"))
