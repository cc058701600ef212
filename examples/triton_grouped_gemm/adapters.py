"""A mixture-of-experts layer built, as a user would, on the Triton tutorial's grouped GEMM
(python/tutorials/08-grouped-gemm.py), re-typed from the tutorial's description rather than
pasted: persistent programs (one per SM) walk the tiles of every GEMM of a group in turn, each
GEMM given by a device array of pointers, its (m, n, k) and its leading dimensions; fp16
operands, an fp32 accumulator, the tile stored in fp16, ``tl.multiple_of(.., [16, 16])`` hints on
the operand pointers (the tutorial's). The tutorial's loads and stores have no masks (its
sizes are multiples of the blocks); a user whose groups are an expert's tokens adds them.

``moe_grouped_gemm(x, w1, w2, topk_weights, topk_ids)`` follows the contract's ``fused_moe``
with precomputed routing: the (token, slot) pairs sorted by expert, each used expert's tokens
gathered, one grouped GEMM for the gate/up projections (``w1[e]^T`` made contiguous: the
tutorial takes row-major [K, N] operands), SwiGLU in PyTorch (fp16), one grouped GEMM for
``w2``, the weighted outputs added per token in fp32, rounded once. Its signature takes no
router logits and no scales: the suite holds them at their defaults (no routing by logits, no
fp8 weights). float16 only, as the tutorial's kernel.

    python -m tritoncheck --impl fused_moe=adapters:moe_grouped_gemm   (from examples/triton_grouped_gemm)
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def grouped_matmul_kernel(
    group_a_ptrs,  # *int64 [G]: address of each GEMM's a [m, k] (fp16, row-major)
    group_b_ptrs,  # *int64 [G]: address of each GEMM's b [k, n]
    group_c_ptrs,  # *int64 [G]: address of each GEMM's c [m, n]
    group_gemm_sizes,  # *int32 [G, 3]: m, n, k of each GEMM
    g_lds,  # *int32 [G, 3]: the row strides of a, b, c
    group_size,
    NUM_SM: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    tile_idx = tl.program_id(0)
    last_problem_end = 0
    for g in range(group_size):
        # this GEMM's tiles are numbered from last_problem_end on; program p takes p, p + NUM_SM, ...
        gm = tl.load(group_gemm_sizes + g * 3)
        gn = tl.load(group_gemm_sizes + g * 3 + 1)
        gk = tl.load(group_gemm_sizes + g * 3 + 2)
        num_m_tiles = tl.cdiv(gm, BLOCK_SIZE_M)
        num_n_tiles = tl.cdiv(gn, BLOCK_SIZE_N)
        num_tiles = num_m_tiles * num_n_tiles
        while tile_idx >= last_problem_end and tile_idx < last_problem_end + num_tiles:
            lda = tl.load(g_lds + g * 3)
            ldb = tl.load(g_lds + g * 3 + 1)
            ldc = tl.load(g_lds + g * 3 + 2)
            a_ptr = tl.load(group_a_ptrs + g).to(tl.pointer_type(tl.float16))
            b_ptr = tl.load(group_b_ptrs + g).to(tl.pointer_type(tl.float16))
            c_ptr = tl.load(group_c_ptrs + g).to(tl.pointer_type(tl.float16))
            tile_in_gemm = tile_idx - last_problem_end
            tile_m = tile_in_gemm // num_n_tiles
            tile_n = tile_in_gemm % num_n_tiles
            offs_m = tile_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
            offs_n = tile_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
            offs_k = tl.arange(0, BLOCK_SIZE_K)
            a_ptrs = a_ptr + offs_m[:, None] * lda + offs_k[None, :]
            b_ptrs = b_ptr + offs_k[:, None] * ldb + offs_n[None, :]
            acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for kk in range(0, tl.cdiv(gk, BLOCK_SIZE_K)):
                tl.multiple_of(a_ptrs, [16, 16])  # the tutorial's alignment hints
                tl.multiple_of(b_ptrs, [16, 16])
                k_left = gk - kk * BLOCK_SIZE_K  # the masks a ragged group needs
                a = tl.load(a_ptrs, mask=(offs_m[:, None] < gm) & (offs_k[None, :] < k_left), other=0.0)
                b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < gn), other=0.0)
                acc += tl.dot(a, b)
                a_ptrs += BLOCK_SIZE_K
                b_ptrs += BLOCK_SIZE_K * ldb
            c = acc.to(tl.float16)
            c_ptrs = c_ptr + ldc * offs_m[:, None] + offs_n[None, :]
            tl.store(c_ptrs, c, mask=(offs_m[:, None] < gm) & (offs_n[None, :] < gn))
            tile_idx += NUM_SM
        last_problem_end = last_problem_end + num_tiles


def _num_programs(device: torch.device) -> int:
    if device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def group_gemm(a_list: list[torch.Tensor], b_list: list[torch.Tensor]) -> list[torch.Tensor]:
    """[a @ b for each pair] (fp16, row-major) in one launch, as the tutorial's host code does."""
    device = a_list[0].device
    c_list = [torch.empty((a.shape[0], b.shape[1]), dtype=torch.float16, device=device)
              for a, b in zip(a_list, b_list)]
    addresses = [[a.data_ptr() for a in a_list], [b.data_ptr() for b in b_list], [c.data_ptr() for c in c_list]]
    a_ptrs, b_ptrs, c_ptrs = (torch.tensor(row, dtype=torch.int64, device=device) for row in addresses)
    sizes = torch.tensor([[a.shape[0], b.shape[1], a.shape[1]] for a, b in zip(a_list, b_list)],
                         dtype=torch.int32, device=device)
    lds = torch.tensor([[a.stride(0), b.stride(0), c.stride(0)] for a, b, c in zip(a_list, b_list, c_list)],
                       dtype=torch.int32, device=device)
    programs = _num_programs(device)
    big = device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    grouped_matmul_kernel[(programs,)](a_ptrs, b_ptrs, c_ptrs, sizes, lds, len(a_list), NUM_SM=programs,
                                       BLOCK_SIZE_M=128 if big else 32, BLOCK_SIZE_N=128 if big else 64,
                                       BLOCK_SIZE_K=32)
    return c_list


def moe_grouped_gemm(x, w1, w2, topk_weights, topk_ids):
    t, k = topk_ids.shape
    inter = w2.shape[2]
    flat = topk_ids.flatten().long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w1.shape[0]).tolist()
    groups = [(e, pairs) for e, pairs in enumerate(torch.split(order, counts)) if pairs.numel()]
    tokens = [pairs // k for _, pairs in groups]
    gate_up = group_gemm([x[rows].contiguous() for rows in tokens], [w1[e].t().contiguous() for e, _ in groups])
    hidden = [(F.silu(gu[:, :inter]) * gu[:, inter:]).contiguous() for gu in gate_up]
    outs = group_gemm(hidden, [w2[e].t().contiguous() for e, _ in groups])
    y = torch.zeros((t, x.shape[1]), dtype=torch.float32, device=x.device)
    weights = topk_weights.flatten()
    for (_, pairs), rows, out in zip(groups, tokens, outs):
        y.index_add_(0, rows, out.float() * weights[pairs, None])
    return y.to(x.dtype)


moe_grouped_gemm.dtypes = (torch.float16,)
moe_grouped_gemm.supports_backward = False
