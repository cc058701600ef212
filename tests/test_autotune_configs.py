"""tritoncheck/autotune_configs.py: one autotune config at a time, and the kernel restored."""
import sys

import pytest
import torch
import triton
import triton.language as tl

from tritoncheck import autotune_configs, backend

DEVICE = backend.device()  # the kernels below launch on the GPU when there is one, as the suite's do

CONFIGS = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 64})]


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def _write_block(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full((BLOCK,), BLOCK, tl.int32), mask=offs < n)


def write_block(n: int = 8) -> int:
    out = torch.zeros(n, dtype=torch.int32, device=DEVICE)
    _write_block[(1,)](out, n)
    return int(out[0])


write_block.autotuned = (_write_block,)


def test_each_config_runs_alone_and_the_kernel_is_restored():
    kernels = autotune_configs.autotuned_kernels(write_block)
    seen = []
    for config in CONFIGS:
        with autotune_configs.pinned(kernels[0], config):
            seen.append(write_block())
    assert seen == [16, 64]
    assert _write_block.configs == CONFIGS


def test_declarations_are_validated():
    def fn():
        pass
    fn.autotuned = (_write_block.fn,)  # the jit function, not the autotuner
    with pytest.raises(TypeError, match="autotune'd kernels"):
        autotune_configs.autotuned_kernels(fn)
    with pytest.raises(ValueError, match="not one of"):
        with autotune_configs.pinned(_write_block, triton.Config({"BLOCK": 32})):
            pass


def test_a_library_s_autotuners_are_collected_from_its_modules(monkeypatch):
    import types
    library = types.ModuleType("somelib")
    ops = types.ModuleType("somelib.ops")
    ops.kernel = triton.heuristics({"UNUSED": lambda args: 1})(_write_block)  # heuristics over autotune
    ops.plain = _write_block.fn
    monkeypatch.setitem(sys.modules, "somelib", library)
    monkeypatch.setitem(sys.modules, "somelib.ops", ops)
    assert autotune_configs.autotuners_in("somelib") == (_write_block,)
    with pytest.raises(ValueError, match="no module of 'otherlib' is imported"):
        autotune_configs.autotuners_in("otherlib")
    monkeypatch.setattr(ops, "kernel", None)
    with pytest.raises(ValueError, match="define no triton.autotune'd kernel"):
        autotune_configs.autotuners_in("somelib")


def test_the_run_wide_pin_takes_config_i_modulo_the_count_and_restores():
    assert [_pinned_result(i) for i in (0, 1, 2)] == [16, 64, 16]
    with autotune_configs.pinned_all(write_block, None):
        assert _write_block.configs == CONFIGS  # None: the kernel autotunes as it does
    assert _write_block.configs == CONFIGS


def _pinned_result(index: int) -> int:
    with autotune_configs.pinned_all(write_block, index):
        assert len(_write_block.configs) == 1
        return write_block()


def test_a_heuristics_wrapper_is_looked_through():
    def fn():
        pass
    fn.autotuned = (triton.heuristics({"UNUSED": lambda args: 1})(_write_block),)
    assert autotune_configs.autotuned_kernels(fn) == (_write_block,)


def _no_shared_memory(nargs):
    """A config this device cannot run, as Triton reports it at launch (issue 36: head dim 128)."""
    from triton.runtime.errors import OutOfResources
    raise OutOfResources(294912, 232448, "shared memory")


TOO_BIG = [triton.Config({"BLOCK": 16}, pre_hook=_no_shared_memory), triton.Config({"BLOCK": 64})]


@triton.autotune(configs=TOO_BIG, key=["n"])
@triton.jit
def _write_block_too_big(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full((BLOCK,), BLOCK, tl.int32), mask=offs < n)


def write_block_too_big(n: int = 8) -> int:
    out = torch.zeros(n, dtype=torch.int32, device=DEVICE)
    _write_block_too_big[(1,)](out, n)
    return int(out[0])


write_block_too_big.autotuned = (_write_block_too_big,)


def test_a_config_the_device_cannot_run_is_skipped_for_the_next_one():
    # pinned to config 0 (the quick profile's --autotune-config 0), which the device
    # refuses: Triton's autotuner would discard it, so the pin runs config 1 instead
    with autotune_configs.pinned_all(write_block_too_big, 0):
        assert write_block_too_big() == 64
    assert "out of resource: shared memory" in autotune_configs.refused_configs()[
        f"_write_block_too_big {TOO_BIG[0]}"]
    assert _write_block_too_big.configs == TOO_BIG and "run" not in vars(_write_block_too_big)


