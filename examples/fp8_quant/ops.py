"""The fp8 (e4m3fn) per-block quantise/dequantise pair, defined for tritoncheck through its
public API only.

Both outputs of ``quantize_fp8`` and the output of ``dequantize_fp8`` are exact: compared
bit for bit with the reference rounded to their dtype (``q`` is 1-byte, ``Output`` makes
that the default; the fp32 scale and the fp32 dequantised values are declared exact: the
reference computes them in fp32 with one correctly rounded operation each, and so must
the kernel). Rows are independent, so the large-index check grows M. K is drawn at the edges of the
contract's block of 128 columns too (127, 128, 129, 257: ``Dim(blocks=...)``), where a
partial last block begins, and up to 4 blocks (32 on a GPU) every day: a dim's everyday
range is otherwise 1-64 under the interpreter, which never reaches a second block.

``dequantize_fp8``'s ``scale`` is declared ``[M, K]``, wider than the ``[M, cdiv(K, 128)]``
it needs: a shape entry cannot say ``cdiv(K, 128)`` (``"K//128"`` rounds down, and the
last, partial block is the interesting one), so the cases draw a scale with K columns,
of which the reference and the kernel read the first ``cdiv(K, 128)``.
"""
import torch

import tritoncheck as tc

QBLOCK = 128
E4M3_MAX = 448.0
SCALE_FLOOR = 2.0**-126  # fp32's smallest normal: an all-zero block's scale, and the least of any
F32_MAX = float(torch.finfo(torch.float32).max)


def _blocks(t, k: int):
    """t [M, K] as [M, cdiv(K, 128), 128], the last block padded with zeros."""
    nb = -(-k // QBLOCK)
    return torch.nn.functional.pad(t, (0, nb * QBLOCK - k)).reshape(t.shape[0], nb, QBLOCK)


@tc.op(
    inputs={"x": tc.Tensor("M", "K")},
    outputs={"q": tc.Output(dtype=torch.float8_e4m3fn), "scale": tc.Output(dtype=torch.float32, exact=True)},
    dims={"K": tc.Dim(max=(4 * QBLOCK, 32 * QBLOCK), blocks=(QBLOCK,))},
    independent=("M",),
    large=("M",),
    kernel="fp8_quant.kernels:quantize_fp8",
    controls=("fp8_quant.controls:quantize_fp8_torch",),
)
def quantize_fp8(x):
    """Per-block e4m3 quantisation: in fp32, scale = max(amax / 448, 2**-126) per 128 columns, q = RNE(x / scale)."""
    m, k = x.shape
    blocks = _blocks(x.float(), k)  # x's values are fp32 values: the cast is exact
    amax = blocks.abs().amax(dim=-1)
    # fp32 division, rounded to nearest: by a tensor, not the Python number 448, which PyTorch's
    # CUDA division turns into a product with its reciprocal (1 ulp off: an H200 run failed the
    # correctly rounded kernel's scale against this reference evaluated on the GPU)
    scale = torch.clamp(amax / torch.full_like(amax, E4M3_MAX), min=SCALE_FLOOR)
    q = (blocks / scale[..., None]).to(torch.float8_e4m3fn)  # fp32 division, then round to nearest even
    return q.reshape(m, -1)[:, :k], scale


@tc.op(
    inputs={"q": tc.Tensor("M", "K", dtype=torch.float8_e4m3fn),
            "scale": tc.Tensor("M", "K", dtype=torch.float32,
                               values=tc.reals(SCALE_FLOOR, max_magnitude=F32_MAX / E4M3_MAX))},
    outputs={"x": tc.Output(dtype=torch.float32, exact=True)},
    dims={"K": tc.Dim(max=(4 * QBLOCK, 32 * QBLOCK), blocks=(QBLOCK,))},
    dtypes=(torch.float32,),
    independent=("M",),
    large=("M",),
    kernel="fp8_quant.kernels:dequantize_fp8",
    controls=("fp8_quant.controls:dequantize_fp8_torch",),
)
def dequantize_fp8(q, scale):
    """x = q * scale[:, k // 128] in fp32 (one rounding); scale's columns past cdiv(K, 128) are not read."""
    m, k = q.shape
    nb = -(-k // QBLOCK)
    per_column = scale[:, :nb].float().repeat_interleave(QBLOCK, dim=1)[:, :k]
    return q.float() * per_column
