"""Tolerance rules of the linear-attention family: the ELU+1 feature map and linear attention.

Pieces and notation: :mod:`tritoncheck.tolerance`. Evaluated in float64 torch on the
suite's device; arguments NumPy arrays or tensors, results NumPy."""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.references.linear_attention import causal_state_reads
from tritoncheck.tolerance import DOT_READ_FLOOR, EXP_ULPS, SAFETY, Precision, float64_on, sum_error, unit_roundoff


def _la_half_subnormal(dtype: torch.dtype) -> float:
    """Half ``dtype``'s subnormal spacing: the error of rounding into its subnormals."""
    info = torch.finfo(dtype)
    return float(info.tiny) * float(info.eps) / 2


def elu_feature_map(x, y, p: Precision) -> np.ndarray:
    """Allowed absolute error of y = elu(x) + 1 = max(x, 0) + exp(min(x, 0)).

    x > 0: y = x + 1, one fp32 addition (u |y|). x <= 0: y = exp(x) in fp32, EXP_ULPS u |y|
    plus u |x| |y| (log2(e) scaling). ``F.elu(x) + 1`` in the input dtype (the control)
    rounds elu(x) = y - 1 to the dtype before adding 1 (exact by Sterbenz for y - 1 in
    [-1, -1/2]): u(dtype) |y - 1| for x < 0. Not covered: that absolute term hides the
    relative accuracy of tiny y (``feature_map_positive_finite`` checks they stay
    nonzero). Then the store p.store |y| and the floor.
    """
    x, y = (float64_on(t) for t in (x, y))
    xf = torch.where(torch.isfinite(x), x, 0.0)
    yf = torch.where(torch.isfinite(y), y, 0.0)
    exp_err = torch.where(xf <= 0, p.compute * (EXP_ULPS + xf.abs()) * yf, p.compute * yf)
    elu_round = torch.where(xf < 0, unit_roundoff(p.dtype) * (yf - 1.0).abs(), 0.0)
    return (SAFETY * (exp_err + elu_round) + p.store * yf.abs() + p.floor).cpu().numpy()


def elu_feature_map_grad(x, dy, dx, p: Precision) -> np.ndarray:
    """Allowed absolute error of dx = dy * (1 if x > 0 else exp(x)).

    exp(x) in fp32 as in the forward (EXP_ULPS u + u |x| relative), the product with dy
    (u), the store of dx, the floor. A kernel may save y = exp(x) (x <= 0) in the input
    dtype and scale it by dy (as torch's in-place elu backward does): one more rounding,
    p.store |dx| plus a floor times |dy|.
    """
    x, dy, dx = (float64_on(t) for t in (x, dy, dx))
    xf = torch.where(torch.isfinite(x), x, 0.0)
    dxf = torch.where(torch.isfinite(dx), dx, 0.0).abs()
    rel = torch.where(xf <= 0, p.compute * (EXP_ULPS + xf.abs() + 1), p.compute)
    stored_y = torch.where(xf <= 0, p.store * dxf + p.floor * dy.abs(), 0.0)
    return (SAFETY * rel * dxf + p.store * dxf + stored_y + p.floor).cpu().numpy()


def _misread(a: torch.Tensor) -> torch.Tensor:
    """How far a dot may read a non-negative fp32 operand ``a`` from its value, per element:
    all of it below fp32's smallest normal F (a GPU flushes subnormal operands), and the
    low part a - tf32(a) (at most 2^-11 a, itself subnormal, so flushed) of a "tf32x3"
    dot's operand below 2^11 F; above, the dot unit covers it. (Seen on an H200: q within
    2^4 F of fp32's normals, the state 1e37, o off by 1e-4 of itself, 3.6 x the old rule.)"""
    a = a.abs()
    return torch.where(a < DOT_READ_FLOOR, a, torch.where(a < 2.0**11 * DOT_READ_FLOOR, 2.0**-11 * a, 0.0))


