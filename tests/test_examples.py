"""The example ops of examples/ (matmul with split-K, bias + GELU, fp8 quantise/dequantise),
brought as a user brings an op the suite does not have: an op definition through
``tritoncheck.op``, a Triton kernel, planted bugs and a plain-PyTorch control per folder.

On the CPU: every control passes every check in every dtype, every planted bug is killed
by the check its ``kills`` names (the self-test's hunts, tritoncheck/selfcheck.py: killed
means the check's own assertion failed, not a crash), every kernel passes every check, and
the large-index check's machinery runs on each example at a few thousand elements. On a
GPU also the large-index check itself (past 2**31 elements) and its int32-offset mutant.

The examples' ops are registered only while a test of this file runs: the registry's own
tests (every check claimed by a mutant of tritoncheck.mutants, ...) are about the suite's ops.

    python -m pytest tests/test_examples.py -n 2 -p no:randomly
"""
import importlib
import inspect
import sys
from pathlib import Path

import pytest
import torch

from tritoncheck import backend, large_problem, registry, selfcheck
from tritoncheck.config import CONFIG
from tritoncheck.define.op import DEFINITIONS
from tritoncheck.mutation import Mutant

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PACKAGES = ("matmul", "bias_gelu", "fp8_quant")
KERNEL_EXAMPLES = 3  # per check and dtype: a pass on the CPU in minutes; the GPU run takes the quick profile
LARGE_INDEX = "large_index"  # not a registry check: tests/test_large_index.py's, past 2**31 elements


def _implementations(ops, kind: str) -> list[registry.Implementation]:
    """Each example op's controls (kind "control"), or its kernels: the op's default one
    and the other public functions of its kernel module made for it (matmul_split_k)."""
    out = []
    for op, spec in sorted(ops.items()):
        if kind == "control":
            targets = spec.controls
        else:
            module = spec.kernel.partition(":")[0]
            names = [n for n in importlib.import_module(module).__all__ if n == op or n.startswith(f"{op}_")]
            targets = [f"{module}:{n}" for n in names]
        out += [registry.Implementation.of(op, registry.resolve(t), name=t.rpartition(":")[2], kind=kind, target=t)
                for t in targets]
    return out


def _load():
    """The examples' ops, definitions, mutants and implementations, registered for the
    collection only."""
    registry.load()
    if str(EXAMPLES) not in sys.path:
        sys.path.append(str(EXAMPLES))
    before = set(registry.OPS)
    modules = [importlib.import_module(f"{package}.mutants") for package in PACKAGES]
    ops = {n: s for n, s in registry.OPS.items() if s.origin.partition(".")[0] in PACKAGES}
    definitions = {n: DEFINITIONS[n] for n in ops}
    mutants = sorted((v for m in modules for v in vars(m).values() if isinstance(v, Mutant)),
                     key=lambda m: (m.op, m.name))
    implementations = {kind: _implementations(ops, kind) for kind in ("control", "kernel")}
    for name in set(ops) - before:  # an --op-module run registered them already: leave those
        del registry.OPS[name], DEFINITIONS[name]
    return ops, definitions, mutants, implementations


OPS, DEFINED, MUTANTS, IMPLEMENTATIONS = _load()


@pytest.fixture(autouse=True)
def _example_ops(monkeypatch):
    for name, spec in OPS.items():
        monkeypatch.setitem(registry.OPS, name, spec)
        monkeypatch.setitem(DEFINITIONS, name, DEFINED[name])


def _params(kind: str):
    """Every (implementation, dtype, check); on every commit each check in one dtype (check i
    in the op's i-th dtype, in turn, as tests/conftest.py tiers the suite's own checks), its
    other dtypes in the slow tier."""
    params = []
    for impl in IMPLEMENTATIONS[kind]:
        dtypes = OPS[impl.op].dtypes
        for i, check in enumerate(OPS[impl.op].checks):
            for j, dtype in enumerate(dtypes):
                params.append(pytest.param(impl, dtype, check, id=f"{impl.op}.{impl.name}-{str(dtype)[6:]}-{check.name}",
                                           marks=[] if j == i % len(dtypes) else [pytest.mark.slow]))
    return params


