"""Softmax implementations that are wrong only at the sizes a kernel (or a cheat) keys on
(issues 24 and 27): right on every row the random draws usually bring, wrong past 4096
columns or at N = 2^k + 1. tests/test_length_classes.py runs the suite on them: the
length classes every row-wide test tries on purpose must catch both with few examples.
"""
from tritoncheck.controls.softmax import torch_softmax_fp32


def softmax(x, temperature=1.0):
    """Correct: the plain-PyTorch control, for the same run."""
    return torch_softmax_fp32(x, temperature)


def softmax_wrong_past_4096(x, temperature=1.0):
    """A 4096-wide tile that never loops: columns past the first tile get 0."""
    y = torch_softmax_fp32(x, temperature)
    if x.shape[-1] > 4096:
        y[..., 4096:] = 0
    return y


def softmax_wrong_one_past_a_power_of_two(x, temperature=1.0):
    """The masked tail of a power-of-two tile is dropped when it holds a single column."""
    y = torch_softmax_fp32(x, temperature)
    n = x.shape[-1]
    if n > 2 and (n - 1) & (n - 2) == 0:
        y[..., -1] = 0
    return y
