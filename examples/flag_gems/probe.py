"""The FlagGems findings read from its source (docs/third-party/flag_gems.md), each called
once on the GPU: FlagGems's ``flash_attn_varlen_func`` against ``standin.py`` (the same
call in plain PyTorch, float32, the function's documented flash-attention semantics) on
the same float16 inputs. Needs torch, triton and flag_gems on a CUDA machine:

    GEMS_VENDOR=nvidia FLAGGEMS_DB_URL=sqlite:// python examples/flag_gems/probe.py

One line per finding: ``SHOWS`` (FlagGems differs from the documented semantics by more
than float16 rounding can explain: 0.05 on outputs of magnitude <= 1), ``not shown``, or
the exception it raised. Exit status: the number of findings that showed.
"""
from __future__ import annotations

import sys
import traceback

import torch
from flag_gems.ops.attention import flash_attn_varlen_func
from standin import flash_attn_varlen_func as documented

SHOWN = 0.05  # |FlagGems - documented| past float16 rounding of outputs <= 1 (u = 4.9e-4, D <= 64 terms)
DEVICE = "cuda"


def _offsets(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)


def _packed(lengths_q, lengths_k, h=2, h_kv=2, d=32, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(sum(lengths_q), h, d, device=DEVICE, generator=g).half()
    k = torch.randn(sum(lengths_k), h_kv, d, device=DEVICE, generator=g).half()
    v = torch.randn(sum(lengths_k), h_kv, d, device=DEVICE, generator=g).half()
    return q, k, v, _offsets(lengths_q), _offsets(lengths_k)


def _compare(name, got, want, lse=True):
    o_err = (got[0].float() - want[0].float()).abs().max().item()
    finite = torch.isfinite(want[1])
    lse_err = (got[1] - want[1])[finite].abs().max().item() if lse and finite.any() else 0.0
    shows = o_err > SHOWN or lse_err > SHOWN
    print(f"{'SHOWS    ' if shows else 'not shown'} {name}: max |o - documented| {o_err:.3g}"
          + (f", max |lse - documented| {lse_err:.3g}" if lse else ""))
    return shows


def varlen(name, lengths_q, lengths_k, causal=False, window=(-1, -1), lse=True, **shape):
    q, k, v, cq, ck = _packed(lengths_q, lengths_k, **shape)
    args = (q, k, v, max(lengths_q), cq, max(lengths_k))
    kw = dict(cu_seqlens_k=ck, causal=causal, window_size=window, return_softmax_lse=True)
    return _compare(name, flash_attn_varlen_func(*args, **kw), documented(*args, **kw), lse)


def probe_windows():
    # 1: (left, -1) without causal: the right side's -1 is used as a bound (j <= i + Nk - Nq - 1)
    a = varlen("1 window (3, -1), not causal, Nq = Nk = 40", [40], [40], window=(3, -1))
    # 2: (-1, right) without causal: is_local = left >= 0, so the right bound is dropped
    b = varlen("2 window (-1, 2), not causal, Nq = Nk = 40", [40], [40], window=(-1, 2))
    # 3: a side >= max_seqlen_k becomes -1, then as 1 or 2
    c = varlen("3 window (0, 17), not causal, Nq = Nk = 10 (right >= Nk)", [10], [10], window=(0, 17))
    d = varlen("3 window (33, 7), not causal, Nq = Nk = 20 (left >= Nk)", [20], [20], window=(33, 7))
    # 1 again: with max_seqlen_q == 1 FlagGems drops causal, so right stays -1
    e = varlen("1 window (3, -1), causal, Nq = 1, Nk = 12 (decode)", [1, 1], [12, 7], causal=True, window=(3, -1))
    return a or b or c or d or e


def probe_head_dim_8():
    # 4: head_size % 8 == 0 admits D = 8; BLOCK_K = 8 < the 16 that tl.dot needs for 16-bit inputs
    return varlen("4 head dim 8", [5], [5], d=8)


def probe_gqa_single_query():
    # 5: max_seqlen_q == 1 and H > Hkv: the query groups are swapped into the sequence dim; the
    # kernel writes lse as (Hkv, B, groups), the wrapper reshapes it as (Hkv, groups, B)
    return varlen("5 GQA H 4 / Hkv 2, one query per sequence, B = 3: lse", [1, 1, 1], [9, 30, 17], h=4, h_kv=2)


def probe_gqa_zero_query():
    # 7: the same swap reshapes q as [B, Hkv, groups, D]: a sequence of zero queries (total_q < B)
    return varlen("7 GQA, one query per sequence but one sequence of none", [1, 0, 1], [9, 4, 17], h=4, h_kv=2)


def probe_empty_row_lse():
    # 8 (convention): a row that sees no key: lse +inf (flash-attention), the contract's -inf
    q, k, v, cq, ck = _packed([2, 3], [0, 5])
    _, lse = flash_attn_varlen_func(q, k, v, 3, cq, 5, cu_seqlens_k=ck, return_softmax_lse=True)
    print(f"convention 8 lse of the rows of a sequence without keys: {lse[:, :2].flatten().tolist()} "
          "(contract: -inf; the adapter maps +inf to -inf)")
    return False


def probe_page_stride():
    # 6: the paged path addresses page p, slot s at (p * page_size + s) * k.stride(1): the page
    # stride k.stride(0) is never read, so a cache that is a view with another page stride
    # (every other page of a larger pool: k_cache = pool[::2]) is read at the wrong pages
    pages, page_size, h, d, lens = 8, 16, 2, 32, [20, 33]
    g = torch.Generator(device=DEVICE).manual_seed(1)
    pool_k = torch.randn(2 * pages, page_size, h, d, device=DEVICE, generator=g).half()
    pool_v = torch.randn(2 * pages, page_size, h, d, device=DEVICE, generator=g).half()
    k_cache, v_cache = pool_k[::2], pool_v[::2]
    q = torch.randn(len(lens), h, d, device=DEVICE, generator=g).half()
    table = torch.tensor([[3, 0, 7], [5, 1, 6]], dtype=torch.int32, device=DEVICE)
    seq = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    args = (q, k_cache, v_cache, 1, _offsets([1] * len(lens)), max(lens))
    kw = dict(seqused_k=seq, block_table=table, causal=True, return_softmax_lse=True)
    shows = _compare("6 paged cache with page stride 2 x page_size x Hkv x D (pool[::2])",
                     flash_attn_varlen_func(*args, **kw), documented(*args, **kw), lse=False)
    contiguous = _compare("6 the same pages copied contiguous (control)", flash_attn_varlen_func(
        q, k_cache.contiguous(), v_cache.contiguous(), *args[3:], **kw), documented(*args, **kw), lse=False)
    return shows and not contiguous


def probe_refusals():
    # not bugs: what its asserts refuse (the adapters declare them)
    q, k, v, cq, ck = _packed([3], [3])
    for what, call in (("float32", lambda: flash_attn_varlen_func(q.float(), k.float(), v.float(), 3, cq, 3,
                                                                  cu_seqlens_k=ck)),
                       ("int64 offsets", lambda: flash_attn_varlen_func(q, k, v, 3, cq.long(), 3,
                                                                        cu_seqlens_k=ck.long())),
                       ("k, v of other strides", lambda: flash_attn_varlen_func(
                           q, k, v.transpose(0, 1).contiguous().transpose(0, 1), 3, cq, 3, cu_seqlens_k=ck))):
        try:
            call()
            print(f"accepted  {what}")
        except Exception as exc:  # noqa: BLE001 - reporting what FlagGems raises is the point
            print(f"refused   {what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return False


def main() -> int:
    import flag_gems
    import triton
    print(f"flag_gems {flag_gems.__version__}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name()}")
    shown = 0
    for probe in (probe_windows, probe_head_dim_8, probe_gqa_single_query, probe_page_stride, probe_gqa_zero_query,
                  probe_empty_row_lse, probe_refusals):
        try:
            shown += bool(probe())
        except Exception as exc:  # noqa: BLE001 - a crash is a finding too: print it and go on
            print(f"RAISED    {probe.__name__}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            traceback.print_exc(limit=-3, file=sys.stdout)
            shown += 1
    print(f"{shown} finding(s) showed")
    return shown


if __name__ == "__main__":
    sys.exit(main())