@pytest.fixture
def short_lengths_on_the_interpreter(monkeypatch):
    """No length past 4096 under the interpreter (no long draw, no "past 4096" or "past
    65536" length class): a program costs about 20 ms there, and bias_gelu's x [65537, 1]
    alone (2049 programs) took 41 s; quantize_fp8's control 30 s on x [65537, 1], nearly
    all of it the derived rule's tracked evaluation of the padded [65537, 1, 128] blocks
    (evaluated although both outputs are exact). The GPU run (scripts/gpu_examples.sh)
    draws them all."""
    if backend.current() == "interpret":
        monkeypatch.setattr(CONFIG, "long_percent", lambda small=5: 0)


@pytest.mark.usefixtures("short_lengths_on_the_interpreter")
@pytest.mark.parametrize("control, dtype, check", _params("control"))
def test_control_passes(control, dtype, check):
    op = OPS[control.op]
    reason = selfcheck.runnable(op, control, check, dtype)
    if reason:
        pytest.skip(reason)
    verdict = selfcheck.hunt(op, control, check, dtype, selfcheck.CONTROL_EXAMPLES)
    assert not verdict.failed, f"control {control.target} fails {check.name}: {verdict.text}"


@pytest.mark.usefixtures("short_lengths_on_the_interpreter")
@pytest.mark.parametrize("kernel, dtype, check", _params("kernel"))
def test_kernel_passes(kernel, dtype, check):
    """As a control's hunt, at KERNEL_EXAMPLES examples."""
    op = OPS[kernel.op]
    reason = selfcheck.runnable(op, kernel, check, dtype)
    if reason:
        pytest.skip(reason)
    verdict = selfcheck.hunt(op, kernel, check, dtype, KERNEL_EXAMPLES)
    assert not verdict.failed, f"kernel {kernel.target} fails {check.name}: {verdict.text}"


@pytest.mark.tritoncheck_mutant
@pytest.mark.parametrize("mutant, check", [pytest.param(m, c, id=f"{m.op}.{m.name}-{c}")
                                           for m in MUTANTS for c in m.kills if c != LARGE_INDEX])
def test_mutant_killed(mutant, check):
    absent = mutant.absent_on(backend.current()) or selfcheck.not_runnable_here(mutant, check)
    if absent:
        pytest.skip(absent)
    verdict = selfcheck.kill(mutant, check)
    assert verdict.killed, f"mutant {mutant.op}.{mutant.name} ({mutant.bug}) {verdict.describe()}: {verdict.text}"
    print(f"\n{mutant.op}.{mutant.name} killed by {check} in {verdict.dtype}:\n{verdict.text[:1500]}")


def test_an_all_zero_block_is_caught_by_matches_reference():
    """zero_block_nan's first kill in the hunt is a block of subnormals (the same missing
    floor: a subnormal scale); its headline, an all-zero block quantised to 0 / 0 = NaN,
    needs a whole block of zeros, which no value family draws: here is one, a row of x."""
    from tritoncheck.strategies import Case, TensorSpec
    zero_row = tuple((i, 0.0) for i in range(5))
    case = Case("quantize_fp8", "float32", ("x",),
                {"x": TensorSpec((3, 5), "float32", family="normal", seed=7, injections=zero_row)})
    check = next(c for c in OPS["quantize_fp8"].checks if c.name == "matches_reference")
    kernel = next(i for i in IMPLEMENTATIONS["kernel"] if i.op == "quantize_fp8")
    check.run(case, kernel)
    planted = next(m for m in MUTANTS if m.name == "zero_block_nan")
    with pytest.raises(AssertionError, match="does not match the fp64 reference") as failure:
        check.run(case, selfcheck.as_implementation(planted))
    assert selfcheck.raised_by_check(failure.value), "the failure is not the check's own assertion"


def test_every_example_has_a_kernel_a_control_and_a_mutant_per_check():
    """What each folder promises: a default kernel and a control per op, and every check a
    mutant claims is one of the op's (or the large-index check)."""
    assert sorted(OPS) == ["bias_gelu", "dequantize_fp8", "matmul", "quantize_fp8"]
    for name, spec in OPS.items():
        assert spec.kernel and spec.controls, f"{name}: no kernel or no control"
        assert any(m.op == name for m in MUTANTS), f"{name}: no planted bug"
    for m in MUTANTS:
        unknown = set(m.kills) - {c.name for c in OPS[m.op].checks} - {LARGE_INDEX}
        assert not unknown, f"{m.op}.{m.name} claims checks {unknown} the op does not have"


