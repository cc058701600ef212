"""The matmul op, defined for tritoncheck through its public API only.

``a [M, K] @ b [K, N]``: M, K and N are independent sizes (the same name in two tensors
is one size); every row of ``c`` depends on that row of ``a`` alone (``independent``),
so the large-index check grows M until ``a`` passes 2**31 elements; gradients flow to
both inputs. The reference receives float64 tensors; the allowance is derived from it
(``tritoncheck.rules.derived()``: the absolute-value product ``|a| |b|`` times the products'
and the fp32 sums' rounding, plus the output's rounding).
"""
import tritoncheck as tc


@tc.op(
    inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")},
    grads=("a", "b"),
    independent=("M",),
    large=("M",),
    kernel="matmul.kernels:matmul",
    controls=("matmul.controls:matmul_fp32_accumulate",),
)
def matmul(a, b):
    """c = a @ b, products exact, sums in fp32, rounded once to the inputs' dtype."""
    return a @ b
