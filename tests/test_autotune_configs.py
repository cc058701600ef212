"""tritoncheck/autotune_configs.py: one autotune config at a time, and the kernel restored."""
import sys

import pytest
import torch
import triton
import triton.language as tl

from tritoncheck import autotune_configs

CONFIGS = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 64})]


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def _write_block(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full((BLOCK,), BLOCK, tl.int32), mask=offs < n)


def write_block(n: int = 8) -> int:
    out = torch.zeros(n, dtype=torch.int32)
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
    out = torch.zeros(n, dtype=torch.int32)
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
