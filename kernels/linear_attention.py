"""Triton kernels for linear attention and its ELU + 1 feature map.

Math (see ``docs/contract.md``):

* ``elu_feature_map(x) = elu(x) + 1 = max(x, 0) + exp(min(x, 0))``, elementwise.
  Computed in fp32 as ``x + 1`` where ``x > 0`` and ``exp(x)`` elsewhere, which is the
  same function for every non-NaN ``x`` and lets NaN propagate (a ``max(x, 0)`` on the
  GPU returns the non-NaN operand and would turn NaN into 1). Derivative:
  ``1`` where ``x > 0``, ``exp(x)`` elsewhere (1 at x = 0: elu with alpha = 1 is C^1).

  Positivity decision: the contract's formula is followed as written, so ``y`` is
  exactly 0 where ``exp(x)`` underflows in the output dtype (x below about -17.3 for
  fp16, -103.3 for fp32, -92 for bf16 after its fp32 computation); the fp64 formula
  rounded to those dtypes is 0 there too, so clamping to the smallest subnormal would
  only add a one-subnormal error. The kernel guarantees ``y >= 0``, ``y`` finite for
  finite ``x`` (``max + 1`` does not overflow any of the three dtypes: fp16's 65504 + 1
  rounds back to 65504), and ``y > 0`` wherever the fp64 value rounds to a positive
  number of the dtype, up to the last subnormal at the underflow edge (fp32 ``tl.exp``
  on NVIDIA is ``ex2.approx(x * log2(e))``, relative error about ``|x| * 2**-24``).

* ``linear_attention(q, k, v, causal=False, eps=1e-6)``, ``q, k [B, H, N, D]`` (already
  feature-mapped, non-negative), ``v [B, H, N, Dv]``:
  bidirectional ``o_i = (q_i S) / (q_i . z + eps)`` with ``S = sum_j k_j v_j^T`` (``[D, Dv]``)
  and ``z = sum_j k_j``; causal: the same with the sums over ``j <= i``.

  Bidirectional: a state kernel (one program per (b, h) computes ``S`` and ``z`` in fp32,
  looping over N in blocks) and a query kernel (one program per (block of N, b, h)).

  Causal, chunked: one program per (b, h, 32-column tile of Dv) walks the sequence in
  chunks of C tokens (C in ``linear_attention.chunk_sizes`` = 16, 32, 64; default 64), carrying the fp32 state of all earlier chunks (``S_prev``, ``z_prev``). For a chunk
  with rows ``Q_c, K_c, V_c``::

      A   = (Q_c K_c^T) masked to j <= i        (inclusive causal mask, [C, C])
      num = Q_c S_prev + A V_c
      den = Q_c z_prev + rowsum(A) + eps
      O_c = num / den
      S_prev += K_c^T V_c ;  z_prev += colsum(K_c)

  All products are block matrix products (``tl.dot``); there is no per-token loop on
  finite inputs. Non-finite ``v`` in a chunk takes a guarded slow path (see the kernel)
  so that ``0 * inf`` in a masked (future) entry of ``A`` cannot turn a past output into
  NaN: outputs depend only on ``j <= i`` for every input, as the contract says.

Precision: every operand is loaded, cast to fp32 and multiplied with
``tl.dot(..., input_precision="tf32x3")`` accumulating in fp32, for every input dtype
(``linear_attention.fp32_dot_precision``, ``linear_attention.dot_precisions``): the fp32
state ``S`` and scores ``A`` are not exact in tf32 (plain "tf32" gave 1e-3 relative
error on fp32 inputs), "tf32x3" matches "ieee" to within 25 % on an H100 and is about
6x faster (numbers at ``_DOT_PRECISION``). Casting to fp32 before ``tl.dot`` also
keeps bf16 correct under the Triton interpreter (which computes full fp32 dots).

Sizes: any N >= 0 (N = 0, B = 0 or H = 0 return an empty output without a launch), D and
Dv from 1 to 128, padded to powers of two of at least 16 with masks (``tl.dot`` needs
16). Any strides (passed to the kernels; no copies of q, k, v).
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.specialisation import unspecialised_jit

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 128
_CHUNK_SIZES = (16, 32, 64)
_DEFAULT_CHUNK = 64
# value columns per causal program: grid (B * H, cdiv(Dv, 32)) gives more programs when
# B * H is small (the kernel is latency-bound: 0.44 ms vs 0.74 ms with 64 at Dv = 64) and
# keeps D = Dv = 128 with 64-token chunks inside shared memory (one Dv-wide program
# needed 256 KiB). Each program recomputes A = Q_c K_c^T and z for its tile.
_CAUSAL_DV_TILE = 32
_CAUSAL_STAGES = 1  # pipelining stages of the chunk loop (1 was fastest on an H100; fewer smem buffers)
_BLOCK_N = 64  # token block of the bidirectional state and query kernels
_ELU_BLOCK = 1024  # elements per program of the feature-map kernels
# tl.dot input precision per input dtype (all operands are fp32 in registers).
# Measured on an H100 (B=2, H=8, N=4096, D=Dv=64, max error / max|o| against fp64):
#   "tf32":   fp32 1.1e-3 (useless: S and A rounded to 10 bits), fp16 6.0e-4 (output
#             rounding alone 2.8e-4); causal 0.48 ms
#   "tf32x3": fp32 1.3e-7, fp16 2.1e-4, bf16 1.6e-3 (the same as "ieee" for fp16/bf16,
#             fp32 within 25 %); causal 0.44-0.52 ms, bidirectional 0.20 ms
#   "ieee":   fp32 1.0e-7, fp16 2.1e-4, bf16 1.6e-3; causal 2.8-3.1 ms (FMA, no tensor
#             cores), bidirectional 0.70 ms
# "tf32x3" (three tf32 products of hi/lo splits, error per product ~2**-21 relative
# instead of ieee's 2**-24) keeps fp32 accuracy at tensor-core speed. The interpreter
# computes every fp32 dot in full fp32 whatever is asked.
_DOT_PRECISION = {torch.float32: "tf32x3", torch.float16: "tf32x3", torch.bfloat16: "tf32x3"}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ----------------------------------------------------------------------------------
# ELU + 1 feature map
# ----------------------------------------------------------------------------------


@unspecialised_jit
def _elu_feature_map_fwd_kernel(
    X,  # input, any strides, viewed as 4-D [S0, S1, S2, S3]
    Y,  # output, contiguous, same logical shape
    numel,  # number of elements
    S1, S2, S3,  # sizes of dims 1..3 (dim 0 is implied by numel)
    sx0, sx1, sx2, sx3,  # strides of X in elements
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    idx = pid * BLOCK + tl.arange(0, BLOCK)  # linear index into the contiguous output
    mask = idx < numel
    # unravel the row-major linear index into 4-D coordinates, then apply X's strides
    i3 = idx % S3
    r = idx // S3
    i2 = r % S2
    r = r // S2
    i1 = r % S1
    i0 = r // S1
    x = tl.load(X + i0 * sx0 + i1 * sx1 + i2 * sx2 + i3 * sx3, mask=mask, other=0.0).to(tl.float32)
    # elu(x) + 1 = max(x, 0) + exp(min(x, 0)): x + 1 for x > 0, exp(x) for x <= 0 (NaN -> exp(NaN) = NaN)
    y = tl.where(x > 0, x + 1.0, tl.exp(x))
    tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=mask)


@unspecialised_jit
def _elu_feature_map_bwd_kernel(
    X,  # saved forward input, any strides, 4-D view
    DY,  # upstream gradient, any strides, 4-D view
    DX,  # gradient w.r.t. x, contiguous
    numel,  # number of elements
    S1, S2, S3,  # sizes of dims 1..3
    sx0, sx1, sx2, sx3,  # strides of X
    sd0, sd1, sd2, sd3,  # strides of DY
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    mask = idx < numel
    i3 = idx % S3
    r = idx // S3
    i2 = r % S2
    r = r // S2
    i1 = r % S1
    i0 = r // S1
    x = tl.load(X + i0 * sx0 + i1 * sx1 + i2 * sx2 + i3 * sx3, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + i0 * sd0 + i1 * sd1 + i2 * sd2 + i3 * sd3, mask=mask, other=0.0).to(tl.float32)
    # d/dx [elu(x) + 1] = 1 for x > 0, exp(x) for x <= 0
    dydx = tl.where(x > 0, 1.0, tl.exp(x))
    tl.store(DX + idx, (dy * dydx).to(DX.dtype.element_ty), mask=mask)


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """A view of ``t`` with exactly 4 dims (leading size-1 dims; > 4 dims: a contiguous copy)."""
    if t.dim() > 4:
        t = t.contiguous().view(-1)
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def _elu_launch_fwd(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    if n == 0:
        return y
    x4 = _as_4d(x)
    grid = (triton.cdiv(n, _ELU_BLOCK),)
    _elu_feature_map_fwd_kernel[grid](
        x4, y, n, x4.shape[1], x4.shape[2], x4.shape[3], *x4.stride(), BLOCK=_ELU_BLOCK
    )
    return y


def _elu_launch_bwd(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    if n == 0:
        return dx
    if dy.dtype != x.dtype:
        dy = dy.to(x.dtype)
    x4, d4 = _as_4d(x), _as_4d(dy)
    grid = (triton.cdiv(n, _ELU_BLOCK),)
    _elu_feature_map_bwd_kernel[grid](
        x4, d4, dx, n, x4.shape[1], x4.shape[2], x4.shape[3], *x4.stride(), *d4.stride(),
        BLOCK=_ELU_BLOCK,
    )
    return dx


class _EluFeatureMap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _elu_launch_fwd(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _elu_launch_bwd(x, dy)


def _check_device(name: str, t: torch.Tensor) -> None:
    if t.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(
            f"{name} is on {t.device}; the Triton kernels need CUDA tensors "
            f"(or CPU tensors with TRITON_INTERPRET=1)"
        )


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1 = max(x, 0) + exp(min(x, 0))`` elementwise; autograd through a Triton backward.

    Any shape and strides (up to 4-D read in place; more dims through a contiguous
    copy); float32, float16, bfloat16; output contiguous in ``x``'s dtype.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"x has unsupported dtype {x.dtype}; expected one of {_DTYPES}")
    _check_device("x", x)
    return _EluFeatureMap.apply(x)


elu_feature_map.dtypes = _DTYPES
elu_feature_map.supports_backward = True


# ----------------------------------------------------------------------------------
# Bidirectional linear attention
# ----------------------------------------------------------------------------------


@unspecialised_jit
def _la_state_kernel(
    K,  # keys [B, H, N, D], any strides
    V,  # values [B, H, N, Dv], any strides
    S,  # out: fp32 state [B*H, BLOCK_D, BLOCK_DV], contiguous, S = sum_j k_j v_j^T (pad rows/cols 0)
    Z,  # out: fp32 key sum [B*H, BLOCK_D], contiguous, z = sum_j k_j
    H, N, D, DV,
    skb, skh, skn, skd,  # strides of K
    svb, svh, svn, svd,  # strides of V
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_DV)
    d_mask = offs_d < D
    e_mask = offs_e < DV
    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    s_acc = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    z_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        # masked lanes load 0: the identity of the sums S and z
        k = tl.load(k_base + offs_n[:, None] * skn + offs_d[None, :] * skd,
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_base + offs_n[:, None] * svn + offs_e[None, :] * svd,
                    mask=n_mask[:, None] & e_mask[None, :], other=0.0).to(tl.float32)
        s_acc += tl.dot(tl.trans(k), v, input_precision=DOT_PRECISION)
        z_acc += tl.sum(k, axis=0)
    # padded rows of S are 0 * v and would be NaN where v is infinite: force them to 0
    s_acc = tl.where(d_mask[:, None] & e_mask[None, :], s_acc, 0.0)
    tl.store(S + bh * (BLOCK_D * BLOCK_DV) + offs_d[:, None] * BLOCK_DV + offs_e[None, :], s_acc)
    tl.store(Z + bh * BLOCK_D + offs_d, z_acc)


@unspecialised_jit
def _la_query_kernel(
    Q,  # queries [B, H, N, D], any strides
    S,  # fp32 state [B*H, BLOCK_D, BLOCK_DV] from _la_state_kernel
    Z,  # fp32 key sum [B*H, BLOCK_D]
    O,  # out [B, H, N, Dv], contiguous, input dtype
    H, N, D, DV,
    eps,
    sqb, sqh, sqn, sqd,  # strides of Q
    sob, soh, son, sod,  # strides of O
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_DV)
    n_mask = offs_n < N
    q = tl.load(Q + b * sqb + h * sqh + offs_n[:, None] * sqn + offs_d[None, :] * sqd,
                mask=n_mask[:, None] & (offs_d < D)[None, :], other=0.0).to(tl.float32)
    s = tl.load(S + bh * (BLOCK_D * BLOCK_DV) + offs_d[:, None] * BLOCK_DV + offs_e[None, :])
    z = tl.load(Z + bh * BLOCK_D + offs_d)
    num = tl.dot(q, s, input_precision=DOT_PRECISION)  # q_i S
    den_full = tl.sum(q * z[None, :], axis=1)  # q_i . z
    den_full = den_full + eps  # bidirectional: den = q_i . z + eps
    o = num / den_full[:, None]
    tl.store(O + b * sob + h * soh + offs_n[:, None] * son + offs_e[None, :] * sod,
             o.to(O.dtype.element_ty), mask=n_mask[:, None] & (offs_e < DV)[None, :])


# ----------------------------------------------------------------------------------
# Causal linear attention, chunked
# ----------------------------------------------------------------------------------


@unspecialised_jit
def _la_causal_chunked_kernel(
    Q,  # queries [B, H, N, D], any strides
    K,  # keys [B, H, N, D], any strides
    V,  # values [B, H, N, Dv], any strides
    O,  # out [B, H, N, Dv], input dtype
    H, N, D, DV,
    eps,
    sqb, sqh, sqn, sqd,  # strides of Q
    skb, skh, skn, skd,  # strides of K
    svb, svh, svn, svd,  # strides of V
    sob, soh, son, sod,  # strides of O
    CHUNK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    pid_e = tl.program_id(1)  # which BLOCK_DV-wide tile of the value columns this program owns
    b = bh // H
    h = bh % H
    rows = tl.arange(0, CHUNK)  # position i inside the chunk
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = pid_e * BLOCK_DV + tl.arange(0, BLOCK_DV)
    d_mask = offs_d < D
    e_mask = offs_e < DV
    de_mask = d_mask[:, None] & e_mask[None, :]
    causal = rows[None, :] <= rows[:, None]  # inclusive causal mask inside a chunk: key j <= query i
    q_base = Q + b * sqb + h * sqh
    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    o_base = O + b * sob + h * soh
    # fp32 state of all earlier chunks: S_prev = sum_j k_j v_j^T, z_prev = sum_j k_j
    s_acc = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    z_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for c0 in range(0, N, CHUNK):
        offs_n = c0 + rows
        n_mask = offs_n < N
        # masked lanes load 0: padded tokens and feature columns add nothing to any sum
        q = tl.load(q_base + offs_n[:, None] * sqn + offs_d[None, :] * sqd,
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
        k = tl.load(k_base + offs_n[:, None] * skn + offs_d[None, :] * skd,
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_base + offs_n[:, None] * svn + offs_e[None, :] * svd,
                    mask=n_mask[:, None] & e_mask[None, :], other=0.0).to(tl.float32)
        # intra-chunk scores, future keys (j > i) replaced by exactly 0 (not multiplied)
        a = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        a = tl.where(causal, a, 0.0)
        # A V_c: a masked a[i, j] = 0 times an infinite v_j would be NaN and leak the
        # future into o_i. Multiply the finite part of V with tl.dot, and add the
        # non-finite entries' terms j <= i one key at a time (only in chunks that have one).
        v_ok = tl.abs(v) < float("inf")  # False for +-inf and NaN
        n_bad = tl.sum(tl.where(v_ok, 0, 1))
        intra = tl.dot(a, tl.where(v_ok, v, 0.0), input_precision=DOT_PRECISION)
        if n_bad > 0:
            for jj in range(0, CHUNK):
                a_col = tl.sum(tl.where(rows[None, :] == jj, a, 0.0), axis=1)  # A[:, jj]
                v_row = tl.sum(tl.where(rows[:, None] == jj, v, 0.0), axis=0)  # V[jj, :]
                v_bad = (v_row != v_row) | (tl.abs(v_row) == float("inf"))  # NaN or +-inf
                keep = (rows[:, None] >= jj) & v_bad[None, :]
                intra += tl.where(keep, a_col[:, None] * v_row[None, :], 0.0)
        num = tl.dot(q, s_acc, input_precision=DOT_PRECISION) + intra  # Q_c S_prev + A V_c
        den = tl.sum(q * z_acc[None, :], axis=1) + tl.sum(a, axis=1)  # Q_c z_prev + rowsum(A)
        den = den + eps  # causal: den = q_i . z_i + eps
        o = num / den[:, None]
        tl.store(o_base + offs_n[:, None] * son + offs_e[None, :] * sod,
                 o.to(O.dtype.element_ty), mask=n_mask[:, None] & e_mask[None, :])
        # carry the state past this chunk (padded rows of K^T V are 0 * v: keep them 0)
        s_acc += tl.where(de_mask, tl.dot(tl.trans(k), v, input_precision=DOT_PRECISION), 0.0)
        z_acc += tl.sum(k, axis=0)


def _check_qkv(q, k, v, causal, eps, chunk_size):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} has unsupported dtype {t.dtype}; expected one of {_DTYPES}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, H, N, D], got shape {tuple(t.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, H, N, Dv] with q's B, H, N {tuple(q.shape[:3])}, got {tuple(v.shape)}")
    if not 1 <= q.shape[3] <= _MAX_HEAD_DIM:
        raise ValueError(f"q, k head dim D = {q.shape[3]} is not supported (1..{_MAX_HEAD_DIM})")
    if not 1 <= v.shape[3] <= _MAX_HEAD_DIM:
        raise ValueError(f"v head dim Dv = {v.shape[3]} is not supported (1..{_MAX_HEAD_DIM})")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got q {q.device}, k {k.device}, v {v.device}")
    _check_device("q", q)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {eps!r}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be finite and > 0, got {eps!r}")
    if chunk_size is not None and chunk_size not in _CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {_CHUNK_SIZES} (or None), got {chunk_size!r}")


def linear_attention(q, k, v, causal=False, eps=1e-6, chunk_size=None):
    """Linear attention ``o_i = (q_i S) / (q_i . z + eps)``; causal sums run over ``j <= i``.

    ``q, k [B, H, N, D]``, ``v [B, H, N, Dv]``, one dtype (fp32/fp16/bf16), any strides;
    returns ``o [B, H, N, Dv]`` contiguous in the input dtype. ``chunk_size`` (an extra
    keyword beyond the contract) picks the causal kernel's chunk from
    ``linear_attention.chunk_sizes``; ``None`` means ``linear_attention.default_chunk_size``.
    The bidirectional path ignores it. No autograd.
    """
    _check_qkv(q, k, v, causal, eps, chunk_size)
    B, H, N, D = q.shape
    DV = v.shape[3]
    o = torch.empty((B, H, N, DV), dtype=q.dtype, device=q.device)
    if B * H * N == 0:
        return o
    block_d = max(16, triton.next_power_of_2(D))
    block_dv = max(16, triton.next_power_of_2(DV))
    precision = _DOT_PRECISION[q.dtype]
    eps = float(eps)
    if causal:
        chunk = _DEFAULT_CHUNK if chunk_size is None else int(chunk_size)
        tile_dv = min(block_dv, _CAUSAL_DV_TILE)
        _la_causal_chunked_kernel[(B * H, triton.cdiv(DV, tile_dv))](
            q, k, v, o, H, N, D, DV, eps,
            *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            CHUNK=chunk, BLOCK_D=block_d, BLOCK_DV=tile_dv, DOT_PRECISION=precision,
            num_warps=4, num_stages=_CAUSAL_STAGES,
        )
        return o
    s = torch.empty((B * H, block_d, block_dv), dtype=torch.float32, device=q.device)
    z = torch.empty((B * H, block_d), dtype=torch.float32, device=q.device)
    _la_state_kernel[(B * H,)](
        k, v, s, z, H, N, D, DV, *k.stride(), *v.stride(),
        BLOCK_N=_BLOCK_N, BLOCK_D=block_d, BLOCK_DV=block_dv, DOT_PRECISION=precision,
        num_warps=4,
    )
    _la_query_kernel[(triton.cdiv(N, _BLOCK_N), B * H)](
        q, s, z, o, H, N, D, DV, eps, *q.stride(), *o.stride(),
        BLOCK_N=_BLOCK_N, BLOCK_D=block_d, BLOCK_DV=block_dv, DOT_PRECISION=precision,
        num_warps=4,
    )
    return o


linear_attention.dtypes = _DTYPES
linear_attention.supports_backward = False
linear_attention.fp32_dot_precision = "tf32x3"
# every operand is cast to fp32 before tl.dot: bf16 is correct under the interpreter
linear_attention.bf16_dot_upcast = True
linear_attention.dot_precisions = {str(k).replace("torch.", ""): p for k, p in _DOT_PRECISION.items()}
linear_attention.chunk_sizes = _CHUNK_SIZES
linear_attention.default_chunk_size = _DEFAULT_CHUNK
linear_attention.max_head_dim = _MAX_HEAD_DIM
