"""torchao's Triton fp8 GEMMs behind the tritoncheck contract (docs/third-party/torchao.md).

    PYTHONPATH=examples/torchao python -m pytest tests/test_checks.py --autotune-config 0 \\
        --impl scaled_mm=adapters:blockwise_fp8_gemm --impl scaled_mm=adapters:fp8_gemm_1x128_128x128 \\
        --impl scaled_mm=adapters:fp8_gemm_1x128_128x1

torchao 0.18.0, three Triton kernels:

- ``blockwise_fp8_gemm``: ``torchao.kernel.blockwise_quantization.blockwise_fp8_gemm(a, a_s, b, b_s)``,
  DeepSeek-V3's inference kernel (``BlockwiseQuantLinear``): b as ``[N, K]`` with ``b_s``
  ``[ceil(N/128), ceil(K/128)]`` (the contract's declared layout ``nk``), bfloat16 out, no bias.
- ``fp8_gemm_1x128_128x128``: ``torchao.prototype.blockwise_fp8_training.kernels.triton_fp8_gemm_1x128_128x128``,
  the blockwise fp8 training forward: ``a_s [M, ceil(K/128)]``, ``b_s [ceil(K/128), ceil(N/128)]``, out_dtype.
- ``fp8_gemm_1x128_128x1``: ``triton_fp8_gemm_1x128_128x1``, the training backward's: ``b_s``
  ``[ceil(K/128), N]`` (a scale per column in each K block), out_dtype.

What the adapters do besides passing arguments, each a faithful translation:

- the scales each kernel takes are blocks; a scale of the contract that is coarser (per
  tensor, per row; per tensor or 128 x 128 for the 128 x 1 kernel) is broadcast into the
  kernel's blocks, the same numbers (``expand_into``). A finer one (a per-column b_scale
  for the 128 x 128 kernels) cannot be: refused with a ``ValueError`` the adapter declares;
- the memory layouts the training kernels assert (``a`` row-major, ``b`` and the scales
  column-major, ``b_s`` row-major for 128 x 1) are made by copies; the inference kernel's
  ``assert x.is_contiguous()`` is a declared limit (``contiguous``), in its ``nk`` layout.

Declared: the fp8 formats (the kernels are written for fp8: ``tl.dot`` of e4m3 or e5m2); their
fp8 accumulation, ``{"fraction_bits": 13, "promote_every": 128}`` (``acc += tl.dot(a, b) * ...``
over a BLOCK_K of 128: Triton's sm_90 default accumulates each dot in the tensor core); their
autotuned kernels (``--autotune-config I`` pins one config: 48 and 6 configs, timed anew for
every N and K otherwise). What a signature lacks is held at its default (bias None; the
inference kernel's out_dtype bfloat16).
"""
from __future__ import annotations

import torch
from torchao.kernel import blockwise_quantization as _inference
from torchao.prototype.blockwise_fp8_training import kernels as _training
from triton.runtime.autotuner import Autotuner

__all__ = ["blockwise_fp8_gemm", "fp8_gemm_1x128_128x128", "fp8_gemm_1x128_128x1", "fp8_gemm_1x128_128x128_k_blocks",
           "fp8_gemm_1x128_128x1_k_blocks"]