# ----------------------------------------------------------------------------- large index

LARGE_MUTANTS = [m for m in MUTANTS if LARGE_INDEX in m.kills]
CUDA_ONLY = pytest.mark.skipif(backend.current() != "cuda",
                               reason="past 2**31 elements: on CUDA only (the interpreter would take hours)")


def _large_targets():
    return [pytest.param(impl, id=f"{impl.op}.{impl.name}") for impl in IMPLEMENTATIONS["kernel"]]


def _large_dtype(op: str) -> torch.dtype:
    """The dtype the large-index check takes for ``op`` (tests/test_large_index.py's preference)."""
    return next(d for d in (torch.bfloat16, torch.float16, torch.float32) if d in OPS[op].dtypes)


def _small_problems(monkeypatch) -> None:
    """The large problems at a few thousand elements: the machinery, not the offsets."""
    monkeypatch.setattr(large_problem, "PAST_INT32", 3000)


@pytest.mark.parametrize("kernel", _large_targets())
def test_the_large_index_check_runs_each_example_at_a_small_size(kernel, monkeypatch):
    """The large-index check of each example (tritoncheck/large_index.py), its problem built at
    3000 elements: slices cut, compared with the fp64 reference and the op's allowance."""
    from tritoncheck.large_index import check
    _small_problems(monkeypatch)
    assert check(kernel.op, kernel, _large_dtype(kernel.op), backend.device()) >= 1


@pytest.mark.parametrize("mutant", [pytest.param(m, id=f"{m.op}.{m.name}") for m in LARGE_MUTANTS])
def test_an_int32_offset_mutant_differs_from_its_kernel_only_past_int32(mutant, monkeypatch):
    """On every backend: the mutant is its kernel with one line changed, an int64 cast gone,
    and at a small size it passes the large-index check, as it must: the wrapped offset
    needs an input past 2**31 elements (test_an_int32_offset_is_caught, on a GPU)."""
    from tritoncheck.large_index import check
    kernel = inspect.getsource(importlib.import_module(OPS[mutant.op].kernel.partition(":")[0])).splitlines()
    patched = inspect.getsource(sys.modules[mutant.fn.__module__]).splitlines()
    removed, added = set(kernel) - set(patched), set(patched) - set(kernel)
    assert len(removed) == len(added) == 1, (removed, added)
    assert "tl.int64" in removed.pop() and "tl.int64" not in added.pop()
    _small_problems(monkeypatch)
    assert check(mutant.op, selfcheck.as_implementation(mutant), torch.float16, backend.device()) >= 1


@CUDA_ONLY
@pytest.mark.large
@pytest.mark.parametrize("kernel", _large_targets())
def test_past_int32_offsets_match_the_reference(kernel):
    from test_large_index import _one_at_a_time, _why_not

    from tritoncheck.large_index import check
    dtype = _large_dtype(kernel.op)
    with _one_at_a_time():
        reason = _why_not(kernel.op, dtype)
        if reason:
            pytest.skip(reason)
        assert check(kernel.op, kernel, dtype, backend.device()) >= 5


@CUDA_ONLY
@pytest.mark.large
@pytest.mark.parametrize("mutant", [pytest.param(m, id=f"{m.op}.{m.name}") for m in LARGE_MUTANTS])
def test_an_int32_offset_is_caught(mutant):
    """In a spawned child: wild reads may break the CUDA context (a crash is a failed verdict too)."""
    from test_large_index import _one_at_a_time, _why_not

    from tritoncheck.large_index import verdict_of
    reason = _why_not(mutant.op, torch.bfloat16)
    if reason:
        pytest.skip(reason)
    with _one_at_a_time():
        verdict = selfcheck.isolated(verdict_of, mutant.target, mutant.op, "bfloat16")
    assert verdict.failed, f"the int32-offset mutant {mutant.name} passed the large-index check"
    print(verdict.text[:2000])
