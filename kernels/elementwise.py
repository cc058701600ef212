"""Rotary position embedding (interleaved pairs) and SwiGLU in Triton, forward and backward.

``rope(x, cos, sin)`` with ``x [B, H, S, D]`` (``D`` even) and ``cos``, ``sin``
``[S, D // 2]`` rotates each interleaved pair ``(x[..., 2i], x[..., 2i+1])`` of
position ``s`` by the angle ``theta[s, i]`` (``cos = cos(theta)``, ``sin = sin(theta)``)::

    y[..., 2i]   = x[..., 2i] cos[s, i] - x[..., 2i+1] sin[s, i]
    y[..., 2i+1] = x[..., 2i] sin[s, i] + x[..., 2i+1] cos[s, i]

(the GPT-J / Meta-LLaMA "interleaved" layout, not the NeoX "half split" one that
pairs ``i`` with ``i + D/2``). The rotation matrix is orthogonal, so the backward is
the rotation by ``-theta`` (its transpose)::

    dx[..., 2i]   =  dy[..., 2i] cos[s, i] + dy[..., 2i+1] sin[s, i]
    dx[..., 2i+1] = -dy[..., 2i] sin[s, i] + dy[..., 2i+1] cos[s, i]

so forward and backward are one kernel with the sign of ``sin`` as an argument
(``SIN_SIGN = +1`` forward, ``-1`` backward). Gradients flow to ``x`` only: ``cos`` and
``sin`` are treated as constants (tables of a fixed angle schedule) and get no gradient.
``cos``/``sin`` may have a dtype different from ``x`` (each of float32/float16/
bfloat16, e.g. fp32 tables with bf16 activations); everything is loaded and computed
in fp32 and the output has ``x``'s dtype.

Tiling: the ``B*H*S`` rows of ``x`` are numbered ``r = (b*H + h)*S + s``; a program
owns a ``[BLOCK_R, BLOCK_P]`` tile of (row, pair) and finds ``b, h, s`` by integer
division, so every stride of ``x``, ``dy``, ``cos`` and ``sin`` is read in place.
``BLOCK_P = clamp(next_power_of_2(D/2), 2, cap)`` (cap 128 on a GPU, 16 under the
interpreter, so modest head dims already take several pair blocks on CPU) and
``BLOCK_R = max(1, TILE // BLOCK_P)`` (``TILE`` 1024 on a GPU, 256 interpreted).
Out-of-range rows/pairs are masked (loads 0, stores skipped).

``swiglu(gate, up)`` (same shape, same dtype)::

    s = sigmoid(gate)
    y = gate * s * up
    dgate = dy * up * (s + gate * s * (1 - s))
    dup   = dy * gate * s

``sigmoid`` is evaluated in the stable form ``e = exp(-|g|)``,
``s = 1 / (1 + e)`` for ``g >= 0`` and ``e / (1 + e)`` otherwise: the ``exp`` argument is
never positive, so nothing overflows (``exp(g) / (1 + exp(g))`` is ``inf / inf = NaN``
for ``g > 88`` in fp32). Inputs ``[..., N]`` are viewed as ``[M, N]`` with their two
strides (a copy only when the leading dims cannot be merged); one program owns
``BLOCK`` consecutive logical elements (``BLOCK`` 1024 on a GPU, 256 interpreted).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.specialisation import unspecialised_jit

__all__ = ["rope", "swiglu"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# rope tiles: pairs per tile (power of two, clamped) and elements per tile.
MAX_BLOCK_P_CUDA = 128
MAX_BLOCK_P_INTERPRET = 16
ROPE_TILE_CUDA = 1024
ROPE_TILE_INTERPRET = 256
# swiglu: logical elements per program.
SWIGLU_BLOCK_CUDA = 1024
SWIGLU_BLOCK_INTERPRET = 256


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _on_gpu(device: torch.device) -> bool:
    return device.type == "cuda" and not _interpreting()


def rope_blocks_for(half: int, device: torch.device) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_P) for a head dim of ``2 * half``."""
    cap = MAX_BLOCK_P_CUDA if _on_gpu(device) else MAX_BLOCK_P_INTERPRET
    tile = ROPE_TILE_CUDA if _on_gpu(device) else ROPE_TILE_INTERPRET
    block_p = max(2, min(triton.next_power_of_2(half), cap))
    return max(1, tile // block_p), block_p


def swiglu_block_for(device: torch.device) -> int:
    return SWIGLU_BLOCK_CUDA if _on_gpu(device) else SWIGLU_BLOCK_INTERPRET


# --------------------------------------------------------------------------- kernels


@unspecialised_jit
def _rope_kernel(
    X,  # *T [B, H, S, D] input (x forward, dy backward), strides (sxb, sxh, sxs, sxd)
    COS,  # *Tc [S, D/2] cos(theta), strides (scs, scp)
    SIN,  # *Ts [S, D/2] sin(theta), strides (sss, ssp)
    Y,  # *T [B, H, S, D] output (y forward, dx backward), contiguous
    sxb, sxh, sxs, sxd, scs, scp, sss, ssp,
    H, S, HALF,  # heads, positions, pairs per row (D / 2)
    R,  # number of rows B * H * S
    sin_sign,  # +1.0: rotate by theta (forward); -1.0: by -theta (backward, the transpose)
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    pairs = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    row_ok = rows < R
    # Row r = (b*H + h)*S + s.
    s_idx = rows % S
    bh = rows // S
    h_idx = bh % H
    b_idx = bh // H
    x_base = b_idx * sxb + h_idx * sxh + s_idx * sxs  # [BLOCK_R]
    y_base = rows * (2 * HALF)  # contiguous output
    mask = row_ok[:, None] & (pairs < HALF)[None, :]

    # The two columns of pair i: interleaved (2i, 2i + 1).
    col_a = 2 * pairs
    col_b = 2 * pairs + 1
    x_a = tl.load(X + x_base[:, None] + col_a[None, :] * sxd, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(X + x_base[:, None] + col_b[None, :] * sxd, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(COS + s_idx[:, None] * scs + pairs[None, :] * scp, mask=mask, other=0.0).to(tl.float32)
    sn = tl.load(SIN + s_idx[:, None] * sss + pairs[None, :] * ssp, mask=mask, other=0.0).to(tl.float32)
    sn = sn * sin_sign

    # Rotation by theta: [c -s; s c] applied to (x_a, x_b).
    y_a = x_a * c - x_b * sn
    y_b = x_a * sn + x_b * c
    tl.store(Y + y_base[:, None] + col_a[None, :], y_a.to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + y_base[:, None] + col_b[None, :], y_b.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _sigmoid(g):
    # Stable logistic: the exp argument -|g| is <= 0, so it cannot overflow.
    e = tl.exp(-tl.abs(g))
    return tl.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@unspecialised_jit
def _swiglu_fwd_kernel(
    GATE,  # *T [M, N] gate, strides (sgm, sgn)
    UP,  # *T [M, N] up, strides (sum_, sun)
    Y,  # *T [M, N] output, contiguous
    sgm, sgn, sum_, sun,
    N,  # row length
    NUMEL,  # M * N
    BLOCK: tl.constexpr,
):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = idx < NUMEL
    row = idx // N
    col = idx % N
    g = tl.load(GATE + row * sgm + col * sgn, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + row * sum_ + col * sun, mask=mask, other=0.0).to(tl.float32)
    s = _sigmoid(g)
    y = g * s * u
    tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=mask)


@unspecialised_jit
def _swiglu_bwd_kernel(
    DY,  # *T [M, N] upstream gradient, strides (sdm, sdn)
    GATE,  # *T [M, N] forward gate, strides (sgm, sgn)
    UP,  # *T [M, N] forward up, strides (sum_, sun)
    DGATE,  # *T [M, N] gradient of gate, contiguous
    DUP,  # *T [M, N] gradient of up, contiguous
    sdm, sdn, sgm, sgn, sum_, sun,
    N,
    NUMEL,
    BLOCK: tl.constexpr,
):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = idx < NUMEL
    row = idx // N
    col = idx % N
    dy = tl.load(DY + row * sdm + col * sdn, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + row * sgm + col * sgn, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + row * sum_ + col * sun, mask=mask, other=0.0).to(tl.float32)
    s = _sigmoid(g)
    # d(g * s)/dg = s + g * s * (1 - s)
    dgate = dy * u * (s + g * s * (1.0 - s))
    dup = dy * g * s
    tl.store(DGATE + idx, dgate.to(DGATE.dtype.element_ty), mask=mask)
    tl.store(DUP + idx, dup.to(DUP.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- validation


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} has unsupported dtype {t.dtype}; supported: float32, float16, bfloat16")


def _check_device(first: str, t0: torch.Tensor, others) -> None:
    for name, t in others:
        if t.device != t0.device:
            raise ValueError(f"{name} is on {t.device} but {first} is on {t0.device}; all tensors must be on one device")
    if t0.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"{first} is on {t0.device}: needs a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors")


# --------------------------------------------------------------------------- rope


def _rope_launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sin_sign: float) -> torch.Tensor:
    b, h, s, d = x.shape
    out = torch.empty((b, h, s, d), dtype=x.dtype, device=x.device)
    rows, half = b * h * s, d // 2
    if rows == 0 or half == 0:
        return out
    block_r, block_p = rope_blocks_for(half, x.device)
    grid = (triton.cdiv(rows, block_r), triton.cdiv(half, block_p))
    _rope_kernel[grid](
        x, cos, sin, out,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        h, s, half, rows,
        sin_sign,
        BLOCK_R=block_r, BLOCK_P=block_p,
    )
    return out


class _RopeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope_launch(x, cos, sin, sin_sign=1.0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        # The transpose of the rotation by theta is the rotation by -theta.
        dx = _rope_launch(dy, cos, sin, sin_sign=-1.0)
        return dx, None, None


def rope(x, cos, sin):
    """Rotate interleaved pairs ``(x[..., 2i], x[..., 2i+1])`` of ``x [B, H, S, D]`` by ``theta[s, i]``.

    ``cos``, ``sin`` are ``[S, D // 2]``. Differentiable in ``x`` only (Triton backward);
    ``cos`` and ``sin`` get no gradient.
    """
    _check_tensor("x", x)
    _check_tensor("cos", cos)
    _check_tensor("sin", sin)
    _check_device("x", x, (("cos", cos), ("sin", sin)))
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D [B, H, S, D], got shape {tuple(x.shape)}")
    _, _, s, d = x.shape
    if d % 2 != 0:
        raise ValueError(f"x's head dim D = {d} must be even (x has shape {tuple(x.shape)})")
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (s, d // 2):
            raise ValueError(f"{name} must have shape ({s}, {d // 2}) = (S, D // 2) for x of shape {tuple(x.shape)}, got {tuple(t.shape)}")
    return _RopeFn.apply(x, cos, sin)


rope.dtypes = DTYPES
rope.supports_backward = True


# --------------------------------------------------------------------------- swiglu


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t [..., N]`` as ``[M, N]``: a view when the leading dims merge, else a copy."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    return t.reshape(-1, t.shape[-1])


class _SwigluFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        g2, u2 = _rows(gate), _rows(up)
        m, n = g2.shape
        y = torch.empty((m, n), dtype=gate.dtype, device=gate.device)
        numel = m * n
        if numel > 0:
            block = swiglu_block_for(gate.device)
            _swiglu_fwd_kernel[(triton.cdiv(numel, block),)](
                g2, u2, y,
                g2.stride(0), g2.stride(1), u2.stride(0), u2.stride(1),
                n, numel,
                BLOCK=block,
            )
        ctx.save_for_backward(g2, u2)
        ctx.shape = gate.shape
        return y.view(gate.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        g2, u2 = ctx.saved_tensors
        m, n = g2.shape
        dgate = torch.empty((m, n), dtype=g2.dtype, device=g2.device)
        dup = torch.empty((m, n), dtype=u2.dtype, device=u2.device)
        numel = m * n
        if numel > 0:
            dy2 = _rows(dy)
            block = swiglu_block_for(g2.device)
            _swiglu_bwd_kernel[(triton.cdiv(numel, block),)](
                dy2, g2, u2, dgate, dup,
                dy2.stride(0), dy2.stride(1), g2.stride(0), g2.stride(1), u2.stride(0), u2.stride(1),
                n, numel,
                BLOCK=block,
            )
        needs = ctx.needs_input_grad
        return (dgate.view(ctx.shape) if needs[0] else None, dup.view(ctx.shape) if needs[1] else None)


def swiglu(gate, up):
    """``y = gate * sigmoid(gate) * up`` elementwise (same shape and dtype), computed in fp32.

    Differentiable in ``gate`` and ``up`` (Triton backward).
    """
    _check_tensor("gate", gate)
    _check_tensor("up", up)
    if up.dtype != gate.dtype:
        raise TypeError(f"up has dtype {up.dtype} but gate has dtype {gate.dtype}; they must match")
    _check_device("gate", gate, (("up", up),))
    if up.shape != gate.shape:
        raise ValueError(f"up has shape {tuple(up.shape)} but gate has shape {tuple(gate.shape)}; they must match")
    return _SwigluFn.apply(gate, up)


swiglu.dtypes = DTYPES
swiglu.supports_backward = True
