"""Block-scaled low-precision formats: the facts of each format, the scale layouts of the
contract, dequantisation and quantisation, in NumPy and PyTorch alike.

A quantised tensor ``q`` (float8_e4m3fn, float8_e5m2 or int8) stands for ``q * scale``,
the scale taken from a float32 tensor whose every axis either has size 1 (one scale for the
whole axis) or one entry per group of ``group`` consecutive elements along it::

    value[i, j] = q[i, j] * scale[i // gi if scale.shape[0] > 1 else 0, j // gj if scale.shape[1] > 1 else 0]

The groups an axis may have are the contract's (``scaled_mm``'s, and any other op's that
takes these tensors): per element (``group`` 1: a per-row or per-column scale) or per
:data:`SCALE_BLOCK` (128: DeepSeek-V3's and vLLM's 1 x 128 activation and 128 x 128 weight
blocks); an axis not a multiple of the block ends in a short block that has a scale of its
own. The groups are read from the scale's shape (:func:`groups`), never from a flag.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = ["SCALE_BLOCK", "FORMATS", "format_max", "smallest", "blocks", "groups", "group_index", "expand",
           "dequantise", "quantise"]

SCALE_BLOCK = 128
FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)


def format_max(dtype: torch.dtype) -> float:
    """The largest finite value of a format: 448 (e4m3fn), 57344 (e5m2), 127 (int8)."""
    return float(torch.finfo(dtype).max if dtype.is_floating_point else torch.iinfo(dtype).max)


def smallest(dtype: torch.dtype) -> float:
    """The smallest positive value of a format: its smallest subnormal (2^-9 for e4m3fn,
    2^-16 for e5m2), 1 for int8."""
    if not dtype.is_floating_point:
        return 1.0
    info = torch.finfo(dtype)
    return float(info.tiny) * float(info.eps)


def blocks(n: int, block: int = SCALE_BLOCK) -> int:
    """How many blocks of ``block`` cover ``n`` elements (the last one may be short)."""
    return -(-n // block)


def groups(scale_shape: Sequence[int], shape: Sequence[int], allowed: Sequence[Sequence[int]],
           name: str = "scale") -> tuple[int | None, int | None]:
    """The group size along each axis that a scale of ``scale_shape`` has for a tensor of
    ``shape`` (None: one scale for the whole axis), among the ``allowed`` group sizes of each
    axis; a ValueError naming ``name`` when the shape fits none. An axis of one element is
    broadcast whatever it could also mean (the meanings agree there)."""
    if len(scale_shape) != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(scale_shape)}")
    out = []
    for axis, (count, size, sizes) in enumerate(zip(scale_shape, shape, allowed)):
        if count == 1:
            out.append(None)
            continue
        group = next((g for g in sizes if count == blocks(size, g)), None)
        if group is None:
            want = " or ".join(str(blocks(size, g)) for g in sizes)
            raise ValueError(f"{name} has {count} entries along axis {axis}; for a tensor of shape {tuple(shape)} "
                             f"the contract takes 1 or {want}")
        out.append(group)
    return out[0], out[1]


def group_index(n: int, group: int | None, like):
    """The scale entry each of ``n`` positions reads: 0 everywhere for a broadcast axis, else
    ``i // group``; NumPy or torch (``like``'s kind and device)."""
    if isinstance(like, torch.Tensor):
        i = torch.arange(n, device=like.device)
    else:
        i = np.arange(n)
    return i * 0 if group is None else i // group


def expand(scale, shape: Sequence[int], axis_groups: tuple[int | None, int | None]):
    """The scale of every element of a tensor of ``shape`` (NumPy or torch, as ``scale``)."""
    rows = group_index(shape[0], axis_groups[0], scale)
    cols = group_index(shape[1], axis_groups[1], scale)
    return scale[rows][:, cols]


def dequantise(q, scale, axis_groups: tuple[int | None, int | None]):
    """``q * scale`` in float64, element by element (NumPy or torch, as ``q``)."""
    if isinstance(q, torch.Tensor):
        return q.to(torch.float64) * expand(scale.to(torch.float64), q.shape, axis_groups)
    return np.asarray(q, dtype=np.float64) * expand(np.asarray(scale, dtype=np.float64), q.shape, axis_groups)


def quantise(x: torch.Tensor, dtype: torch.dtype, axis_groups: tuple[int | None, int | None]
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (2-D, floating) as ``(q, scale)`` in ``dtype`` with one float32 scale per group:
    ``amax / format_max`` (1 for an all-zero group), ``q = x / scale`` rounded to the format
    (int8: to nearest, clamped to [-127, 127]). The usual dynamic quantisation; the values
    it gives are exact format values, whatever the scale's rounding."""
    rows = blocks(x.shape[0], axis_groups[0]) if axis_groups[0] else 1
    cols = blocks(x.shape[1], axis_groups[1]) if axis_groups[1] else 1
    x64 = x.to(torch.float64)
    amax = torch.zeros((rows, cols), dtype=torch.float64, device=x.device)
    r = group_index(x.shape[0], axis_groups[0], x)
    c = group_index(x.shape[1], axis_groups[1], x)
    flat = (r[:, None] * cols + c[None, :]).flatten()
    amax.view(-1).scatter_reduce_(0, flat, x64.abs().flatten(), reduce="amax")
    scale = torch.where(amax > 0, amax / format_max(dtype), 1.0).to(torch.float32)
    scaled = x64 / expand(scale.to(torch.float64), x.shape, axis_groups)
    if dtype.is_floating_point:
        q = scaled.clamp(-format_max(dtype), format_max(dtype)).to(dtype)
    else:
        q = scaled.round().clamp(-127, 127).to(dtype)
    return q, scale
