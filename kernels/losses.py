"""Per-row cross-entropy (softmax + negative log-likelihood) in Triton, forward and backward.

``cross_entropy(logits, target, ignore_index=-100)`` with ``logits [M, V]`` and
``target [M]`` (int64) returns ``loss [M]`` in float32::

    lse[i]  = log(sum_j exp(logits[i, j]))
    loss[i] = lse[i] - logits[i, target[i]]          (0 exactly where target[i] == ignore_index)

One program owns one row and walks it in column blocks of ``BLOCK_V`` lanes, keeping
an *online* logsumexp per lane: a running max ``m`` and a sum ``s`` of
``exp(z - m)``, rescaled whenever the max grows::

    m_new = max(m, z)
    s     = s * exp(m - m_new) + exp(z - m_new)

After the last block the lanes are merged the same way
(``M = max_lanes m``, ``S = sum_lanes s * exp(m - M)``) and ``lse = M + log(S)``.
Subtracting the running max keeps every ``exp`` argument ``<= 0``, so large logits
never overflow and uniformly very negative ones never underflow to ``log(0)``.
Lanes past the end of the row load ``-inf``: the identity of the max and, through
``exp(-inf) = 0``, of the sum. A lane that has seen only ``-inf`` uses 0 as its
reference instead of its max (``-inf - -inf`` would be NaN) and keeps ``s = 0``.
Non-finite rows follow the math: a row with a NaN gives NaN, a row with ``+inf``
(and no NaN) has ``lse = +inf``, a row of only ``-inf`` has ``lse = -inf`` (so the
loss is NaN, as ``-inf - -inf``).

Backward, with ``p = softmax(logits[i]) = exp(logits[i] - lse[i])`` from the saved fp32
``lse``::

    dlogits[i, j] = dloss[i] * (p_j - [j == target[i]])      (a zero row if ignored)

returned in the logits dtype (a new contiguous tensor).

Targets: ``target[i]`` must be ``ignore_index`` or in ``[0, V)``. The wrapper checks
this with one reduction on the device and raises ``ValueError`` naming ``target``
(the check costs a device sync); an out-of-range index would otherwise read outside
the row. If ``ignore_index`` is itself in ``[0, V)``, those rows are ignored.

Block size: ``BLOCK_V = clamp(next_power_of_2(V), MIN_BLOCK_V, cap)``, cap
``MAX_BLOCK_V_CUDA`` (4096) on a GPU and ``MAX_BLOCK_V_INTERPRET`` (128) under the
Triton interpreter, so modest vocabularies already take the multi-block path on CPU.
The wrapper reads both constants at call time (tests may lower them). Any strides
of ``logits``, ``target`` and the incoming ``dloss`` are read in place.
"""
from __future__ import annotations

import numbers
import os

import torch
import triton
import triton.language as tl

from tritoncheck.kernels.specialisation import unspecialised_jit

