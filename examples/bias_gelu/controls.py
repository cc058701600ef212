"""A correct bias + GELU in plain PyTorch, as a user would write it, in the input dtype: the
suite must pass it."""
import torch


def bias_gelu_torch(x, bias, approximate="none"):
    return torch.nn.functional.gelu(x if bias is None else x + bias, approximate=approximate)


bias_gelu_torch.uses_triton = False
