"""Tolerance rules of the linear-attention family: the ELU+1 feature map and linear attention.

The pieces (unit roundoff, sum bounds, floors, SAFETY and the other constants with
their sources) are in :mod:`tritoncheck.tolerance`. The rules are evaluated in float64
torch on the suite's device (the GPU when there is one); arguments may be NumPy arrays
or tensors, results are NumPy."""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.references.linear_attention import causal_state_reads
from tritoncheck.tolerance import DOT_READ_FLOOR, EXP_ULPS, SAFETY, Precision, float64_on, sum_error, unit_roundoff


def _la_half_subnormal(dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype``'s subnormals: the absolute error of rounding a
    value into its subnormal range (to nearest)."""
    info = torch.finfo(dtype)
    return float(info.tiny) * float(info.eps) / 2


def elu_feature_map(x, y, p: Precision) -> np.ndarray:
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
    x, y = (float64_on(t) for t in (x, y))
    xf = torch.where(torch.isfinite(x), x, 0.0)
    yf = torch.where(torch.isfinite(y), y, 0.0)
    exp_err = torch.where(xf <= 0, p.compute * (EXP_ULPS + xf.abs()) * yf, p.compute * yf)
    elu_round = torch.where(xf < 0, unit_roundoff(p.dtype) * (yf - 1.0).abs(), 0.0)
    return (SAFETY * (exp_err + elu_round) + p.store * yf.abs() + p.floor).cpu().numpy()


def elu_feature_map_grad(x, dy, dx, p: Precision) -> np.ndarray:
    """Allowed absolute error of dx = dy * (1 if x > 0 else exp(x)).

    exp(x) in fp32 as in the forward (EXP_ULPS u + u |x|, relative), the product dy
    times it (u), the store of dx (u(dtype)); the floor for results near underflow.
    A kernel may instead save its output y = exp(x) (x <= 0) in the input dtype and
    scale it by dy in backward (torch's in-place elu backward reads its result the
    same way): y rounds once in that dtype (u(dtype) |dx| more, one floor into its
    subnormals scaled by |dy|), the old rule's one rounding would fail it.
    """
    x, dy, dx = (float64_on(t) for t in (x, dy, dx))
    xf = torch.where(torch.isfinite(x), x, 0.0)
    dxf = torch.where(torch.isfinite(dx), dx, 0.0).abs()
    rel = torch.where(xf <= 0, p.compute * (EXP_ULPS + xf.abs() + 1), p.compute)
    stored_y = torch.where(xf <= 0, p.store * dxf + p.floor * dy.abs(), 0.0)
    return (SAFETY * rel * dxf + p.store * dxf + stored_y + p.floor).cpu().numpy()


def linear_attention(q, k, v, o, causal: bool, eps: float, p: Precision) -> np.ndarray:
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

    Evaluated in float64 torch on the suite's device (the GPU when there is one): the
    causal M_i is an N D Dv computation (:func:`tritoncheck.references.linear_attention.causal_state_reads`).
    Arguments may be NumPy arrays or tensors; the result is NumPy.
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
    # operands misread by up to DOT_READ_FLOOR (see there): k v^T (or q k^T) products err
    # by F (|v| + |k|) summed over j, reading with q adds F (q1 + the read sums); the
    # factor 2 covers the causal kernel's two dots per term
    v1 = torch.cumsum(va, dim=2) if causal else va.sum(dim=2, keepdim=True).expand(va.shape)
    k1 = z.sum(dim=-1, keepdim=True)
    reads = 2 * DOT_READ_FLOOR * (q1 + 1) * (v1 + k1 + 1)
    num_err = (e_sum + 2 * p.dot + 3 * ui) * m_abs + fl * (q1 * (n + 1) + 1 + v1) + reads
    den_err = (e_sum + p.dot + uc + 3 * ui) * den + fl * (q1 + 2) + DOT_READ_FLOOR * (q1 + k1)
    oa = torch.where(torch.isfinite(o), o, 0.0).abs()
    err = num_err / den + oa * den_err / den + uc * oa
    return (SAFETY * err + p.store * oa + p.floor).cpu().numpy()
