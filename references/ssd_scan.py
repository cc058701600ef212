"""fp64 references for Mamba-2's SSD scan (mamba_ssm's ``mamba_chunk_scan_combined`` convention).

Shapes follow ``docs/contract.md``: ``x [B, T, H, P]``, ``dt [B, T, H]``, ``A [H]``,
``B``, ``C [B, T, G, N]`` (head h reads group h // (H / G)), ``D``, ``dt_bias [H]``,
``z [B, T, H, P]``, the state ``[S, H, P, N]`` (S sequences: B, or ``len(cu_seqlens) - 1``
with B = 1). Per sequence and head, token by token::

    d_t = clamp(softplus?(dt_t + dt_bias), dt_min, dt_max)   (the effective step)
    h_t = exp(d_t A) h_{t-1} + d_t x_t B_t^T                  ([P, N])
    y_t = (h_t C_t + D x_t) * silu(z_t)                        (silu(z) = z sigmoid(z); no z: no gate)

Three forms, cross-checked by the tests: the recurrence in NumPy (the definition), the
recurrence in PyTorch (differentiable: the gradients' reference) and the chunked form in
PyTorch (the same sums a chunk at a time), which the PyTorch reference takes past
``RECURRENT_MAX`` tokens (a token loop of 2**17 steps on a GPU is minutes of launches).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tritoncheck.references.gated_delta_rule import sequences

__all__ = ["sequences", "effective_dt", "ssd_scan", "ssd_scan_torch", "ssd_scan_chunked_torch", "scan_from_steps"]

RECURRENT_MAX = 4096  # longer sequences: the chunked fp64 form
CHUNK = 64  # the chunked fp64 form's chunk


def group_of_heads(n_heads: int, n_groups: int) -> np.ndarray:
    """The group each head reads B and C from: h // (H / G) (mamba_ssm's mapping)."""
    return np.arange(n_heads) // (n_heads // n_groups)


def effective_dt(dt, dt_bias=None, dt_softplus=False, dt_min=0.0, dt_max=math.inf):
    """d = clamp(softplus?(dt + dt_bias), dt_min, dt_max), in fp64 (NumPy array or tensor:
    the result is of the same kind; the tensor form is differentiable, with torch.clamp's
    subgradient: 1 on the closed interval [dt_min, dt_max], as mamba_ssm's backward)."""
    if isinstance(dt, torch.Tensor):
        d = dt.to(torch.float64)
        if dt_bias is not None:
            d = d + dt_bias.to(torch.float64)
        if dt_softplus:
            d = torch.logaddexp(torch.zeros_like(d), d)
        return torch.clamp(d, min=float(dt_min), max=float(dt_max))
    d = np.asarray(dt, dtype=np.float64)
    if dt_bias is not None:
        d = d + np.asarray(dt_bias, dtype=np.float64)
    if dt_softplus:
        d = np.logaddexp(0.0, d)
    return np.clip(d, float(dt_min), float(dt_max))


def silu(z):
    """z sigmoid(z), accurate in its tails (NumPy or torch): sigmoid(z) = e / (1 + e) with
    e = exp(-|z|) <= 1 for z < 0 (no overflow, no cancellation as in 1 + tanh(z / 2))."""
    if isinstance(z, torch.Tensor):
        return z * torch.sigmoid(z)
    e = np.exp(-np.abs(z))
    return z * np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def ssd_scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0, dt_max=math.inf,
             initial_state=None, cu_seqlens=None):
    """The recurrence in fp64 NumPy: (y [B, T, H, P], final_state [S, H, P, N])."""
    x, A, B, C = (np.asarray(a, dtype=np.float64) for a in (x, A, B, C))
    n_batch, n_tok, H, P = x.shape
    N = B.shape[-1]
    heads = group_of_heads(H, B.shape[2])
    d = effective_dt(dt, dt_bias, dt_softplus, dt_min, dt_max)
    skip = np.zeros(H) if D is None else np.asarray(D, dtype=np.float64)
    seqs = sequences(n_batch, n_tok, cu_seqlens)
    y = np.zeros((n_batch, n_tok, H, P))
    final = np.zeros((len(seqs), H, P, N))
    for n, (b, start, end) in enumerate(seqs):
        h = np.zeros((H, P, N)) if initial_state is None else np.array(initial_state[n], dtype=np.float64)
        for t in range(start, end):
            bt, ct = B[b, t][heads], C[b, t][heads]  # [H, N]
            h = np.exp(d[b, t] * A)[:, None, None] * h + (d[b, t][:, None] * x[b, t])[:, :, None] * bt[:, None, :]
            y[b, t] = np.einsum("hpn,hn->hp", h, ct) + skip[:, None] * x[b, t]
        final[n] = h
    if z is not None:
        y = y * silu(np.asarray(z, dtype=np.float64))
    return y, final


# --------------------------------------------------------------- fp64 PyTorch, on any device


