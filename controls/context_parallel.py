"""Plain PyTorch context-parallel attention, as a user would write it (the cp_attention checks
must pass it): every rank gathers the whole k and v, then scores its own queries in the
input dtype with the causal mask at global positions."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def _gather_rows(t: torch.Tensor, lengths: list[int], group) -> torch.Tensor:
    """Concatenate every rank's rows of ``t`` along dim 2. all_gather wants equal shapes, so
    each chunk is padded to the longest and cut back after."""
    longest = max(lengths)
    padded = torch.zeros(t.shape[:2] + (longest,) + t.shape[3:], dtype=t.dtype, device=t.device)
    padded[:, :, :t.shape[2]] = t
    parts = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:, :, :n] for part, n in zip(parts, lengths)], dim=2)


def all_gather_torch(q_local, k_local, v_local, causal=False, sm_scale=None, group=None):
    """All-gather k and v, then matmul, mask, softmax, matmul in the input dtype; lse from
    the fp32 logsumexp of the same scores."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = torch.tensor([q_local.shape[2]], dtype=torch.int64, device=q_local.device)
    lengths = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(lengths, mine, group=group)
    lengths = [int(n) for n in lengths]
    k, v = _gather_rows(k_local, lengths, group), _gather_rows(v_local, lengths, group)
    scale = 1.0 / math.sqrt(q_local.shape[-1]) if sm_scale is None else float(sm_scale)
    s = (q_local @ k.transpose(-1, -2)) * scale
    if causal:
        start = sum(lengths[:rank])
        rows = torch.arange(start, start + q_local.shape[2], device=s.device)
        cols = torch.arange(k.shape[2], device=s.device)
        s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
    o = torch.softmax(s, dim=-1) @ v
    return o, torch.logsumexp(s.float(), dim=-1)


# Plain PyTorch: the Triton interpreter's limits (bf16 tl.dot) do not apply.
all_gather_torch.uses_triton = False
all_gather_torch.supports_backward = False
