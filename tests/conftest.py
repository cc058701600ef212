"""The checkout's test tiers, told apart by markers (registered in pyproject.toml; the list of
what runs where is docs/ci.md, "Test tiers"):

- ``smoke``: command 1 of the README. The project's softmax passes every check in float32,
  planted bugs are caught, each with a replay that reproduces it, through pytest and through
  the installed command.
- unmarked (``smoke`` included): every commit's CI, ``.ci/run``'s ``pytest -m "not slow"``.
- ``slow``: the nightly workflow's CPU job (``tox -e cpu-slow``, ``pytest -m slow``) and the
  GPU run (``scripts/gpu_run.sh``, which runs whole files and the marked tests of the others).

``-m "not slow"`` and ``-m slow`` partition the tests, so each runs in one of the two CPU
runs (tests/test_workflows.py checks that the two commands stay so).

The suite's checks of the project's kernels (tests/test_checks.py) are parametrised by the
engine from the registry, so their tier is a rule here rather than a decorator: every check
of every op runs on every commit in one dtype (at COMMIT_TIER_EXAMPLES examples, below), the
dtypes taken in turn along the op's checks (check i in the i-th of the dtypes it runs in
here, modulo their number), so that every
dtype of every op is exercised too; its other dtypes are ``slow``. Softmax in float32 is
also ``smoke``. A user's ``--impl`` run is never tiered.
"""
from __future__ import annotations

import pytest

from tritoncheck import registry
from tritoncheck.define import op as define_op
from tritoncheck.plugin import CHECK

# Marker expression -> what it runs, and its duration on an idle 2-core CPU (Triton interpreter),
# measured and estimated as docs/ci.md says; printed before a run starts.
ESTIMATES = {
    "smoke": ("command 1: a correct kernel passes, planted bugs are caught with a replay", "1.5 minutes"),
    "not slow": ("every commit's CI tier", "12 minutes"),
    "slow": ("the nightly tier (the other dtypes, the rest of the self-test)", "20 minutes"),
    "": ("every test, both tiers", "30 minutes"),
}
SMOKE_OP, SMOKE_DTYPE = "softmax", "float32"
# Every commit's tier runs the suite's checks (and the other tests that draw from the run's
# profile) at the ci profile's first 5 derandomized draws, not its 10, besides the length
# classes each row-wide test runs first: the same draws on every commit, so more of them add a
# fixed set of cases, not a fresh hunt (measured, attention's and layer_norm's 37 commit checks
# on 2 cores: 145 s at 10 examples, 86 s at 5). Not 3 (57 s): the vacuity verdict (an output
# the check could not have failed in half the examples fails the test) is then decided by one
# example, and ssd_scan's zero_input_decays_initial_state failed on 2 vacuous draws of 3. The
# commit tier is the regression net that keeps every check of every op running within CI's
# 15 minutes; depth is the slow tier's and the GPU run's, which keep their profile's count, as
# a user's run does. The planted bugs' hunts (tests/test_selfcheck.py) set their own.
COMMIT_TIER_EXAMPLES = 5


def pytest_report_header(config):
    expression = (config.getoption("markexpr", "") or "").strip()
    if expression not in ESTIMATES or config.getoption("--impl", None):
        return None
    what, duration = ESTIMATES[expression]
    selection = f'-m "{expression}"' if expression else "no -m"
    return (f"tritoncheck tests ({selection}): {what}; about {duration} on 2 idle CPU cores, longer on a busy "
            "machine (docs/ci.md, Test tiers)")


def pytest_configure(config):
    """-m "not slow" without --max-examples, a profile or --impl: the commit tier's count.
    Before the plugin's own pytest_configure (trylast), which caps the profile with it."""
    expression = (config.getoption("markexpr", "") or "").strip()
    if (expression == "not slow" and config.getoption("--max-examples", None) is None
            and not config.getoption("hypothesis_profile", None) and not config.getoption("--impl", None)):
        config.option.max_examples = COMMIT_TIER_EXAMPLES


def _project_check(item):
    if item.get_closest_marker(CHECK) is None or not hasattr(item, "callspec"):
        return None
    target = item.callspec.params.get("target")
    return target if target is not None and target.impl.kind == "kernel" else None


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(config, items):
    groups: dict[tuple[str, str, str], list] = {}
    for item in items:
        target = _project_check(item)
        if target is not None:
            groups.setdefault((target.op.name, target.impl.name, target.check.name), []).append((target, item))
    for (op_name, _, check_name), members in groups.items():
        op = members[0][0].op
        runnable = [(t, item) for t, item in members if item.get_closest_marker("skip") is None]
        runnable.sort(key=lambda pair: op.dtypes.index(pair[0].dtype))
        if not runnable:
            continue  # skipped everywhere here: each skip, with its reason, is reported on every commit
        index = [c.name for c in op.checks].index(check_name)
        every_commit = runnable[index % len(runnable)][1]
        for target, item in runnable:
            smoke = op_name == SMOKE_OP and str(target.dtype) == f"torch.{SMOKE_DTYPE}"
            if smoke:
                item.add_marker(pytest.mark.smoke)
            elif item is not every_commit:
                item.add_marker(pytest.mark.slow)
    both = [item.nodeid for item in items if item.get_closest_marker("smoke") and item.get_closest_marker("slow")]
    if both:
        raise pytest.UsageError(f"marked both smoke and slow (smoke is part of every commit's tier): {both}")


@pytest.fixture
def scratch_ops():
    """Ops defined in a test (tritoncheck.op) are registered for it alone."""
    registry.load()
    ops, definitions = dict(registry.OPS), dict(define_op.DEFINITIONS)
    yield
    registry.OPS.clear()
    registry.OPS.update(ops)
    define_op.DEFINITIONS.clear()
    define_op.DEFINITIONS.update(definitions)
