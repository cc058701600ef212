"""properties/autotune_configs.py: one autotune config at a time, and the kernel restored."""
import pytest
import torch
import triton
import triton.language as tl

from properties import autotune_configs

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
