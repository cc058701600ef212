"""Fused linear cross-entropy in Triton, forward and backward: the loss of ``x @ weight.T``
without the ``[N, V]`` logits ever being stored.

``linear_cross_entropy(x, weight, target, ignore_index=-100, softcap=0.0, reduction="mean")``
with ``x [N, H]``, ``weight [V, H]`` and ``target [N]`` (int64)::

    a[i, j]  = x[i] . weight[j]                        (fp32 accumulation)
    z[i, j]  = softcap * tanh(a[i, j] / softcap)       (softcap > 0; else z = a)
    lse[i]   = log(sum_j exp(z[i, j]))
    row[i]   = lse[i] - z[i, target[i]]                (exactly 0 where target[i] == ignore_index)
    loss     = row ("none"), sum(row) ("sum"), sum(row) / #(target != ignore_index) ("mean")

The loss is float32 (``[N]`` for ``"none"``, a 0-dim tensor otherwise). Every row ignored
under ``"mean"`` gives ``0 / 0 = NaN``, as ``F.cross_entropy``.

Forward: one program per block of ``BLOCK_N`` rows walks the vocabulary in chunks of
``BLOCK_V`` columns. For each chunk it forms the ``[BLOCK_N, BLOCK_V]`` tile of logits by
``tl.dot`` over ``BLOCK_H`` slices of the hidden dim, applies the softcap, and folds the
tile into an online logsumexp per row (a running max ``m`` and sum ``s`` of
``exp(z - m)``, rescaled when the max grows); the target's logit is picked from the
chunk that holds it. Only ``lse`` (fp32, ``[N]``) is saved for the backward.

Backward, with ``dl[i]`` the upstream gradient of row ``i`` (``dloss[i]``; ``dloss`` for
``"sum"``; ``dloss / count`` for ``"mean"``) and ``p = exp(z - lse)``::

    g[i, j]   = dl[i] (p[i, j] - [j == target[i]]) (1 - tanh^2(a[i, j] / softcap))   (0 if ignored)
    dx[i]     = sum_j g[i, j] weight[j]
    dweight[j] = sum_i g[i, j] x[i]

Two kernels recompute the logits tile by tile from ``x``, ``weight`` and the saved
``lse``: the ``dx`` kernel, one program per (row block, hidden slice), accumulates
``g @ weight`` over the vocabulary chunks; the ``dweight`` kernel, one program per
(vocabulary chunk, hidden slice), accumulates ``g^T @ x`` over the row blocks in a fixed
order (deterministic, no atomics). Ignored rows get ``g = 0`` by a ``where`` (not a
product: ``0 * NaN`` would be NaN), so their ``dx`` rows are exactly 0.

Dot precision: every tile is converted to fp32 before ``tl.dot(..., input_precision="ieee")``
(full fp32 products on the GPU and the interpreter, ``linear_cross_entropy.fp32_dot_precision
= "ieee"``); float16 and bfloat16 inputs are exact in fp32, so their products are too
(``bf16_dot_upcast = True``: the interpreter's bf16 ``tl.dot`` is never used).

Chunks: the vocabulary chunk ``BLOCK_V`` is the ``chunk_size`` keyword, one of
``linear_cross_entropy.chunk_sizes``; ``None`` takes ``DEFAULT_CHUNK_INTERPRET`` (32) under the
interpreter, ``DEFAULT_CHUNK_CUDA`` (128) on a GPU. ``BLOCK_N`` (16 interpreted, 64 on a GPU)
and ``BLOCK_H`` (32 / 64) are fixed per backend. Offsets are int64 (row and column indices
are cast before a stride multiplies them): ``N * H`` and ``V * H`` may pass 2**31.
Any strides of ``x``, ``weight`` and ``target`` are read in place.
"""
from __future__ import annotations

import math
import numbers
import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.attention import _tanh
from tritoncheck.kernels.specialisation import unspecialised_jit