def test_a_kernel_none_of_whose_configs_runs_fails_with_every_reason(monkeypatch):
    from triton.runtime.errors import OutOfResources
    monkeypatch.setattr(TOO_BIG[1], "pre_hook", _no_shared_memory)
    with pytest.raises(OutOfResources) as raised:
        with autotune_configs.pinned_all(write_block_too_big, 1):
            write_block_too_big()
    assert "none of the 2 autotune configs of _write_block_too_big can run" in "\n".join(raised.value.__notes__)
    assert _write_block_too_big.configs == TOO_BIG


ACCUMULATING = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 64})]


@triton.autotune(configs=ACCUMULATING, key=["n"])
@triton.jit
def _add_block(out_ptr, n, BLOCK: tl.constexpr):
    # adds into its output (which the caller zero-fills): right once, wrong after the
    # autotuner's timing runs on the same buffer without reset_to_zero (triton#3004)
    offs = tl.arange(0, 64)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=mask) + BLOCK, mask=mask)


def add_block(n: int = 8) -> int:
    out = torch.zeros(n, dtype=torch.int32, device=DEVICE)
    _add_block[(1,)](out, n)
    return int(out[0])


add_block.autotuned = (_add_block,)


def test_autotuning_times_every_config_on_the_same_buffers_then_runs_the_fastest():
    # Under the interpreter nothing can be timed; the emulated clock makes config 1 the
    # fastest. Each config runs twice as a timing loop would (2 * 16 + 2 * 64), then the
    # choice once more: what the autotuner leaves, unlike either config alone.
    with autotune_configs.autotuning(add_block, 1) as chosen:
        assert add_block() == 2 * 16 + 3 * 64
    assert chosen[id(_add_block)] is ACCUMULATING[1]
    with autotune_configs.pinned_to(add_block, chosen):
        assert add_block() == 64
    assert _add_block.configs == ACCUMULATING and not {"run", "_bench", "do_bench"} & set(vars(_add_block))


def test_autotuning_inside_a_pin_sees_every_config_and_gives_the_pin_back():
    with autotune_configs.pinned_all(add_block, 0):
        assert autotune_configs.config_count(add_block) == 2
        with autotune_configs.autotuning(add_block, 0) as chosen:
            add_block()
        assert chosen[id(_add_block)].kwargs == ACCUMULATING[0].kwargs, chosen[id(_add_block)]
        assert _add_block.configs == [ACCUMULATING[0]] and add_block() == 16
    assert _add_block.configs == ACCUMULATING


def test_autotuning_does_not_answer_from_triton_s_disk_cache(monkeypatch):
    # on a GPU with TRITON_CACHE_AUTOTUNING (or cache_results=True), Triton answers a known key
    # from an earlier run's timings on disk and never calls the emulated clock
    def stale(self, tuning_key, configs, bench_fn):
        self.cache[tuning_key] = configs[1]
        return True
    monkeypatch.setattr(type(_add_block), "check_disk_cache", stale)
    monkeypatch.setattr(_add_block, "cache_results", True)
    with autotune_configs.autotuning(add_block, 0) as chosen:
        add_block()
    assert chosen[id(_add_block)].kwargs == ACCUMULATING[0].kwargs
    assert _add_block.cache_results is True


def test_the_agreement_check_fails_an_autotuned_kernel_that_needs_reset_to_zero():
    from tritoncheck import generic, registry
    from tritoncheck.mutants.elementwise import autotune_without_reset_to_zero as mutant
    from tritoncheck.strategies import Case, TensorSpec
    impl = registry.Implementation.of("swiglu", mutant.fn, name=mutant.name, kind="mutant")
    spec = {"gate": TensorSpec((4, 100), "float32", seed=1), "up": TensorSpec((4, 100), "float32", seed=0)}
    case = Case("swiglu", "float32", ("gate", "up"), spec)  # seeds summing to 1: config 1 (BLOCK=128) fastest
    with pytest.raises(AssertionError, match="left to autotune .*BLOCK=128.* differs from that choice run alone"):
        generic.autotune_configs_agree(case, impl)


def test_a_replay_pins_the_config_the_failure_ran():
    from tritoncheck.replay import _autotune_config

    def plain():
        pass
    assert _autotune_config(None, {"autotune_config": 1}, write_block) == 1  # recorded by the failing run
    assert _autotune_config("0", {"autotune_config": 1}, write_block) == 0  # asked overrides it
    assert _autotune_config("tuned", {"autotune_config": 1}, write_block) is None
    # nothing recorded: the interpreter cannot time configs, so the first is pinned there
    assert _autotune_config(None, {}, write_block) == (0 if backend.current() == "interpret" else None)
    assert _autotune_config(None, {}, plain) is None  # no autotuned kernel declared: nothing to pin
    with pytest.raises(ValueError, match="config index"):
        _autotune_config("fastest", {}, write_block)
