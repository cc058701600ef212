"""The fp8 pair in plain PyTorch, as a user would write it, block by block: the suite must
pass both. Computed in fp32 as the contract says (torch's fp32 division is correctly
rounded, and its cast to float8_e4m3fn rounds to nearest even)."""
import torch

QBLOCK = 128
SCALE_FLOOR = torch.finfo(torch.float32).tiny


def quantize_fp8_torch(x):
    """Per-block e4m3 quantisation of x's rows (ops.quantize_fp8's contract)."""
    qs, scales = [], []
    for block in x.float().split(QBLOCK, dim=1):
        amax = block.abs().amax(dim=1, keepdim=True)
        # divided by a tensor: PyTorch's CUDA division by a Python number multiplies by its reciprocal
        scale = (amax / torch.full_like(amax, 448.0)).clamp(min=SCALE_FLOOR)
        qs.append((block / scale).to(torch.float8_e4m3fn))
        scales.append(scale)
    return torch.cat(qs, dim=1), torch.cat(scales, dim=1)


def dequantize_fp8_torch(q, scale):
    """q times its block's scale, in fp32."""
    return torch.cat([block.float() * scale[:, i:i + 1] for i, block in enumerate(q.split(QBLOCK, dim=1))], dim=1)


quantize_fp8_torch.uses_triton = dequantize_fp8_torch.uses_triton = False
quantize_fp8_torch.dtypes = (torch.float32, torch.float16, torch.bfloat16)
dequantize_fp8_torch.dtypes = (torch.float32,)
