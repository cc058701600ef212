"""Where a check's time goes: materialising inputs, the kernel, the fp64 reference, the
allowance, PyTorch's same-dtype baseline (``benchmarks/suite_speed.py --phases``).

Off by default: :func:`timed` is then a bare context manager. When a script turns it on,
each phase's wall time is added to :data:`TOTALS`, and on CUDA the phase ends with a
synchronize, so that a kernel's asynchronous work is charged to the kernel and not to
whatever reads its result next (which costs the timed run some overlap; an untimed run
keeps it)."""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Iterator

import torch

TOTALS: dict[str, float] | None = None  # phase -> seconds, while timing is on
_open = 0  # phases open now: one inside another (the kernel call inside a backward) counts once


def start() -> None:
    global TOTALS
    TOTALS = defaultdict(float)


def stop() -> dict[str, float]:
    global TOTALS
    totals, TOTALS = dict(TOTALS or {}), None
    return totals


@contextlib.contextmanager
def timed(phase: str) -> Iterator[None]:
    global _open
    if TOTALS is None or _open:
        yield
        return
    _open += 1
    began = time.perf_counter()
    try:
        yield
    finally:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        TOTALS[phase] += time.perf_counter() - began
        _open -= 1