__all__ = ["linear_cross_entropy"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
REDUCTIONS = ("mean", "sum", "none")
CHUNK_SIZES = (16, 32, 64, 128)
DEFAULT_CHUNK_INTERPRET = 32
DEFAULT_CHUNK_CUDA = 128


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Every tl.dot here is float32 "ieee" (inputs cast up): FMA code unrolled per thread, of
# BLOCK_N BLOCK_V BLOCK_H / (32 NUM_WARPS) multiply-adds a dot. At 4 warps and the GPU's
# 64 x 128 x 64 tiles one kernel took 6-11 s to compile for sm_90 (triton.compile on a CPU,
# Triton 3.9: forward 6.5 s, dx 10.6 s, dweight 10.1 s, float32); at 8 warps 3.4, 4.9 and
# 5.2 s, and a cold quick run compiles several dozen such keys. Blocks, and sums' order, unchanged.
NUM_WARPS = 8


def _blocks(device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_H, default BLOCK_V): tl.dot needs every dim >= 16."""
    if device.type == "cuda" and not _interpreting():
        return 64, 64, DEFAULT_CHUNK_CUDA
    return 16, 32, DEFAULT_CHUNK_INTERPRET


# --------------------------------------------------------------------------- kernels


@triton.jit
def _raw_logits(X, W, rows, cols, row_ok, col_ok, stride_xn, stride_xh, stride_wv, stride_wh, H,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """a = x[rows] . weight[cols] as a [BLOCK_N, BLOCK_V] fp32 tile (rows, cols int64)."""
    acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    offs_h = tl.arange(0, BLOCK_H)
    for h0 in range(0, H, BLOCK_H):
        hs = (h0 + offs_h).to(tl.int64)
        h_ok = hs < H
        x = tl.load(X + rows[:, None] * stride_xn + hs[None, :] * stride_xh,
                    mask=row_ok[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
        w = tl.load(W + cols[:, None] * stride_wv + hs[None, :] * stride_wh,
                    mask=col_ok[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    return acc


@triton.jit
def _logit_grad(a, cols, col_ok, row_ok, tgt, lse, dl, ignore_index, softcap, HAS_SOFTCAP: tl.constexpr):
    """g = dl (softmax - onehot) dz/da for a tile of raw logits a; 0 on ignored rows and padding."""
    if HAS_SOFTCAP:
        t = _tanh(a / softcap)
        z = softcap * t
    else:
        z = a
    p = tl.exp(z - lse[:, None])
    g = p - tl.where(cols[None, :] == tgt[:, None], 1.0, 0.0)
    if HAS_SOFTCAP:
        g = g * (1.0 - t * t)
    live = row_ok[:, None] & col_ok[None, :] & (tgt != ignore_index)[:, None]
    return tl.where(live, dl[:, None] * g, 0.0)


@unspecialised_jit
def _lce_fwd_kernel(
    X, W, TARGET,  # *T [N, H], *T [V, H], *int64 [N]
    ROW_LOSS, LSE,  # *fp32 [N] each, contiguous
    stride_xn, stride_xh, stride_wv, stride_wh, stride_t,
    N, V, H,
    ignore_index, softcap,
    HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    tgt = tl.load(TARGET + rows * stride_t, mask=row_ok, other=ignore_index)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    z_t = tl.zeros([BLOCK_N], tl.float32)
    offs_v = tl.arange(0, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        cols = (start + offs_v).to(tl.int64)
        col_ok = cols < V
        z = _raw_logits(X, W, rows, cols, row_ok, col_ok, stride_xn, stride_xh, stride_wv, stride_wh, H,
                        BLOCK_N, BLOCK_V, BLOCK_H)
        if HAS_SOFTCAP:
            z = softcap * _tanh(z / softcap)
        z = tl.where(col_ok[None, :], z, float("-inf"))
        # every chunk holds a column (start < V) and logits are finite: m_new is finite
        m_new = tl.maximum(m, tl.max(z, axis=1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
        m = m_new
        z_t += tl.sum(tl.where(cols[None, :] == tgt[:, None], z, 0.0), axis=1)
    lse = m + tl.log(s)
    loss = tl.where(tgt == ignore_index, 0.0, lse - z_t)
    tl.store(ROW_LOSS + rows, loss, mask=row_ok)
    tl.store(LSE + rows, lse, mask=row_ok)


@unspecialised_jit
def _lce_dx_kernel(
    X, W, TARGET, LSE, DL,  # DL: *fp32 [N] per-row upstream gradient, contiguous
    DX,  # *T [N, H], contiguous
    stride_xn, stride_xh, stride_wv, stride_wh, stride_t,
    N, V, H,
    ignore_index, softcap,
    HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    hs = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < N
    h_ok = hs < H
    tgt = tl.load(TARGET + rows * stride_t, mask=row_ok, other=ignore_index)
    lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
    dl = tl.load(DL + rows, mask=row_ok, other=0.0)
    acc = tl.zeros([BLOCK_N, BLOCK_H], dtype=tl.float32)
    offs_v = tl.arange(0, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        cols = (start + offs_v).to(tl.int64)
        col_ok = cols < V
        a = _raw_logits(X, W, rows, cols, row_ok, col_ok, stride_xn, stride_xh, stride_wv, stride_wh, H,
                        BLOCK_N, BLOCK_V, BLOCK_H)
        g = _logit_grad(a, cols, col_ok, row_ok, tgt, lse, dl, ignore_index, softcap, HAS_SOFTCAP)
        w = tl.load(W + cols[:, None] * stride_wv + hs[None, :] * stride_wh,
                    mask=col_ok[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(g, w, input_precision="ieee")
    tl.store(DX + rows[:, None] * H + hs[None, :], acc.to(DX.dtype.element_ty),
             mask=row_ok[:, None] & h_ok[None, :])


@unspecialised_jit
def _lce_dw_kernel(
    X, W, TARGET, LSE, DL,
    DW,  # *T [V, H], contiguous
    stride_xn, stride_xh, stride_wv, stride_wh, stride_t,
    N, V, H,
    ignore_index, softcap,
    HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
):
    cols = tl.program_id(0).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    hs = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < V
    h_ok = hs < H
    acc = tl.zeros([BLOCK_V, BLOCK_H], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    # dweight sums over every row block, in order: the accumulator lives across the loop
    for r0 in range(0, N, BLOCK_N):
        rows = (r0 + offs_n).to(tl.int64)
        row_ok = rows < N
        tgt = tl.load(TARGET + rows * stride_t, mask=row_ok, other=ignore_index)
        lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
        dl = tl.load(DL + rows, mask=row_ok, other=0.0)
        a = _raw_logits(X, W, rows, cols, row_ok, col_ok, stride_xn, stride_xh, stride_wv, stride_wh, H,
                        BLOCK_N, BLOCK_V, BLOCK_H)
        g = _logit_grad(a, cols, col_ok, row_ok, tgt, lse, dl, ignore_index, softcap, HAS_SOFTCAP)
        x = tl.load(X + rows[:, None] * stride_xn + hs[None, :] * stride_xh,
                    mask=row_ok[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(tl.trans(g), x, input_precision="ieee")
    tl.store(DW + cols[:, None] * H + hs[None, :], acc.to(DW.dtype.element_ty),
             mask=col_ok[:, None] & h_ok[None, :])


# --------------------------------------------------------------------------- validation


def _check(x, weight, target, ignore_index, softcap, reduction, chunk_size) -> None:
    for name, t in (("x", x), ("weight", weight), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"x has unsupported dtype {x.dtype}; supported: float32, float16, bfloat16")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight has dtype {weight.dtype} but x has dtype {x.dtype}; they must match")
    if target.dtype != torch.int64:
        raise TypeError(f"target must have dtype torch.int64, got {target.dtype}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if not (-(2**63) <= int(ignore_index) < 2**63):
        raise ValueError(f"ignore_index must fit in int64, got {ignore_index}")
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if not (math.isfinite(float(softcap)) and float(softcap) >= 0.0):
        raise ValueError(f"softcap must be finite and >= 0 (0 turns it off), got {softcap!r}")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if chunk_size is not None and chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES} (or None), got {chunk_size!r}")
    for name, t in (("weight", weight), ("target", target)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; all tensors must be on one device")
    if x.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"x is on {x.device}: needs a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [N, H], got shape {tuple(x.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [V, H], got shape {tuple(weight.shape)}")
    n, h = x.shape
    v = weight.shape[0]
    if h == 0:
        raise ValueError(f"x has H = 0 (shape {tuple(x.shape)}): the logits would all be 0 of no product")
    if weight.shape[1] != h:
        raise ValueError(f"weight must have shape [V, {h}] (x's hidden dim), got {tuple(weight.shape)}")
    if v == 0:
        raise ValueError(f"weight has V = 0 rows (shape {tuple(weight.shape)}): cross-entropy is undefined")
    if tuple(target.shape) != (n,):
        raise ValueError(f"target must have shape ({n},) (x's rows), got {tuple(target.shape)}")
    if n > 0:
        # One device reduction and a sync: an out-of-range index is a loss of nothing.
        bad = (target != ignore_index) & ((target < 0) | (target >= v))
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"target[{i}] = {int(target[i])} is out of range: targets must be in [0, {v}) "
                             f"or equal ignore_index = {ignore_index}")


# --------------------------------------------------------------------------- autograd


def _launch_args(x, weight, target, ignore_index, softcap):
    n, h = x.shape
    return ((x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), target.stride(0),
             n, weight.shape[0], h, int(ignore_index), float(softcap)))


class _LinearCrossEntropyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target, ignore_index, softcap, reduction, chunk_size):
        n, v = x.shape[0], weight.shape[0]
        block_n, block_h, default_v = _blocks(x.device)
        block_v = default_v if chunk_size is None else int(chunk_size)
        row_loss = torch.empty((n,), dtype=torch.float32, device=x.device)
        lse = torch.empty((n,), dtype=torch.float32, device=x.device)
        consts = dict(HAS_SOFTCAP=softcap > 0, BLOCK_N=block_n, BLOCK_V=block_v, BLOCK_H=block_h)
        if n > 0:
            _lce_fwd_kernel[(triton.cdiv(n, block_n),)](
                x, weight, target, row_loss, lse, *_launch_args(x, weight, target, ignore_index, softcap), **consts,
                num_warps=NUM_WARPS)
        count = (target != ignore_index).sum()  # rows the mean is over (a device value: no sync)
        ctx.save_for_backward(x, weight, target, lse, count)
        ctx.args = (int(ignore_index), float(softcap), reduction, consts, v)
        if reduction == "none":
            return row_loss
        total = row_loss.sum()
        return total if reduction == "sum" else total / count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dloss):
        x, weight, target, lse, count = ctx.saved_tensors
        ignore_index, softcap, reduction, consts, v = ctx.args
        n, h = x.shape
        dl = dloss.float()
        if reduction == "mean":
            dl = dl / count
        dl = dl.expand(n).contiguous()
        dx = torch.empty((n, h), dtype=x.dtype, device=x.device)
        dw = torch.empty((v, h), dtype=weight.dtype, device=weight.device)
        args = _launch_args(x, weight, target, ignore_index, softcap)
        block_n, block_v, block_h = consts["BLOCK_N"], consts["BLOCK_V"], consts["BLOCK_H"]
        if n > 0:
            _lce_dx_kernel[(triton.cdiv(n, block_n), triton.cdiv(h, block_h))](
                x, weight, target, lse, dl, dx, *args, **consts, num_warps=NUM_WARPS)
        _lce_dw_kernel[(triton.cdiv(v, block_v), triton.cdiv(h, block_h))](
            x, weight, target, lse, dl, dw, *args, **consts, num_warps=NUM_WARPS)
        return dx, dw, None, None, None, None, None


def linear_cross_entropy(x, weight, target, ignore_index=-100, softcap=0.0, reduction="mean", chunk_size=None):
    """Cross-entropy of the logits ``x @ weight.T`` (softcapped when ``softcap > 0``) without
    storing them; see the module docstring. ``x [N, H]``, ``weight [V, H]`` (one float dtype,
    any strides), ``target [N]`` int64; returns float32 (``[N]`` for ``reduction="none"``, a
    0-dim tensor for ``"sum"`` and ``"mean"``), differentiable in ``x`` and ``weight``.
    ``chunk_size``: the vocabulary chunk, one of ``linear_cross_entropy.chunk_sizes``."""
    _check(x, weight, target, ignore_index, softcap, reduction, chunk_size)
    return _LinearCrossEntropyFn.apply(x, weight, target, ignore_index, softcap, reduction, chunk_size)


linear_cross_entropy.dtypes = DTYPES
linear_cross_entropy.supports_backward = True
linear_cross_entropy.fp32_dot_precision = "ieee"
linear_cross_entropy.bf16_dot_upcast = True
linear_cross_entropy.chunk_sizes = CHUNK_SIZES
