"""Correct plain-PyTorch softmax, written the way users write it."""
import torch


def torch_softmax(x, temperature=1.0):
    """torch.softmax(x / T) in the input dtype (x / T rounds in that dtype)."""
    return torch.softmax(x / temperature, dim=-1)


def torch_softmax_fp32(x, temperature=1.0):
    """Upcast, softmax in fp32, cast back: what mixed-precision code does."""
    return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)
