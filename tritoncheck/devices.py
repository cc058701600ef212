"""Which GPU a pytest process uses: one GPU per xdist worker.

``pytest -n N`` on a machine with G visible GPUs starts workers ``gw0`` .. ``gw<N-1>``;
without a choice every one of them would use GPU 0 (CUDA's default device) and the
other G - 1 GPUs would sit idle. Worker ``gw<i>`` takes GPU ``i % G``: workers spread
round-robin, each GPU gets ``ceil(N / G)`` or ``floor(N / G)`` of them.

The choice is made with ``torch.cuda.set_device`` in the plugin's ``pytest_configure``,
before any tensor is made on the GPU (``--impl`` imports the user's modules later in
the same hook, and those may allocate at import). ``CUDA_VISIBLE_DEVICES`` is left
alone: the suite's spawned children (the self-test's isolated hunts) and the
context-parallel ranks (``properties/context_parallel.py``) need to see every GPU.
"""
from __future__ import annotations

import re

import torch

_WORKER_ID = re.compile(r"gw(\d+)")


def worker_index(worker_id: str | None) -> int | None:
    """The number in an xdist worker id (``"gw3"`` -> 3); None for the controlling
    process (no worker id) or an id that is not xdist's ``gw<i>``."""
    if worker_id is None:
        return None
    match = _WORKER_ID.fullmatch(worker_id)
    return int(match.group(1)) if match else None


def worker_gpu(worker_id: str | None, gpu_count: int) -> int | None:
    """The GPU index worker ``worker_id`` should use on a machine with ``gpu_count`` GPUs:
    ``i % gpu_count`` for worker ``gw<i>``; None where there is no choice to make (no GPU
    or one, or not an xdist worker: CUDA's default device is then the right one)."""
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 0:
        raise ValueError(f"gpu_count must be an int >= 0, got {gpu_count!r}")
    index = worker_index(worker_id)
    if index is None or gpu_count <= 1:
        return None
    return index % gpu_count


def select_worker_gpu(worker_id: str | None, backend_name: str) -> int | None:
    """Set this process's CUDA device for ``worker_id`` (see :func:`worker_gpu`) on the
    ``cuda`` backend; return the index set, or None when nothing was set."""
    if backend_name != "cuda":
        return None
    gpu = worker_gpu(worker_id, torch.cuda.device_count())
    if gpu is not None:
        torch.cuda.set_device(gpu)
    return gpu


def current_gpu(backend_name: str) -> int | None:
    """The GPU index this process runs its tests on (None off CUDA), for the report."""
    return torch.cuda.current_device() if backend_name == "cuda" else None


# What a worker may keep cached on its GPU between examples (see release_cache).
CACHE_KEPT_BYTES = 2**30


def release_cache(backend_name: str) -> None:
    """After an example: hand the caching allocator's unused blocks back to the GPU once
    this worker's reserved memory has passed CACHE_KEPT_BYTES since the last release.

    Each xdist worker has its own caching allocator, and it keeps the blocks of the
    largest example it met. Fifteen workers on one H100 that had each met a long attention
    example (an 8k x 8k float64 reference holds about 4 GB) held its 80 GB between them,
    and small examples in other workers ran out of memory: 10 of 246 tests of a
    200-example run failed with CUDA OOM in rope, swiglu, cross_entropy and linear
    attention. A release costs about a millisecond; a worker that draws only small
    examples never makes one."""
    if backend_name != "cuda" or torch.cuda.max_memory_reserved() <= CACHE_KEPT_BYTES:
        return
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
