"""Every autotune config of a kernel, one at a time (the seeds' FA v2 autotune sweep).

``triton.autotune`` picks one config per key by timing: a config that is wrong only at
some sizes hides behind the fastest one on the machine where the suite runs, and
surfaces on another GPU or another size. An implementation names the autotuned
kernels it launches::

    my_attention.autotuned = (attn_fwd, attn_bwd)    # the triton.autotune objects

and :func:`pinned` makes one of them run a single config, so that every check can
be run once per config (``benchmarks/autotune_sweep.py``). An Autotuner with one
config runs it without benchmarking; the kernel's own list and cache come back on exit.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from triton.runtime.autotuner import Autotuner


def autotuned_kernels(fn: Callable) -> tuple[Autotuner, ...]:
    """The autotuned kernels ``fn`` declares (``fn.autotuned``), validated."""
    declared = getattr(fn, "autotuned", None)
    if declared is None:
        return ()
    kernels = tuple(declared) if isinstance(declared, (tuple, list)) else (declared,)
    for k in kernels:
        if not isinstance(k, Autotuner):
            raise TypeError(f"{getattr(fn, '__name__', fn)}.autotuned must hold triton.autotune'd kernels, "
                            f"got a {type(k).__name__}")
    return kernels


def name(kernel: Autotuner) -> str:
    return getattr(kernel.base_fn, "__name__", repr(kernel))


@contextlib.contextmanager
def pinned(kernel: Autotuner, config) -> Iterator[None]:
    """Run ``kernel`` with ``config`` only, inside the block."""
    if config not in kernel.configs:
        raise ValueError(f"{config} is not one of {name(kernel)}'s autotune configs")
    configs, cache = kernel.configs, dict(kernel.cache)
    kernel.configs = [config]
    kernel.cache.clear()
    try:
        yield
    finally:
        kernel.configs = configs
        kernel.cache.clear()
        kernel.cache.update(cache)
