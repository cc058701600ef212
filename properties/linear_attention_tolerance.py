"""Tolerance rules of the linear-attention family: the ELU+1 feature map and linear attention.

The pieces (unit roundoff, sum bounds, floors, SAFETY and the other constants with
their sources) are in :mod:`properties.tolerance`."""
from __future__ import annotations

import numpy as np
import torch

from properties.tolerance import DOT_READ_FLOOR, EXP_ULPS, SAFETY, Precision, sum_error, unit_roundoff


def _la_half_subnormal(dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype``'s subnormals: the absolute error of rounding a
    value into its subnormal range (to nearest)."""
    info = torch.finfo(dtype)
    return float(info.tiny) * float(info.eps) / 2


def elu_feature_map(x: np.ndarray, y: np.ndarray, p: Precision) -> np.ndarray:
    """Allowed absolute error of y = elu(x) + 1 = max(x, 0) + exp(min(x, 0)).

    x > 0: y = x + 1, one fp32 addition (u |y|). x <= 0: y = exp(x) in fp32,
    EXP_ULPS u |y|, plus u |x| |y| from the log2(e) scaling of ex2.approx on the GPU.
    The contract writes y as elu(x) + 1, and ``F.elu(x) + 1`` in the input dtype, the
    way users write it (the control), rounds elu(x) = y - 1 to the dtype before adding
    1 (exact by Sterbenz for y - 1 in [-1, -1/2]): u(dtype) |y - 1| for x < 0. That term
    is an absolute error up to u(dtype) where y itself is tiny, so this rule does not
    see the relative accuracy of tiny outputs; the exact property
    ``feature_map_positive_finite`` checks that they do not collapse to 0. Then the
    store u(dtype) |y| (two units under the interpreter's truncating bf16 store) and
    the underflow floor.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(x)
        xf = np.where(finite, x, 0.0)
        yf = np.where(np.isfinite(y), y, 0.0)
        neg = xf <= 0
        exp_err = np.where(neg, p.compute * (EXP_ULPS + np.abs(xf)) * yf, p.compute * yf)
        elu_round = np.where(xf < 0, unit_roundoff(p.dtype) * np.abs(yf - 1.0), 0.0)
        return SAFETY * (exp_err + elu_round) + p.store * np.abs(yf) + p.floor


def elu_feature_map_grad(x: np.ndarray, dy: np.ndarray, dx: np.ndarray, p: Precision) -> np.ndarray:
    """Allowed absolute error of dx = dy * (1 if x > 0 else exp(x)).

    exp(x) in fp32 as in the forward (EXP_ULPS u + u |x|, relative), the product dy
    times it (u), the store of dx (u(dtype)); the floor for results near underflow.
    A kernel may instead save its output y = exp(x) (x <= 0) in the input dtype and
    scale it by dy in backward (torch's in-place elu backward reads its result the
    same way): y rounds once in that dtype (u(dtype) |dx| more, one floor into its
    subnormals scaled by |dy|), the old rule's one rounding would fail it.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        xf = np.where(np.isfinite(x), x, 0.0)
        dxf = np.abs(np.where(np.isfinite(dx), dx, 0.0))
        rel = np.where(xf <= 0, p.compute * (EXP_ULPS + np.abs(xf) + 1), p.compute)
        stored_y = np.where(xf <= 0, p.store * dxf + p.floor * np.abs(dy), 0.0)
        return SAFETY * rel * dxf + p.store * dxf + stored_y + p.floor


def _la_causal_abs_numerator(q: np.ndarray, k: np.ndarray, va: np.ndarray, block: int = 128) -> np.ndarray:
    """M_i = sum_{j <= i} (q_i . k_j) |v_j| = q_i . P_i with P_i = sum_{j <= i} k_j |v_j|^T,
    the prefix sums formed a block of positions at a time (memory B H block D Dv)."""
    B, H, N, _ = q.shape
    out = np.empty((B, H, N, va.shape[-1]))
    carry = np.zeros((B, H, q.shape[-1], va.shape[-1]))
    for n0 in range(0, N, block):
        sl = slice(n0, min(N, n0 + block))
        prefix = np.cumsum(np.einsum("bhnd,bhne->bhnde", k[:, :, sl], va[:, :, sl]), axis=2) + carry[:, :, None]
        out[:, :, sl] = np.einsum("bhnd,bhnde->bhne", q[:, :, sl], prefix)
        carry = prefix[:, :, -1]
    return out



def linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, causal: bool,
                     eps: float, p: Precision) -> np.ndarray:
    """Allowed absolute error of o_i = (q_i S_i) / (q_i . z_i + eps) (S_i, z_i over j <= i
    when causal, over all j otherwise), q, k >= 0 and v of any sign, per element.

    The state S = sum_j k_j v_j^T sums n_i terms (n_i = i + 1 causal, N otherwise) of
    mixed sign, so its rounding error is bounded by sum_error(n_i) times the sum of the
    terms' magnitudes, P = sum_j k_j |v_j|^T, not by |S|; reading it with q_i (a D-long
    sum, sum_error(D)) gives the numerator an error relative to
    M_i = q_i . P_i = sum_j (q_i . k_j) |v_j|, computed here in fp64 from the inputs.
    Each product is a tl.dot product (``p.dot``: u(fp32) under the interpreter, 2^-21
    for a kernel that declares "tf32x3" on CUDA, see :func:`declared_dot`, plus
    DOT_READ_FLOOR times the other operand near fp32's underflow); a chunked
    causal kernel forms (q_i . k_j) v_j through the scores (one dot each for Q K^T and
    A V), so two dot units per term. The denominator d_i = q_i . z_i + eps has only
    positive terms: (sum_error(n_i) + sum_error(D) + dot + u) relative. fp16/bf16
    inputs are exact in fp32, so their products are too; accumulation is fp32.

    The plain implementation (``torch.einsum`` / ``torch.cumsum`` in the input dtype,
    the control) accumulates in fp32 too (PyTorch's reductions and matmuls do) but
    stores each named intermediate in the input dtype once: the products k_j v_j^T
    (causal), S_i, q_i S_i; z_i, q_i . z_i, d_i. Each costs u(dtype) relative to the
    same absolute sums (3 u(dtype) for the numerator and for the denominator) plus
    half a subnormal spacing of the dtype, which matters in fp16 where q . z ~ eps =
    1e-6 is subnormal (spacing 6e-8): fl (|q_i|_1 (n_i + 1) + 1) for the numerator,
    fl (|q_i|_1 + 2) for the denominator. A kernel that accumulates the state in the
    input dtype (n_i roundings instead of one) is outside this rule for long n_i.

    A chunked kernel may instead round the scores A_ij = q_i . k_j to the input dtype
    before the A V dot (fla's ``fused_chunk``: ``b_s.to(b_q.dtype)``, as FlashAttention
    rounds P; ``(q @ k^T).tril() @ v`` in the input dtype does the same): u(dtype) |A_ij|
    relative, within the 3 u(dtype) above, plus half a subnormal spacing per score,
    multiplied by |v_j| in the sum: fl sum_{j <= i} |v_j| more in the numerator. Why the
    old rule was wrong: it charged the subnormal floor only to the control's
    intermediates (weighted by q or 1), never to a score that is multiplied by v; fla's
    fp16 kernel with q, k tiny (scores ~1e-8, subnormal in fp16) and eps = 1e-3 was off
    by 7e-5 where the rule allowed 6.6e-5 (plain PyTorch's error there 2.4e-5).

    The quotient: |o err| <= num_err / d + |o| den_err / d + u |o|; then SAFETY, the
    store of o (u(dtype) |o|) and the underflow floor.
    """
    q, k, v, o = (np.asarray(a, dtype=np.float64) for a in (q, k, v, o))
    N, D = q.shape[-2], q.shape[-1]
    va = np.abs(v)
    if causal:
        m_abs = _la_causal_abs_numerator(q, k, va)
        z = np.cumsum(k, axis=2)
        n = np.arange(1, N + 1, dtype=np.float64)[None, None, :, None]
    else:
        m_abs = np.einsum("bhnd,bhde->bhne", q, np.einsum("bhnd,bhne->bhde", k, va))
        z = np.broadcast_to(k.sum(axis=2, keepdims=True), k.shape)
        n = np.float64(max(N, 1))
    den = (np.einsum("bhnd,bhnd->bhn", q, z) + eps)[..., None]
    q1 = q.sum(axis=-1, keepdims=True)
    uc, ui, fl = p.compute, unit_roundoff(p.dtype), _la_half_subnormal(p.dtype)
    e_sum = sum_error(n, uc) + sum_error(D, uc)
    # operands misread by up to DOT_READ_FLOOR (see there): k v^T (or q k^T) products err
    # by F (|v| + |k|) summed over j, reading with q adds F (q1 + the read sums); the
    # factor 2 covers the causal kernel's two dots per term
    v1 = np.cumsum(va, axis=2) if causal else np.broadcast_to(va.sum(axis=2, keepdims=True), va.shape)
    k1 = z.sum(axis=-1, keepdims=True)
    reads = 2 * DOT_READ_FLOOR * (q1 + 1) * (v1 + k1 + 1)
    num_err = (e_sum + 2 * p.dot + 3 * ui) * m_abs + fl * (q1 * (n + 1) + 1 + v1) + reads
    den_err = (e_sum + p.dot + uc + 3 * ui) * den + fl * (q1 + 2) + DOT_READ_FLOOR * (q1 + k1)
    oa = np.abs(np.where(np.isfinite(o), o, 0.0))
    err = num_err / den + oa * den_err / den + uc * oa
    return SAFETY * err + p.store * oa + p.floor
