"""A user's own package named ``kernels`` (like the suite's): one correct softmax, one wrong.

``.ci/run`` checks both from a temporary directory with tritoncheck installed
(``scripts/installed_demo.sh``): the first must pass, the second fail with the failing
case as found (the quick profile does not shrink) and a replay command that works from
that directory.
"""
import torch


def softmax(x, temperature=1.0):
    """Softmax over the last dim, computed in float32 and rounded once to x's dtype."""
    return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)


def softmax_off_by_a_tenth(x, temperature=1.0):
    """Every output 0.1 too large: rows no longer sum to one."""
    return (torch.softmax(x.float() / temperature, dim=-1) + 0.1).to(x.dtype)


softmax.uses_triton = softmax_off_by_a_tenth.uses_triton = False  # plain PyTorch: no interpreter limits
