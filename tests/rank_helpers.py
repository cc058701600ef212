"""Callables for tritoncheck/rank_pool.py's tests, imported by name on every spawned rank."""
import time

import torch.distributed as dist


def summed_over_ranks(x):
    """Every rank's x added up (an all-reduce: the ranks do form one group)."""
    total = x.clone()
    dist.all_reduce(total)
    return (total,)


def raises_on_rank_1(x):
    if dist.get_rank() == 1:
        raise RuntimeError("planted failure on rank 1")
    return (x,)


def hangs_on_rank_0(x):
    if dist.get_rank() == 0:
        time.sleep(120)
    return (x,)
