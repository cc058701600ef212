"""The fused bias + GELU epilogue, defined for tritoncheck through its public API only.

``x [M, N] + bias [N]`` (the bias optional: drawn absent or present) then GELU, erf or tanh by ``approximate`` (a scalar drawn from its
two choices). The reference is PyTorch's own ``gelu``, run on float64 tensors; the allowance
is derived from it (each rounding of the reference as PyTorch eager evaluates it in the
input dtype, propagated through GELU's derivative, plus the output's rounding). Rows are
independent, so the large-index check grows M.
"""
import torch

import tritoncheck as tc


@tc.op(
    inputs={"x": tc.Tensor("M", "N"), "bias": tc.Tensor("N", optional=True), "approximate": tc.Scalar(choices=("none", "tanh"))},
    independent=("M",),
    large=("M",),
    kernel="bias_gelu.kernels:bias_gelu",
    controls=("bias_gelu.controls:bias_gelu_torch",),
)
def bias_gelu(x, bias, approximate="none"):
    """y = gelu(x + bias), bias broadcast over the rows, or gelu(x) without one; erf GELU, or its tanh
    approximation."""
    return torch.nn.functional.gelu(x if bias is None else x + bias, approximate=approximate)
