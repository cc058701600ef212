"""Tolerance rules of paged_decode_attention: the dense causal rule per sequence, and the
split-K merge's allowance.

Unsplit (num_splits None or 1). Sequence b's T query rows are the last T rows of the dense
causal op on its gathered tokens, so their allowance is ``rules.attention`` of that
problem (q[b]'s T rows, causal, bottom-right aligned: row t sees n - T + 1 + t keys),
imported from attention_tolerance, not restated. An empty sequence, and a row that sees no
key, is exactly 0.

Split-K (num_splits = S > 1; the contract's chunks: L = cdiv(n, S) keys each). Row r of
sequence b sees part of each chunk c (the whole chunk, a prefix of it, or none): call it
the partial problem c, with exact (o*_c, lse*_c), exact weight w*_c = e^{lse*_c - lse*}
(lse* = logsumexp_c lse*_c; sum_c w*_c = 1) and o* = sum_c w*_c o*_c. The implementation
computes each partial as the dense op computes a row, so within the dense rule's (a_o_c,
a_lse_c) of the partial problem, then (in float32, unit u = p.compute) stores lse_c,
subtracts m = max_c lse_c, takes exp (or exp2), sums the S weights, sums the S products
w_c o_c and divides, and stores o in the dtype. Bounds, as ``split_kv_merge``'s
(properties/attention.py), in log space:

- the exponent of weight c errs by eps_c = e_c + u (|lse*_c - max_k lse*_k| + 2 E0
  + EXP_ULPS), where e_c = a_lse_c + u (|lse*_c| + a_lse_c) is the partial lse's own
  error and its float32 rounding (E0 = max_c e_c), the second term the subtraction's
  rounding (|lse_c - m| <= |lse*_c - max lse*| + 2 E0; m itself cancels between the
  numerator and the normaliser), the third exp's;
- the normaliser's log then errs by at most E = max_c eps_c, so the normalised weight lies
  in [w*_c e^{-(eps_c + E)}, min(1, w*_c e^{eps_c + E})]: dw_c is the larger distance
  from w*_c to an end (exactly, not to first order). A GPU's exp2 flushes results below
  tiny(fp32) to 0: dw_c gains tiny(fp32) (the largest weight is about 1);
- both weight vectors sum to 1, so they move the merge by sum_c dw_c |o_c - o*| <=
  sum_c dw_c (|o*_c - o*| + a_o_c); the partials' own errors add sum_c w*_c a_o_c;
- the S-term sums, the products and the division: relative (2 S + 2) u of
  sum_c w_c |o_c| <= sum_c min(1, w*_c e^{eps_c + E}) (|o*_c| + a_o_c) =: V; the store in
  the dtype p.store (1 + that) V; a subnormal store p's floor.

The rounding terms carry SAFETY, as the dense rule's do. A split result is within this
allowance of o*; the unsplit result within the dense rule's (``split_k_equals_unsplit``
adds the two).
"""
from __future__ import annotations

import numpy as np
import torch

from tritoncheck.properties import attention_tolerance as rules
from tritoncheck.properties.attention import _block_calls
from tritoncheck.properties.attention_arguments import NO_WINDOW, _resolved_scale
from tritoncheck.references import attention as dense
from tritoncheck.references import paged_decode_attention as ref
from tritoncheck.tolerance import EXP_ULPS, SAFETY, Precision

_TINY32 = float(torch.finfo(torch.float32).tiny)


def _as_bhnd(t: np.ndarray) -> np.ndarray:
    """[N, H, D] (a sequence's rows or keys) as the dense op's [1, H, N, D]."""
    return np.swapaxes(t, 0, 1)[None]


def _from_bhnd(t: np.ndarray) -> np.ndarray:
    """The dense op's [1, H, N, ...] back to [N, H, ...]."""
    return np.swapaxes(t[0], 0, 1)


def sequence_allowance(q_b, k_b, v_b, o_b, scale: float, p: Precision) -> np.ndarray:
    """The dense causal rule for one sequence's rows q_b [T, H, D] over its gathered keys
    and values [n, Hkv, D] (n >= 1), given their exact o_b [T, H, D]: [T, H, D]."""
    # the rule's o allowance does not read lse (its lse allowance, unused here, does)
    lse = np.zeros((1, q_b.shape[1], q_b.shape[0]))
    a_o, _ = rules.attention(_as_bhnd(q_b), _as_bhnd(k_b), _as_bhnd(v_b), _as_bhnd(o_b), lse, True, scale, p)
    return _from_bhnd(a_o)


