"""Implementations that raise the same error on every input, as a new user's often do.

tests/test_quick_profile.py runs the suite on them with ``--impl``: each must end in one
verdict at once (tritoncheck/unrunnable.py), never a shrunk failure per test.

- :func:`softmax_missing_dependency`: a correct softmax behind an import of an optional
  dependency that is not installed (issue 25: 13 tests at about 30 s each).
- :func:`softmax_interpreter_unrunnable`: a correct Triton softmax that converts its
  float argument with ``.to``, which compiles on a GPU (the argument is an fp32 scalar
  there) and which the Triton interpreter cannot run (a Python float has no ``.to``):
  ``InterpreterError: AttributeError("'float' object has no attribute 'to'")``, what
  Liger-Kernel 0.8.5's layer norm and SwiGLU raise on CPU.
- :func:`softmax_backward_missing_dependency`: a correct forward whose backward imports
  the missing module: the forward checks pass, only the gradient checks end on the error.
"""
import importlib

import torch
import triton
import triton.language as tl

MISSING = "tritoncheck_absent_optional_dependency"


def softmax_missing_dependency(x, temperature=1.0):
    importlib.import_module(MISSING)  # as `from fast_ops import fused_softmax` inside the function
    return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)


@triton.jit
def _softmax_rows(x_ptr, y_ptr, n_cols, temperature, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=float("-inf")).to(tl.float32)
    z = x / temperature.to(tl.float32)  # fine compiled; under the interpreter a float has no .to
    e = tl.exp(z - tl.max(z, axis=0))
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


def softmax_interpreter_unrunnable(x, temperature=1.0):
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty_like(rows)
    if rows.numel():
        _softmax_rows[(rows.shape[0],)](rows, out, rows.shape[1], float(temperature),
                                        BLOCK=triton.next_power_of_2(rows.shape[1]))
    return out.reshape(x.shape)


softmax_interpreter_unrunnable.supports_backward = False


class _SoftmaxBackwardNeedsMissing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, temperature):
        return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        importlib.import_module(MISSING)  # the fused backward lives in the optional dependency
        raise AssertionError("unreachable: the import above fails")


def softmax_backward_missing_dependency(x, temperature=1.0):
    return _SoftmaxBackwardNeedsMissing.apply(x, temperature)
