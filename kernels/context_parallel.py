"""Context-parallel attention: the sequence split across the ranks of a process group (ring attention).

    cp_attention(q_local, k_local, v_local, causal=False, sm_scale=None, group=None) -> (o_local, lse_local)

Each of the W ranks of ``group`` (None: the default group) holds one contiguous chunk of
the sequence, the chunks in rank order: rank r has rows [start_r, start_r + n_r) of q, k
and v, each ``[B, H, n_r, D]`` (n_r >= 1, and the n_r may differ). It returns the rows of
o (``[B, H, n_r, D]``, input dtype) and lse (``[B, H, n_r]``, float32) of attention over
the whole sequence for its own queries: the contract of ``attention`` (docs/contract.md)
applied to the concatenated q, k, v, cut back to rank r's rows.

Ring: W steps. At step t rank r holds the k, v chunk of rank s = (r - t) mod W, scores
its queries against it with the project's flash attention kernel (tritoncheck.kernels.attention),
and meanwhile passes that chunk on to rank r + 1 and receives the next from rank r - 1,
so every chunk visits every rank once. The blocks' (o_b, lse_b) are merged online in
fp32 (the log-sum-exp merge, exact in real arithmetic in any order):

    lse' = log(e^lse + e^lse_b)
    o'   = o e^{lse - lse'} + o_b e^{lse_b - lse'}     (each side's share of the normaliser)

Causal, in global positions: query i of rank r sits at start_r + i, key j of rank s at
start_s + j, and the key is visible iff start_s + j <= start_r + i. With the chunks in
rank order a block is then one of three kinds: s < r, every key precedes every query
(the whole block: a non-causal call); s == r, the diagonal block, n_q == n_k and the
local mask j <= i is the global one (a causal call); s > r, every key follows every
query (skipped: it adds nothing, and the chunk is still passed on).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from tritoncheck.kernels.attention import attention as _block_attention

ALL, DIAGONAL, NONE = "all", "diagonal", "none"


def _check_inputs(q, k, v, causal, group) -> None:
    for name, t in (("q_local", q), ("k_local", k), ("v_local", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be [B, H, N, D], got {t.dim()} dims")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"k_local {list(k.shape)} and v_local {list(v.shape)} must have q_local's shape "
                         f"{list(q.shape)}: each rank holds the same rows of q, k and v")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised (call init_process_group first)")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")


def _chunk_starts(n_local: int, device, group) -> tuple[list[int], list[int]]:
    """Every rank's chunk length and global start (the prefix sums, in rank order)."""
    world = dist.get_world_size(group)
    mine = torch.tensor([n_local], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(lengths, mine, group=group)
    lengths = [int(n) for n in lengths]
    starts = [sum(lengths[:r]) for r in range(world)]
    return lengths, starts


def _visibility(q_start: int, n_q: int, k_start: int, n_k: int) -> str:
    """Which keys [k_start, k_start + n_k) the queries [q_start, q_start + n_q) see under the
    causal mask (key position <= query position)."""
    if k_start + n_k - 1 <= q_start:  # the last key is at or before the first query
        return ALL
    if k_start > q_start + n_q - 1:  # the first key is after the last query
        return NONE
    if k_start == q_start and n_k == n_q:
        return DIAGONAL
    raise ValueError(f"q_local: a chunk of {n_q} rows at {q_start} straddles the keys at {k_start} "
                     f"({n_k} rows) off the diagonal: the chunks must be contiguous and in rank order")


def _global_rank(group, index: int) -> int:
    return index if group is None else dist.get_global_rank(group, index)


def _ring_shift(k, v, n_next: int, rank: int, world: int, group):
    """Send (k, v) to rank + 1 and receive the chunk of rank - 1 (``n_next`` rows); returns
    the pending requests and the receive buffers."""
    shape = k.shape[:2] + (n_next,) + k.shape[3:]
    k_in = torch.empty(shape, dtype=k.dtype, device=k.device)
    v_in = torch.empty(shape, dtype=v.dtype, device=v.device)
    to, frm = _global_rank(group, (rank + 1) % world), _global_rank(group, (rank - 1) % world)
    ops = [dist.P2POp(dist.isend, k, to, group), dist.P2POp(dist.isend, v, to, group),
           dist.P2POp(dist.irecv, k_in, frm, group), dist.P2POp(dist.irecv, v_in, frm, group)]
    return dist.batch_isend_irecv(ops), k_in, v_in


def cp_attention(q_local, k_local, v_local, causal=False, sm_scale=None, group=None):
    """Ring attention over ``group`` (module docstring): this rank's rows of (o, lse)."""
    _check_inputs(q_local, k_local, v_local, causal, group)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    lengths, starts = _chunk_starts(q_local.shape[2], q_local.device, group)
    k_cur, v_cur = k_local.contiguous(), v_local.contiguous()
    lead = q_local.shape[:3]
    o_acc = torch.zeros(lead + (v_local.shape[3],), dtype=torch.float32, device=q_local.device)
    lse_acc = torch.full(lead, float("-inf"), dtype=torch.float32, device=q_local.device)
    for step in range(world):
        source = (rank - step) % world  # whose chunk this rank holds at this step
        pending = None
        if step + 1 < world:  # pass the chunk on while this block is computed
            # the chunk of rank - step - 1 arrives next
            n_next = lengths[(rank - step - 1) % world]
            pending, k_next, v_next = _ring_shift(k_cur, v_cur, n_next, rank, world, group)
        q_start, k_start = starts[rank], starts[source]
        seen = _visibility(q_start, lengths[rank], k_start, lengths[source]) if causal else ALL
        if seen != NONE:
            o_blk, lse_blk = _block_attention(q_local, k_cur, v_cur, seen == DIAGONAL, sm_scale)
            lse_new = torch.logaddexp(lse_acc, lse_blk)
            # each side weighted by its share of the merged normaliser
            o_acc = o_acc * torch.exp(lse_acc - lse_new)[..., None] \
                + o_blk.float() * torch.exp(lse_blk - lse_new)[..., None]
            lse_acc = lse_new
        if pending is not None:
            for request in pending:
                request.wait()
            k_cur, v_cur = k_next, v_next
    return o_acc.to(q_local.dtype), lse_acc


# The blocks are the project kernel's: what it declares for its dots holds here. Forward
# only: gradients do not flow back through the ring's sends.
cp_attention.fp32_dot_precision = _block_attention.fp32_dot_precision
cp_attention.bf16_dot_upcast = getattr(_block_attention, "bf16_dot_upcast", False)
cp_attention.supports_backward = False