def linear_attention(q, k, v, o, causal: bool, eps: float, p: Precision) -> np.ndarray:
    """Allowed absolute error of o_i = (q_i S_i) / (q_i . z_i + eps) (S_i, z_i over j <= i
    when causal, over all j otherwise), q, k >= 0 and v of any sign, per element.

    The state S = sum_j k_j v_j^T sums n_i terms (n_i = i + 1 causal, N otherwise) of
    mixed sign: its error is sum_error(n_i) times P = sum_j k_j |v_j|^T, not |S|; read
    with q_i (sum_error(D)) the numerator errs relative to M_i = q_i . P_i =
    sum_j (q_i . k_j) |v_j| (fp64, :func:`~tritoncheck.references.linear_attention.causal_state_reads`).
    Each product is a tl.dot's (``p.dot``, :func:`declared_dot`, plus DOT_READ_FLOOR
    times the other operand, and q's misread part ``_misread(q)`` read as M reads q); a chunked causal kernel goes through the scores (Q K^T,
    then A V): two dot units per term. The denominator d_i = q_i . z_i + eps has positive
    terms: (sum_error(n_i) + sum_error(D) + dot + u) relative. fp16/bf16 inputs and their
    products are exact in fp32; accumulation is fp32.

    Plain PyTorch (``torch.einsum`` / ``torch.cumsum`` in the input dtype, the control)
    accumulates in fp32 but stores each intermediate in the input dtype once (k_j v_j^T
    (causal), S_i, q_i S_i; z_i, q_i . z_i, d_i): 3 u(dtype) for the numerator and for the
    denominator, plus half a subnormal spacing fl each (fp16 q . z ~ eps = 1e-6 is
    subnormal): fl (|q_i|_1 (n_i + 1) + 1) and fl (|q_i|_1 + 2). A chunked kernel may round
    the scores A_ij to the input dtype before A V (fla's ``fused_chunk``, as
    FlashAttention rounds P; ``(q @ k^T).tril() @ v``): u(dtype) within the 3 u(dtype),
    plus fl per score times |v_j|: fl sum_{j <= i} |v_j| in the numerator. Not covered:
    a state accumulated in the input dtype (n_i roundings) for long n_i.

    The quotient: |o err| <= num_err / d + |o| den_err / d + u |o|; then SAFETY, the
    store of o and the floor.
    """
    q, k, v, o = (float64_on(a) for a in (q, k, v, o))
    N, D = q.shape[-2], q.shape[-1]
    va = v.abs()
    if causal:
        m_abs = causal_state_reads(q, k, va)
        z = torch.cumsum(k, dim=2)
        n = torch.arange(1, N + 1, dtype=torch.float64, device=q.device)[:, None]
    else:
        m_abs = q @ (k.transpose(-1, -2) @ va)
        z = k.sum(dim=2, keepdim=True).expand(k.shape)
        n = torch.tensor(float(max(N, 1)), dtype=torch.float64, device=q.device)
    den = ((q * z).sum(-1) + eps)[..., None]
    q1 = q.sum(dim=-1, keepdim=True)
    uc, ui, fl = p.compute, unit_roundoff(p.dtype), _la_half_subnormal(p.dtype)
    e_sum = sum_error(n, uc) + float(sum_error(D, uc))
    # operands misread by DOT_READ_FLOOR F: k v^T (or q k^T) products err by F (|v| + |k|)
    # over j, reading with q adds F (q1 + the read sums); 2: the causal kernel's two dots.
    # q itself misread by r(q) (below) errs by r(q) . P with P = sum_j k_j |v_j|^T, read
    # exactly as M is with q (|k_j|_1 may be far above 1: F (v1 + k1) does not bound it)
    v1 = torch.cumsum(va, dim=2) if causal else va.sum(dim=2, keepdim=True).expand(va.shape)
    k1 = z.sum(dim=-1, keepdim=True)
    rq = _misread(q)
    q_reads = causal_state_reads(rq, k, va) if causal else rq @ (k.transpose(-1, -2) @ va)
    reads = 2 * DOT_READ_FLOOR * (q1 + 1) * (v1 + k1 + 1) + 2 * q_reads
    num_err = (e_sum + 2 * p.dot + 3 * ui) * m_abs + fl * (q1 * (n + 1) + 1 + v1) + reads
    den_err = (e_sum + p.dot + uc + 3 * ui) * den + fl * (q1 + 2) + DOT_READ_FLOOR * (q1 + k1)
    oa = torch.where(torch.isfinite(o), o, 0.0).abs()
    err = num_err / den + oa * den_err / den + uc * oa
    return (SAFETY * err + p.store * oa + p.floor).cpu().numpy()