BLOCK = 128
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
ACCUMULATION = {"fraction_bits": 13, "promote_every": BLOCK}
PER_COLUMN = "torchao's 128 x 128 block GEMM takes no per-column b_scale"


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def expand_into(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A contract scale broadcast to ``[rows, cols]`` entries (a size-1 axis repeated; an axis
    already of that size kept): the same scale for every element, in the kernel's layout."""
    if scale.shape[0] not in (1, rows) or scale.shape[1] not in (1, cols):
        raise ValueError(f"{PER_COLUMN}: a scale of shape {tuple(scale.shape)} is finer than [{rows}, {cols}]")
    return scale.expand(rows, cols).contiguous()


def _column_major(t: torch.Tensor) -> torch.Tensor:
    """A copy with strides (1, rows): torchao asserts ``stride(-2) == 1``, also for an axis of
    size 1, whose stride ``.contiguous()`` leaves as it was (finding 3)."""
    return torch.empty_strided(t.shape, (1, max(t.shape[0], 1)), dtype=t.dtype, device=t.device).copy_(t)


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """A copy with strides (cols, 1) (``stride(-1) == 1`` asserted; likewise for an axis of size 1)."""
    return torch.empty_strided(t.shape, (max(t.shape[1], 1), 1), dtype=t.dtype, device=t.device).copy_(t)


def blockwise_fp8_gemm(a, b, a_scale, b_scale):
    """b [N, K], b_scale [1 or N or ceil(N/128), 1 or ceil(K/128)] (layout ``nk``)."""
    n, k = b.shape
    if b_scale.shape[0] == n and n > 1 and n != _blocks(n):
        raise ValueError(PER_COLUMN)
    return _inference.blockwise_fp8_gemm(a, expand_into(a_scale, a.shape[0], _blocks(k)), b,
                                         expand_into(b_scale, _blocks(n), _blocks(k)), BLOCK)


def fp8_gemm_1x128_128x128(a, b, a_scale, b_scale, out_dtype=torch.bfloat16):
    k, n = b.shape
    if b_scale.shape[1] == n and n > 1 and n != _blocks(n):
        raise ValueError(PER_COLUMN)
    return _training.triton_fp8_gemm_1x128_128x128(
        _row_major(a), _column_major(b), _column_major(expand_into(a_scale, a.shape[0], _blocks(k))),
        _column_major(expand_into(b_scale, _blocks(k), _blocks(n))), BLOCK, out_dtype)


def fp8_gemm_1x128_128x1(a, b, a_scale, b_scale, out_dtype=torch.bfloat16):
    k, n = b.shape
    if b_scale.shape[1] == _blocks(n) and n != _blocks(n):  # a 128 x 128 block scale: one per column of it
        b_scale = b_scale.repeat_interleave(BLOCK, dim=1)[:, :n]
    return _training.triton_fp8_gemm_1x128_128x1(
        _row_major(a), _column_major(b), _column_major(expand_into(a_scale, a.shape[0], _blocks(k))),
        _row_major(expand_into(b_scale, _blocks(k), n)), BLOCK, out_dtype)


# The runs that look past finding 1 (K not a multiple of 128 read past K): the same kernels
# under a declared limit, K a multiple of 128 (what torchao's own quantisers assert).
K_BLOCKS = tuple(range(BLOCK, 8192 + 1, BLOCK))


def fp8_gemm_1x128_128x128_k_blocks(a, b, a_scale, b_scale, out_dtype=torch.bfloat16):
    return fp8_gemm_1x128_128x128(a, b, a_scale, b_scale, out_dtype)


def fp8_gemm_1x128_128x1_k_blocks(a, b, a_scale, b_scale, out_dtype=torch.bfloat16):
    return fp8_gemm_1x128_128x1(a, b, a_scale, b_scale, out_dtype)


def _autotuner_in_closure(fn) -> tuple[Autotuner, ...]:
    """The inference kernel is built inside a function (its Autotuner is a closure cell of
    the custom op's body); None of it where Triton is not available (a CPU-only torch)."""
    op = _inference._get_triton_impls().gemm
    body = getattr(op, "_init_fn", None)
    cells = getattr(body, "__closure__", None) or ()
    return tuple(c.cell_contents for c in cells if isinstance(c.cell_contents, Autotuner))


for _fn in (blockwise_fp8_gemm, fp8_gemm_1x128_128x128, fp8_gemm_1x128_128x1, fp8_gemm_1x128_128x128_k_blocks,
            fp8_gemm_1x128_128x1_k_blocks):
    _fn.dtypes = FP8
    _fn.supports_backward = False
    _fn.fp8_accumulation = ACCUMULATION
    _fn.refuses = PER_COLUMN

blockwise_fp8_gemm.layout = "nk"
blockwise_fp8_gemm.limits = {"contiguous": True}
if _autotuner_in_closure(blockwise_fp8_gemm):
    blockwise_fp8_gemm.autotuned = _autotuner_in_closure(blockwise_fp8_gemm)
for _fn in (fp8_gemm_1x128_128x128, fp8_gemm_1x128_128x128_k_blocks):
    _fn.autotuned = (_training.triton_fp8_gemm_1x128_128x128_kernel,)
for _fn in (fp8_gemm_1x128_128x1, fp8_gemm_1x128_128x1_k_blocks):
    _fn.autotuned = (_training.triton_fp8_gemm_1x128_128x1_kernel,)
for _fn in (fp8_gemm_1x128_128x128_k_blocks, fp8_gemm_1x128_128x1_k_blocks):
    _fn.limits = {"sizes": {"K": K_BLOCKS}}
