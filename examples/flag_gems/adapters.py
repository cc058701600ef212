"""FlagGems's varlen / paged flash attention behind the tritoncheck contract
(docs/third-party/flag_gems.md).

    PYTHONPATH=examples/flag_gems python -m pytest tests/test_checks.py \\
        --impl varlen_attention=adapters:varlen_attention \\
        --impl paged_decode_attention=adapters:paged_decode_attention

FlagGems 5.0.2 (``flag_gems``, the Triton backend vLLM can run on): both ops call
``flag_gems.ops.attention.flash_attn_varlen_func`` (flash-attention 2's varlen interface,
forward only; Triton kernel ``flash_varlen_fwd_kernel``) as vLLM's flash-attention backend
calls it: packed prefill with ``cu_seqlens_k``, decode with a paged cache (``block_table``,
``seqused_k``). The adapters only compute what that interface takes besides the contract's
arguments (``max_seqlen_q``, ``max_seqlen_k``, decode's ``cu_seqlens_q``) and translate one
convention: FlagGems returns lse = +inf for a row that sees no key (flash-attention's), the
contract -inf. Everything else FlagGems does not accept is declared below, not adapted:

- dtypes float16 and bfloat16 (``mha_varlan_fwd`` asserts them: no float32);
- no backward (``supports_backward = False``: the gradient checks are not applicable);
- head dim a multiple of 8 up to 256 (its asserts; refused here with a ValueError so that
  it reads as a refusal, not an AssertionError), and at least 16 (declared: D = 8 passes
  its check but its ``tl.dot`` needs K >= 16; finding 4, shown by ``probe.py``);
- k and v of one stride (``assert k.stride() == v.stride()``): the nearest declarable
  limit is both contiguous (caches too: finding 6, the page stride, is ``probe.py``'s).

``TRITONCHECK_FLAG_GEMS_STANDIN=1`` swaps in ``standin.py`` (plain PyTorch, the function's
documented semantics) for ``flash_attn_varlen_func``, to check this plumbing on a CPU, where
FlagGems cannot import (README.md, "On CPU"); it is never set on the GPU.
"""
from __future__ import annotations

import os

import torch

if os.environ.get("TRITONCHECK_FLAG_GEMS_STANDIN") == "1":
    from standin import flash_attn_varlen_func
else:
    from flag_gems.ops.attention import flash_attn_varlen_func

MAX_HEAD_DIM = 256  # mha_varlan_fwd: head_size <= 256 and head_size % 8 == 0


def _refuse_head_dim(d: int) -> None:
    if d % 8 or d > MAX_HEAD_DIM:
        raise ValueError(f"FlagGems's flash_attn_varlen_func takes a head dim that is a multiple of 8 up to "
                         f"{MAX_HEAD_DIM}: the last dim of 'q' is {d}")


def _longest(cu_seqlens: torch.Tensor) -> int:
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None, window=(-1, -1),
                     softcap=0.0):
    _refuse_head_dim(q.shape[-1])
    o, lse = flash_attn_varlen_func(q, k, v, _longest(cu_seqlens_q), cu_seqlens_q, _longest(cu_seqlens_k),
                                    cu_seqlens_k=cu_seqlens_k, softmax_scale=sm_scale, causal=causal,
                                    window_size=window, softcap=softcap, return_softmax_lse=True)
    # a row that sees no key: FlagGems's lse is +inf (flash-attention's convention), the contract's
    # -inf (the log of an empty sum); a row that sees a key has a finite lse, so only those change
    return o, lse.masked_fill(lse == float("inf"), float("-inf"))


def varlen_attention_unwindowed(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None,
                                window=(-1, -1), softcap=0.0):
    """varlen_attention under a declared window (-1, -1) only: the run that looks past the
    window findings (1-3) at everything else."""
    return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, sm_scale, window, softcap)


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
    """T query tokens per sequence (q [B, T, H, D]; [B, H, D] is T = 1) against the paged
    cache, as vLLM decodes (T > 1: speculative tokens): the B x T queries packed with
    cu_seqlens_q 0, T, .., B T and max_seqlen_q T; causal, whose bottom-right alignment is
    the contract's (query t sees keys j < n - T + 1 + t); max_seqlen_k the longest sequence."""
    _refuse_head_dim(q.shape[-1])
    batch, tokens = q.shape[0], (q.shape[1] if q.dim() == 4 else 1)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device) * tokens
    o = flash_attn_varlen_func(q.reshape(batch * tokens, *q.shape[-2:]), k_cache, v_cache, tokens, cu_seqlens_q,
                               int(seq_lens.max()), seqused_k=seq_lens, softmax_scale=sm_scale, causal=True,
                               block_table=block_table)
    return o.reshape(q.shape)


_HEAD_DIM_REFUSAL = "takes a head dim that is a multiple of 8"
for _fn in (varlen_attention, varlen_attention_unwindowed, paged_decode_attention):
    _fn.dtypes = (torch.float16, torch.bfloat16)
    _fn.supports_backward = False
    _fn.refuses = _HEAD_DIM_REFUSAL
varlen_attention.limits = {"min_size": {"D": 16}, "max_size": {"D": MAX_HEAD_DIM}, "contiguous": ("k", "v")}
varlen_attention_unwindowed.limits = {**varlen_attention.limits, "values": {"window": ((-1, -1),)}}
paged_decode_attention.limits = {"min_size": {"D": 16}, "max_size": {"D": MAX_HEAD_DIM},
                                 "contiguous": ("k_cache", "v_cache")}