__all__ = ["cross_entropy"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Block-size buckets (powers of two) for the column loop.
MIN_BLOCK_V = 16
MAX_BLOCK_V_CUDA = 4096
MAX_BLOCK_V_INTERPRET = 128


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def block_v_for(v: int, device: torch.device) -> int:
    """Bucketed column block: next power of two of ``v``, clamped."""
    cap = MAX_BLOCK_V_CUDA if device.type == "cuda" and not _interpreting() else MAX_BLOCK_V_INTERPRET
    return max(MIN_BLOCK_V, min(triton.next_power_of_2(v), cap))


# --------------------------------------------------------------------------- kernels


@unspecialised_jit
def _cross_entropy_fwd_kernel(
    LOGITS,  # *T [M, V] logits, strides (stride_lm, stride_lv)
    TARGET,  # *int64 [M] target class per row, stride stride_t
    LOSS,  # *fp32 [M] output loss, contiguous
    LSE,  # *fp32 [M] logsumexp per row, saved for backward, contiguous
    stride_lm, stride_lv, stride_t,
    V,  # number of classes (row length)
    ignore_index,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = LOGITS + row * stride_lm
    offs = tl.arange(0, BLOCK_V)

    # Online logsumexp, per lane. Padded lanes load -inf (identity of max; exp -> 0).
    m_lane = tl.full([BLOCK_V], float("-inf"), tl.float32)
    s_lane = tl.zeros([BLOCK_V], tl.float32)
    nan_lane = tl.zeros([BLOCK_V], tl.int32)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        z = tl.load(x_row + cols * stride_lv, mask=cols < V, other=float("-inf")).to(tl.float32)
        nan_lane += (z != z).to(tl.int32)
        m_new = tl.maximum(m_lane, z)
        # A lane that has seen only -inf keeps s = 0 (exp(-inf - -inf) would be NaN).
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s_lane = s_lane * tl.exp(m_lane - m_ref) + tl.exp(z - m_ref)
        m_lane = m_new
    # Merge the lanes: M = max m, S = sum s * exp(m - M).
    m = tl.max(m_lane, axis=0)
    m_fin = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_lane * tl.exp(m_lane - m_fin), axis=0)
    lse = m + tl.log(s)
    # A +inf logit makes lse = +inf (the sum above is inf - inf = NaN there), unless a NaN is present.
    no_nan = tl.sum(nan_lane, axis=0) == 0
    lse = tl.where((m == float("inf")) & no_nan, float("inf"), lse)

    # loss = lse - logits[target]; ignored rows read column 0 (in bounds) and store exactly 0.
    tgt = tl.load(TARGET + row * stride_t)
    ignored = tgt == ignore_index
    tgt_safe = tl.where(ignored, 0, tgt)
    x_t = tl.load(x_row + tgt_safe * stride_lv).to(tl.float32)
    loss = tl.where(ignored, 0.0, lse - x_t)
    tl.store(LOSS + row, loss)
    tl.store(LSE + row, lse)


@unspecialised_jit
def _cross_entropy_bwd_kernel(
    LOGITS,  # *T [M, V] forward logits, strides (stride_lm, stride_lv)
    TARGET,  # *int64 [M] target class per row, stride stride_t
    LSE,  # *fp32 [M] saved logsumexp, contiguous
    DLOSS,  # *T' [M] upstream gradient of the loss, stride stride_d
    DLOGITS,  # *T [M, V] output gradient of the logits, contiguous (row stride V)
    stride_lm, stride_lv, stride_t, stride_d,
    V,
    ignore_index,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = LOGITS + row * stride_lm
    dx_row = DLOGITS + row * V
    offs = tl.arange(0, BLOCK_V)
    tgt = tl.load(TARGET + row * stride_t)
    ignored = tgt == ignore_index
    lse = tl.load(LSE + row)
    dl = tl.load(DLOSS + row * stride_d).to(tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        mask = cols < V
        z = tl.load(x_row + cols * stride_lv, mask=mask, other=float("-inf")).to(tl.float32)
        p = tl.exp(z - lse)  # softmax from the saved logsumexp
        g = p - tl.where(cols == tgt, 1.0, 0.0)  # minus the one-hot of the target
        # Ignored rows get exact zeros (a where, not a multiply: 0 * NaN would be NaN).
        dx = tl.where(ignored, 0.0, dl * g)
        tl.store(dx_row + cols, dx.to(DLOGITS.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- validation


def _check(logits, target, ignore_index) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if logits.dtype not in DTYPES:
        raise TypeError(f"logits has unsupported dtype {logits.dtype}; supported: float32, float16, bfloat16")
    if target.dtype != torch.int64:
        raise TypeError(f"target must have dtype torch.int64, got {target.dtype}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if not (-(2**63) <= int(ignore_index) < 2**63):
        raise ValueError(f"ignore_index must fit in int64, got {ignore_index}")
    if target.device != logits.device:
        raise ValueError(f"target is on {target.device} but logits is on {logits.device}; they must be on one device")
    if logits.device.type not in (("cpu", "cuda") if _interpreting() else ("cuda",)):
        raise ValueError(f"logits is on {logits.device}: needs a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [M, V], got shape {tuple(logits.shape)}")
    m, v = logits.shape
    if v == 0:
        raise ValueError(f"logits has V = 0 classes (shape {tuple(logits.shape)}): cross-entropy is undefined")
    if tuple(target.shape) != (m,):
        raise ValueError(f"target must have shape ({m},) (logits' rows), got {tuple(target.shape)}")
    if m > 0:
        # One device reduction and a sync: an out-of-range index would read outside the row.
        bad = (target != ignore_index) & ((target < 0) | (target >= v))
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"target[{i}] = {int(target[i])} is out of range: targets must be in [0, {v}) "
                f"or equal ignore_index = {ignore_index}"
            )


# --------------------------------------------------------------------------- autograd


class _CrossEntropyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index):
        m, v = logits.shape
        loss = torch.empty((m,), dtype=torch.float32, device=logits.device)
        lse = torch.empty((m,), dtype=torch.float32, device=logits.device)
        if m > 0:
            _cross_entropy_fwd_kernel[(m,)](
                logits, target, loss, lse,
                logits.stride(0), logits.stride(1), target.stride(0),
                v, int(ignore_index),
                BLOCK_V=block_v_for(v, logits.device),
            )
        ctx.save_for_backward(logits, target, lse)
        ctx.ignore_index = int(ignore_index)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dloss):
        logits, target, lse = ctx.saved_tensors
        m, v = logits.shape
        dlogits = torch.empty((m, v), dtype=logits.dtype, device=logits.device)
        if m > 0:
            _cross_entropy_bwd_kernel[(m,)](
                logits, target, lse, dloss, dlogits,
                logits.stride(0), logits.stride(1), target.stride(0), dloss.stride(0),
                v, ctx.ignore_index,
                BLOCK_V=block_v_for(v, logits.device),
            )
        return dlogits, None, None


def cross_entropy(logits, target, ignore_index=-100):
    """``loss[i] = logsumexp(logits[i]) - logits[i, target[i]]``, 0 where ``target[i] == ignore_index``.

    ``logits [M, V]`` (float32/float16/bfloat16, any strides), ``target [M]`` int64;
    returns float32 ``[M]``. Differentiable in ``logits`` (Triton backward).
    Raises ``ValueError`` for a target outside ``[0, V)`` that is not ``ignore_index``.
    """
    _check(logits, target, ignore_index)
    return _CrossEntropyFn.apply(logits, target, ignore_index)


cross_entropy.dtypes = DTYPES
cross_entropy.supports_backward = True
