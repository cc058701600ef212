"""fp64 references for the gated delta rule (flash-linear-attention's convention).

Shapes follow ``docs/contract.md``: ``q, k [B, T, H, K]``, ``v [B, T, H, V]``, ``g, beta
[B, T, H]``, the state ``[N, H, K, V]`` (N sequences: B, or ``len(cu_seqlens) - 1`` with
B = 1). The state is fla's ``h`` = S^T of the issue's ``S [V, K]``; per head, token by token::

    h'_t = exp(g_t) h_{t-1}                      (decay)
    u_t  = beta_t (v_t - h'_t^T k_t)             (the delta rule's pseudo-value, [V])
    h_t  = h'_t + k_t u_t^T                      (= exp(g_t) (I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T)
    o_t  = scale h_t^T q_t                       (scale None: K ** -0.5)

Three forms, cross-checked by the tests: the recurrence in NumPy (the definition), the
recurrence in PyTorch (differentiable: the gradients' reference), and the chunked form
in PyTorch (the same algebra a chunk at a time, through the triangular solve of the WY
representation; differentiable too), which the PyTorch reference takes for sequences
longer than ``RECURRENT_MAX`` tokens: a token loop of 2**17 steps on a GPU is minutes of
kernel launches, a chunk loop 2**11.
"""
from __future__ import annotations

import numpy as np
import torch

RECURRENT_MAX = 4096  # longer sequences: the chunked fp64 form
CHUNK = 64  # the chunked fp64 form's chunk