def chunk_edges(n: int, splits: int) -> list[tuple[int, int]]:
    """The contract's chunks of n keys for ``splits``: [c L, min((c + 1) L, n)), L = cdiv(n, S),
    the empty ones left out (no row sees a key of them: weight 0)."""
    size = -(-n // splits)
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def _partials(q_b, k_b, v_b, scale: float, p: Precision, splits: int) -> list[tuple]:
    """Per chunk, every row's (o*_c [T, H, D], lse*_c [T, H], a_o_c, a_lse_c) over the part
    of the chunk it sees (:func:`_block_calls` of the dense family: rows that see a prefix
    form a bottom-right causal call, rows that see it all a plain call), lse*_c = -inf and
    allowances 0 for a row that sees none of it."""
    queries, n = q_b.shape[0], k_b.shape[0]
    parts = []
    for lo, hi in chunk_edges(n, splits):
        o = np.zeros(q_b.shape)
        lse = np.full(q_b.shape[:2], -np.inf)
        a_o, a_lse = np.zeros_like(o), np.zeros_like(lse)
        for rows, causal, _ in _block_calls(queries, n, lo, hi, True, NO_WINDOW):
            if rows.stop <= rows.start:
                continue
            q, k, v = _as_bhnd(q_b[rows]), _as_bhnd(k_b[lo:hi]), _as_bhnd(v_b[lo:hi])
            o_c, lse_c = dense.attention(q, k, v, causal, scale)
            a_o_c, a_lse_c = rules.attention(q, k, v, o_c, lse_c, causal, scale, p)
            o[rows], lse[rows], a_o[rows], a_lse[rows] = (_from_bhnd(o_c), lse_c[0].T, _from_bhnd(a_o_c),
                                                          a_lse_c[0].T)
        parts.append((o, lse, a_o, a_lse))
    return parts


def split_allowance(q_b, k_b, v_b, o_b, scale: float, p: Precision, splits: int) -> np.ndarray:
    """The split-K merge's allowance for one sequence (module docstring), [T, H, D]."""
    parts = _partials(q_b, k_b, v_b, scale, p, splits)
    u = p.compute  # the merge's float32 (u(fp64) for the reference's own noise)
    lses = np.stack([lse for _, lse, _, _ in parts])  # [chunks, T, H]
    seen = ~np.isneginf(lses)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lse = np.logaddexp.reduce(lses, axis=0)
        top = np.max(lses, axis=0)
        a_lse = np.stack([a for _, _, _, a in parts])
        e = np.where(seen, a_lse + SAFETY * u * (np.abs(lses) + a_lse), 0.0)
        e0 = e.max(axis=0)
        eps = np.where(seen, e + SAFETY * u * (np.abs(lses - top) + 2 * e0 + EXP_ULPS), 0.0)
        big_e = eps.max(axis=0)
        gap = np.where(seen, lses - lse, -np.inf)
        w = np.exp(gap)  # 0 where unseen
        w_hi = np.minimum(1.0, np.exp(np.minimum(gap + eps + big_e, 0.0)))
        dw = np.where(seen, np.maximum(w_hi - w, -w * np.expm1(-(eps + big_e))) + _TINY32, 0.0)
    o_c = np.stack([o for o, _, _, _ in parts])
    a_o = np.stack([a for _, _, a, _ in parts])
    w, dw, w_hi = (x[..., None] for x in (w, dw, w_hi))
    partials = (w * a_o).sum(0)
    weights = (dw * (np.abs(o_c - o_b) + a_o)).sum(0)
    mass = (w_hi * (np.abs(o_c) + a_o)).sum(0)
    gamma = (2 * len(parts) + 2) * u
    allowed = partials + weights + SAFETY * gamma * mass + p.store * (1 + SAFETY * gamma) * mass \
        + rules.attention_floor(p)
    sees = seen.any(axis=0)[..., None]
    return np.where(sees, allowed, 0.0)


def paged_decode_tolerance(case, inputs64, expected, p):
    """Each sequence by :func:`sequence_allowance`, or by :func:`split_allowance` where the
    case splits the keys (num_splits > 1); an empty sequence is exact."""
    o = expected["o"]
    rows_o = ref.query_rows(o)
    allowed = np.zeros(rows_o.shape)
    q, table, lens = ref.query_rows(inputs64["q"]), inputs64["block_table"], inputs64["seq_lens"]
    scale = _resolved_scale(case.params["sm_scale"], case.tensors["q"].shape[-1])
    splits = case.params.get("num_splits") or 1
    for b in range(q.shape[0]):
        if lens[b] == 0:
            continue
        k, v = (ref.gathered(inputs64[c], table, lens, b) for c in ("k_cache", "v_cache"))
        allowed[b] = sequence_allowance(q[b], k, v, rows_o[b], scale, p) if splits == 1 else \
            split_allowance(q[b], k, v, rows_o[b], scale, p, splits)
    return {"o": allowed.reshape(o.shape)}
