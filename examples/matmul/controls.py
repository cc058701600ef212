"""A correct matmul in plain PyTorch, as a user would write one: the suite must pass it.

The product is taken in float32 and rounded once to the inputs' dtype: the op's contract
(fp32 sums) on every machine, whatever path PyTorch's CPU half-precision matmul takes there
(it depends on the CPU and its oneDNN build: docs/third-party/torch.md, finding 4). On the
development machine plain ``a @ b`` passed too (30 examples each of matches_reference and
gradients_match_reference in float16, bfloat16 and float32).
"""


def matmul_fp32_accumulate(a, b):
    """c = a @ b in float32, rounded once to the inputs' dtype."""
    return (a.float() @ b.float()).to(a.dtype)


matmul_fp32_accumulate.uses_triton = False
