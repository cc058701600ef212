"""Kernels that break their process's CUDA context, for tests/test_worker_crashes.py: a correct
softmax whose backward also makes a wild access. The forward checks must pass; each check that
runs the backward must fail naming the CUDA error with its case, and cost no other check its
verdict (issue 36: one misaligned address in PyTorch's SDPA once ended 55-61 other tests).

- :func:`softmax_breaking_backward_simulated`: on any backend, the CPU's stand-in: the backward
  marks this process's context broken (``worker_crashes.simulate_broken_context``) and raises
  CUDA's error, and every later call in the process raises it again, as CUDA does.
- :func:`softmax_misaligned_backward`: on a GPU, the real thing: the backward launches a Triton
  kernel that stores a float32 one byte past a 4-byte boundary ("CUDA error: misaligned
  address"; the sticky error of a broken context).
"""
import torch
import triton
import triton.language as tl

from tritoncheck import worker_crashes

CUDA_ERROR = "CUDA error: misaligned address"


def _softmax(x, temperature):
    return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)


def _grad(y, dy, temperature):
    y32, dy32 = y.float(), dy.float()
    return ((y32 * (dy32 - (dy32 * y32).sum(-1, keepdim=True))) / temperature).to(y.dtype)


def _raise_if_broken():
    if worker_crashes.broken_context("interpret") is not None:  # every call of a broken context fails
        raise RuntimeError(f"{CUDA_ERROR}\nCUDA kernel errors might be asynchronously reported at some other API call")


class _SimulatedBreak(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, temperature):
        _raise_if_broken()
        y = _softmax(x, temperature)
        ctx.save_for_backward(y)
        ctx.temperature = temperature
        return y

    @staticmethod
    def backward(ctx, dy):
        worker_crashes.simulate_broken_context(CUDA_ERROR)
        _raise_if_broken()


def softmax_breaking_backward_simulated(x, temperature=1.0):
    return _SimulatedBreak.apply(x, temperature)


@triton.jit
def _store_misaligned(BYTES):
    # BYTES: a uint8 buffer; its second byte seen as a float32 pointer, off the 4-byte alignment
    tl.store((BYTES + 1).to(tl.pointer_type(tl.float32)), 1.0)


class _MisalignedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, temperature):
        y = _softmax(x, temperature)
        ctx.save_for_backward(y)
        ctx.temperature = temperature
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        scratch = torch.zeros(16, dtype=torch.uint8, device=dy.device)
        _store_misaligned[(1,)](scratch)
        return _grad(y, dy, ctx.temperature), None


def softmax_misaligned_backward(x, temperature=1.0):
    return _MisalignedBackward.apply(x, temperature)
