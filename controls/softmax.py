"""Correct plain-PyTorch softmax, written the way users write it."""
import torch


def torch_softmax(x, temperature=1.0):
    """torch.softmax(x / T) in the input dtype (x / T rounds in that dtype)."""
    return torch.softmax(x / temperature, dim=-1)


def torch_softmax_fp32(x, temperature=1.0):
    """Upcast, softmax in fp32, cast back: what mixed-precision code does."""
    return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)


class _SoftmaxProductsInInputDtype(torch.autograd.Function):
    """torch.softmax forward; the backward as PyTorch's CUDA kernel computes it, written out.

    aten's softmax_backward_cuda forms ``g = grad * output`` as a tensor in the input
    dtype (each product rounded there, into fp16's subnormals for small gradients), then
    its kernel sums g in fp32 and stores ``g - output * sum`` (one more rounding). The CPU
    kernel computes all of it in fp32, so on CPU this control is what ``torch_softmax``
    is on a GPU: the float16 gradient of issue 36 (x [2045], dy scale 0.001) is this one.
    """

    @staticmethod
    def forward(ctx, z):
        y = torch.softmax(z, dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        g = dy * y  # in the input dtype
        total = g.float().sum(dim=-1, keepdim=True)
        return (g.float() - y.float() * total).to(y.dtype)


def torch_softmax_cuda_backward(x, temperature=1.0):
    """torch.softmax(x / T) whose backward rounds as PyTorch's CUDA backward does (above)."""
    return _SoftmaxProductsInInputDtype.apply(x / temperature)
