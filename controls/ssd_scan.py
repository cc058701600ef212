"""Plain-PyTorch SSD scans, as a user would write them: controls the suite must pass.

* :func:`torch_ssd_scan_recurrent`: the token loop with the state in fp32 (mamba_ssm's
  ``selective_state_update`` keeps it so), the write d x B^T from the inputs in fp32, and
  each token's output in the input dtype: C h rounded, D x and the sum in the input dtype,
  times silu(z) in the input dtype.
* :func:`torch_ssd_scan_chunked`: Mamba-2's chunked form a chunk at a time (the paper's
  ``ssd_minimal`` algebra), the products (C B^T, the scores times X, C times the chunk's
  start state, X^T diag(w) B) as ``torch`` matmuls in the input dtype (fp32 accumulation,
  results rounded to it), the step, its cumulative sums and exps in fp32, and the carried
  state in fp32. It declares ``chunk_sizes``, so the chunk-size check has a second
  implementation.
"""
from __future__ import annotations

import math

import torch

from tritoncheck.declarations import ExpectedFailure
from tritoncheck.references.ssd_scan import group_of_heads, sequences

_CHUNKS = (16, 32, 64)


def _step(dt, dt_bias, dt_softplus, dt_min, dt_max) -> torch.Tensor:
    v = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
    if dt_softplus:
        v = torch.nn.functional.softplus(v)
    return torch.clamp(v, min=dt_min, max=dt_max)


def _per_head(x, B, C):
    heads = torch.as_tensor(group_of_heads(x.shape[2], B.shape[2]), device=x.device)
    return B[:, :, heads], C[:, :, heads]


def _output(s, x, D, z, dtype):
    """(s + D x) silu(z) in the input dtype, s the fp32 C h."""
    y = s.to(dtype)
    if D is not None:
        y = y + D.to(dtype)[:, None] * x
    return y if z is None else y * torch.nn.functional.silu(z)


def _state(initial_state, n, shape, device):
    return initial_state[n].float().clone() if initial_state is not None else torch.zeros(shape, device=device)


def torch_ssd_scan_recurrent(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0,
                             dt_max=math.inf, initial_state=None, cu_seqlens=None):
    """The recurrence token by token, fp32 state, each output in the input dtype."""
    n_batch, n_tok, H, P = x.shape
    N = B.shape[-1]
    d = _step(dt, dt_bias, dt_softplus, dt_min, dt_max)
    Bh, Ch = _per_head(x, B, C)
    y = torch.empty_like(x)
    finals = []
    for n, (b, s, e) in enumerate(sequences(n_batch, n_tok, cu_seqlens)):
        h = _state(initial_state, n, (H, P, N), x.device)
        for t in range(s, e):
            h = torch.exp(d[b, t] * A.float())[:, None, None] * h \
                + (d[b, t][:, None] * x[b, t].float())[:, :, None] * Bh[b, t].float()[:, None, :]
            y[b, t] = _output(torch.einsum("hpn,hn->hp", h, Ch[b, t].float()), x[b, t], D, None if z is None
                              else z[b, t], x.dtype)
        finals.append(h)
    return y, (torch.stack(finals) if finals else torch.zeros(0, H, P, N, device=x.device))


def torch_ssd_scan_chunked(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0,
                           dt_max=math.inf, initial_state=None, cu_seqlens=None, chunk_size=64):
    """The chunked form (module docstring), ``chunk_size`` tokens a chunk."""
    n_batch, n_tok, H, P = x.shape
    N = B.shape[-1]
    dt_ = x.dtype
    d = _step(dt, dt_bias, dt_softplus, dt_min, dt_max)
    Bh, Ch = _per_head(x, B, C)
    s_all = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    finals = []
    for n, (b, s, e) in enumerate(sequences(n_batch, n_tok, cu_seqlens)):
        h = _state(initial_state, n, (H, P, N), x.device)
        for c in range(s, e, chunk_size):
            sl = slice(c, min(e, c + chunk_size))
            xc, bc, cc = (t[b, sl].transpose(0, 1) for t in (x, Bh, Ch))  # [H, n, *] in the input dtype
            dc = d[b, sl].transpose(0, 1)  # [H, n] fp32
            cum = torch.cumsum(dc * A.float()[:, None], dim=1)
            lower = torch.ones(cum.shape[1], cum.shape[1], dtype=torch.bool, device=x.device).tril()
            ratio = torch.where(lower, torch.exp((cum[:, :, None] - cum[:, None, :]).masked_fill(~lower, 0.0)), 0.0)
            scores = ((cc @ bc.transpose(1, 2)).float() * ratio * dc[:, None, :]).to(dt_)
            gamma = torch.exp(cum)
            out = gamma[:, :, None] * (cc @ h.to(dt_).transpose(1, 2)).float() + (scores @ xc).float()
            s_all[b, sl] = out.transpose(0, 1)
            w = torch.exp(cum[:, -1:] - cum) * dc  # [H, n]
            h = gamma[:, -1, None, None] * h + ((xc.float() * w[:, :, None]).to(dt_).transpose(1, 2) @ bc).float()
        finals.append(h)
    y = torch.empty_like(x)
    for b in range(n_batch):
        y[b] = _output(s_all[b], x[b], D, None if z is None else z[b], dt_)
    return y, (torch.stack(finals) if finals else torch.zeros(0, H, P, N, device=x.device))


torch_ssd_scan_chunked.chunk_sizes = _CHUNKS
# Plain PyTorch: the Triton interpreter's limits do not apply; autograd through the loops is their backward.
torch_ssd_scan_recurrent.uses_triton = torch_ssd_scan_chunked.uses_triton = False

# Registry data: seen on the CPU (interpreter run of the self-test) and on an H200, not yet
# derived, so not strict: the rules of properties/ssd_scan_tolerance.py miss a term in each
# (PyTorch's own result is off by as much as the control in the first two).
torch_ssd_scan_recurrent.expected_failures = (
    ExpectedFailure("calls_independent", (
        "float32, x and B near fp32's largest value: y at -2.5e-9 off by 7.6e-13 against 3.9e-13 allowed "
        "(1.95x), and on the GPU -4.1e-10 flushed to -0: the rule for y misses the fp32 cancellation "
        "and flush of products near the range's ends"), dtypes=("float32",), strict=False),
    ExpectedFailure("gradients_match_reference", (
        "float16 and bfloat16: dC off by 55x its allowance with C tiny and x at 65504 (PyTorch's own "
        "result equally off): the gradient rules miss the input-dtype roundings of the recurrence's "
        "products"), dtypes=("float16", "bfloat16"), strict=False),
    ExpectedFailure("zero_step_holds_state", "bfloat16 on CUDA: y at -1.4e-38 flushed to -0 (1.13x the floor)",
                    dtypes=("bfloat16",), backends=("cuda",), strict=False),
    ExpectedFailure("zero_input_decays_initial_state", "bfloat16 on CUDA: seen once, not yet analysed",
                    dtypes=("bfloat16",), backends=("cuda",), strict=False),
)
torch_ssd_scan_chunked.expected_failures = (
    ExpectedFailure("gradients_match_reference", (
        "dB off by 5.7x its allowance in float16 (C at an offset of 1000, z near fp16's largest value) "
        "and dinitial_state by 12x in float32 on CUDA: the chunked form's input-dtype roundings of the "
        "decayed products are not in the gradient rules"), strict=False),
)
