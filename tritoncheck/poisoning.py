"""Fresh allocations filled with NaN while a check runs, so an unwritten output shows.

A kernel that forgets to write part of its output returns whatever the allocator
handed it: on the CPU often zeros, on CUDA the caching allocator's previous block,
which may hold the previous call's (right) answer. Both hide the bug. PyTorch's
``fill_uninitialized_memory`` fills every ``torch.empty``-like result with NaN (and
integers with their largest value) while deterministic algorithms are on; an
unwritten float element then fails the reference comparison on every example
instead of by luck.

Deterministic algorithms are switched on in their ``warn_only`` mode: an op without
a deterministic implementation keeps working (the suite only wants the fill), and
its warning is not the user's concern here, so it is not shown. The mode also makes
some PyTorch ops pick another algorithm (on an H100, ``scaled_dot_product_attention``'s
float32 backward stopped being bitwise repeatable under it, and plain-PyTorch linear
attention's float16/bfloat16 results moved), so an implementation that declares
``uses_triton = False`` (plain PyTorch, whose ops always write their outputs) runs
without it: checking it under another algorithm than the one it runs in production
would check something else.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")
            warnings.filterwarnings("ignore", message=".*CUBLAS_WORKSPACE_CONFIG.*")
            yield
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = was_filling


def poisoned_allocations_for(fn) -> contextlib.AbstractContextManager:
    """:func:`poisoned_allocations` for a Triton implementation ``fn``, nothing for one
    that declares ``uses_triton = False``."""
    return contextlib.nullcontext() if getattr(fn, "uses_triton", True) is False else poisoned_allocations()