def _recurrent_torch(x, d, a, B, C, h):
    """One sequence, [T, H, *] (B, C per head; a = d A the log decays): the token loop,
    without D and z. (C h per token, h)."""
    outs = []
    for t in range(x.shape[0]):
        h = torch.exp(a[t])[:, None, None] * h + (d[t][:, None] * x[t])[:, :, None] * B[t][:, None, :]
        outs.append(torch.einsum("hpn,hn->hp", h, C[t]))
    return (torch.stack(outs) if outs else x.new_zeros(0, *x.shape[1:])), h


def _chunked_torch(x, d, a, B, C, h, chunk=CHUNK):
    """One sequence, [T, H, *]: the chunked form. Per chunk, with h_0 its start state, G the
    cumulative log decay d_i A and R_ij = exp(G_i - G_j) (j <= i):
    y_i = exp(G_i) h_0 C_i + sum_{j <= i} R_ij d_j (C_i . B_j) x_j and the state at the
    chunk's end exp(G_n) h_0 + sum_j R_nj d_j x_j B_j^T."""
    outs = []
    for s in range(0, x.shape[0], chunk):
        xc, dc, ac, bc, cc = (t[s:s + chunk].transpose(0, 1) for t in (x, d, a, B, C))  # [H, n, *]
        n = xc.shape[1]
        G = torch.cumsum(ac, dim=1)  # [H, n]
        lower = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        R = torch.where(lower, torch.exp((G[:, :, None] - G[:, None, :]).masked_fill(~lower, 0.0)), 0.0)
        L = (cc @ bc.transpose(1, 2)) * R * dc[:, None, :]
        outs.append((torch.exp(G)[:, :, None] * (cc @ h.transpose(1, 2)) + L @ xc).transpose(0, 1))
        w = R[:, -1, :] * dc  # [H, n]: each write decayed to the chunk's end
        h = torch.exp(G[:, -1])[:, None, None] * h + (xc * w[:, :, None]).transpose(1, 2) @ bc
    return (torch.cat(outs) if outs else x.new_zeros(0, *x.shape[1:])), h


def scan_from_steps(x, d, a, B, C, initial_state=None, cu_seqlens=None, form=None):
    """The scan's core in fp64 from the steps d (the writes' weights) and the log decays a
    ([B, T, H] each, a = d A in the op; apart, each has its own gradient): (s [B, T, H, P]
    with s_t = C_t h_t, the final states). ``form(length)``: the per-sequence form (default:
    the recurrence up to RECURRENT_MAX tokens, the chunked form past it)."""
    form = form or (lambda n: _recurrent_torch if n <= RECURRENT_MAX else _chunked_torch)
    x, B, C = (t.to(torch.float64) for t in (x, B, C))
    n_batch, n_tok, H, P = x.shape
    N = B.shape[-1]
    heads = torch.as_tensor(group_of_heads(H, B.shape[2]), device=x.device)
    B, C = B[:, :, heads], C[:, :, heads]  # [B, T, H, N]
    rows, finals = [[] for _ in range(n_batch)], []
    for n, (b, start, end) in enumerate(sequences(n_batch, n_tok, cu_seqlens)):
        h = x.new_zeros(H, P, N) if initial_state is None else initial_state[n].to(torch.float64)
        s_n, h = form(end - start)(x[b, start:end], d[b, start:end], a[b, start:end], B[b, start:end],
                                   C[b, start:end], h)
        rows[b].append(s_n)
        finals.append(h)
    s = torch.stack([torch.cat(r) if r else x.new_zeros(0, H, P) for r in rows]) if n_batch \
        else x.new_zeros(0, n_tok, H, P)
    if s.shape[1] != n_tok:
        raise ValueError("cu_seqlens must end at T")
    return s, (torch.stack(finals) if finals else x.new_zeros(0, H, P, N))


def _torch_scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens, form):
    x = x.to(torch.float64)
    d = effective_dt(dt, dt_bias, dt_softplus, dt_min, dt_max)
    y, final = scan_from_steps(x, d, d * A.to(torch.float64), B, C, initial_state, cu_seqlens, form)
    if D is not None:
        y = y + D.to(torch.float64)[:, None] * x
    if z is not None:
        y = y * silu(z.to(torch.float64))
    return y, final


def ssd_scan_torch(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0, dt_max=math.inf,
                   initial_state=None, cu_seqlens=None):
    """PyTorch float64 :func:`ssd_scan` on the inputs' device, differentiable in every tensor
    argument: the recurrence, or the chunked form past RECURRENT_MAX tokens."""
    return _torch_scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens,
                       lambda n: _recurrent_torch if n <= RECURRENT_MAX else _chunked_torch)


def ssd_scan_chunked_torch(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0,
                           dt_max=math.inf, initial_state=None, cu_seqlens=None, chunk=CHUNK):
    """:func:`ssd_scan_torch` in the chunked form at every length."""
    return _torch_scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens,
                       lambda n: lambda *a: _chunked_torch(*a, chunk=chunk))
