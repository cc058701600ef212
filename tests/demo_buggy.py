"""A softmax with a typo on its long-row path (issue 24): rows longer than 64 go through
``torch.softmax(..., dtpye=...)``, a ``TypeError`` on every such row. Under the old
policy any ``TypeError`` out of an implementation was a refusal, discarded for
``--impl`` users, and this kernel passed every check in float32 with 50-76 % of each
test's examples lost. tests/test_refusals.py runs the suite on it.
"""
import torch

from tritoncheck.kernels.softmax import softmax as _softmax

SHORT_ROWS = 64


def softmax(x, temperature=1.0):
    if x.shape[-1] <= SHORT_ROWS:
        return _softmax(x, temperature)
    return torch.softmax(x.float() / temperature, dim=-1, dtpye=x.dtype)  # the typo: dtpye