def sequences(n_batch: int, n_tokens: int, cu_seqlens) -> list[tuple[int, int, int]]:
    """(batch row, first token, end token) of every sequence, in state order."""
    if cu_seqlens is None:
        return [(b, 0, n_tokens) for b in range(n_batch)]
    cu = [int(c) for c in np.asarray(cu_seqlens.cpu() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def resolved_scale(scale, k_dim: int) -> float:
    return k_dim ** -0.5 if scale is None else float(scale)


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None):
    """The recurrence in fp64 NumPy: (o [B, T, H, V], final_state [N, H, K, V])."""
    q, k, v, g, beta = (np.asarray(a, dtype=np.float64) for a in (q, k, v, g, beta))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = resolved_scale(scale, K)
    seqs = sequences(B, T, cu_seqlens)
    o = np.zeros((B, T, H, V))
    final = np.zeros((len(seqs), H, K, V))
    for n, (b, start, end) in enumerate(seqs):
        h = np.zeros((H, K, V)) if initial_state is None else np.array(initial_state[n], dtype=np.float64)
        for t in range(start, end):
            h = h * np.exp(g[b, t])[:, None, None]
            u = beta[b, t][:, None] * (v[b, t] - np.einsum("hkv,hk->hv", h, k[b, t]))
            h = h + k[b, t][:, :, None] * u[:, None, :]
            o[b, t] = scale * np.einsum("hkv,hk->hv", h, q[b, t])
        final[n] = h
    return o, final


# --------------------------------------------------------------- fp64 PyTorch, on any device


def _recurrent_torch(q, k, v, g, beta, scale, h):
    """One sequence, [T, H, *]: the token loop. Returns (o [T, H, V], h)."""
    outs = []
    for t in range(q.shape[0]):
        h = h * torch.exp(g[t])[:, None, None]
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", h, k[t]))
        h = h + k[t][:, :, None] * u[:, None, :]
        outs.append(scale * torch.einsum("hkv,hk->hv", h, q[t]))
    return (torch.stack(outs) if outs else v.new_zeros(0, *v.shape[1:])), h


def chunk_forms(k, g, beta):
    """The WY pieces of one chunk, [n, H, *] inputs: the cumulative log decay G [H, n], the
    decay ratios R[h, i, j] = exp(G_i - G_j) for j <= i (0 above the diagonal) and
    T = (I + A)^{-1} with A_ij = beta_i (k_i . k_j) R_ij for j < i ([H, n, n])."""
    n = k.shape[0]
    G = torch.cumsum(g, dim=0).transpose(0, 1)  # [H, n]
    lower = torch.ones(n, n, dtype=torch.bool, device=k.device).tril()
    R = torch.where(lower, torch.exp((G[:, :, None] - G[:, None, :]).masked_fill(~lower, 0.0)), 0.0)
    kh = k.transpose(0, 1)  # [H, n, K]
    A = (beta.transpose(0, 1)[:, :, None] * (kh @ kh.transpose(1, 2)) * R).tril(-1)
    eye = torch.eye(n, dtype=k.dtype, device=k.device).expand_as(A)
    T = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
    return G, R, T


def _chunked_torch(q, k, v, g, beta, scale, h, chunk=CHUNK):
    """One sequence, [T, H, *]: the chunked form. Per chunk, with h_0 the state at its start,
    gamma_i = exp(G_i): (I + A) U = diag(beta) (V - diag(gamma) K h_0) gives the pseudo-values
    u_i; o_i = scale (gamma_i q_i^T h_0 + sum_{j <= i} (q_i . k_j) R_ij u_j); the state at the
    chunk's end is gamma_n h_0 + sum_j R_nj k_j u_j^T."""
    outs = []
    for s in range(0, q.shape[0], chunk):
        qc, kc, vc, gc, bc = (a[s:s + chunk] for a in (q, k, v, g, beta))
        G, R, T = chunk_forms(kc, gc, bc)
        gamma = torch.exp(G)  # [H, n]
        kh, qh, vh = kc.transpose(0, 1), qc.transpose(0, 1), vc.transpose(0, 1)
        rhs = bc.transpose(0, 1)[:, :, None] * (vh - gamma[:, :, None] * (kh @ h))
        U = T @ rhs  # [H, n, V]
        S = (qh @ kh.transpose(1, 2)) * R
        outs.append((scale * (gamma[:, :, None] * (qh @ h) + S @ U)).transpose(0, 1))
        h = gamma[:, -1, None, None] * h + (kh * R[:, -1, :, None]).transpose(1, 2) @ U
    return (torch.cat(outs) if outs else v.new_zeros(0, *v.shape[1:])), h


def gated_delta_rule_torch(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None):
    """PyTorch float64 :func:`gated_delta_rule` on the inputs' device, differentiable in
    every tensor argument: the recurrence, or the chunked form past RECURRENT_MAX tokens."""
    q, k, v, g, beta = (t.to(torch.float64) for t in (q, k, v, g, beta))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = resolved_scale(scale, K)
    o_rows, finals = [[] for _ in range(B)], []
    for n, (b, start, end) in enumerate(sequences(B, T, cu_seqlens)):
        h = q.new_zeros(H, K, V) if initial_state is None else initial_state[n].to(torch.float64)
        form = _recurrent_torch if end - start <= RECURRENT_MAX else _chunked_torch
        o_n, h = form(*(a[b, start:end] for a in (q, k, v, g, beta)), scale, h)
        o_rows[b].append(o_n)
        finals.append(h)
    o = torch.stack([torch.cat(r) if r else q.new_zeros(0, H, V) for r in o_rows]) if B else q.new_zeros(0, T, H, V)
    if cu_seqlens is not None and o.shape[1] != T:  # no sequence covers the tail (cannot happen for valid offsets)
        raise ValueError("cu_seqlens must end at T")
    final = torch.stack(finals) if finals else q.new_zeros(0, H, K, V)
    return o, final


def gated_delta_rule_chunked_torch(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None,
                                   chunk=CHUNK):
    """:func:`gated_delta_rule_torch` in the chunked form at every length (for the tests that
    check the two forms agree)."""
    q, k, v, g, beta = (t.to(torch.float64) for t in (q, k, v, g, beta))
    B, T, H, K = q.shape
    scale = resolved_scale(scale, K)
    o = q.new_zeros(B, T, H, v.shape[-1])
    finals = []
    for n, (b, start, end) in enumerate(sequences(B, T, cu_seqlens)):
        h = q.new_zeros(H, K, v.shape[-1]) if initial_state is None else initial_state[n].to(torch.float64)
        o_n, h = _chunked_torch(*(a[b, start:end] for a in (q, k, v, g, beta)), scale, h, chunk)
        o[b, start:end] = o_n
        finals.append(h)
    return o, torch.stack(finals)
