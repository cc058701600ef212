"""Every autotune config of a kernel, one at a time (the seeds' FA v2 autotune sweep).

``triton.autotune`` picks one config per key by timing: a config that is wrong only at
some sizes hides behind the fastest one on the machine where the suite runs, and
surfaces on another GPU or another size. An implementation names the autotuned
kernels it launches::

    my_attention.autotuned = (attn_fwd, attn_bwd)    # the triton.autotune objects

and :func:`pinned` makes one of them run a single config, so that every check can
be run once per config (``benchmarks/autotune_sweep.py``). An Autotuner with one
config runs it without benchmarking; the kernel's own list and cache come back on exit.

The same pin bounds what an autotuned library costs a fuzz run (``--autotune-config I``,
:func:`pinned_all`): a kernel that autotunes on a size compiles and times every config
for each new value of that size (flash-linear-attention's ``elu_p1`` 30 configs, 18-29 s
per new last dim on an H100), so a run of a few hundred examples spends its minutes in
the autotuner. Pinned to config I, each new size compiles one config. The numerics are
then those of config I only, which is why the sweep exists. A library's kernels are
many and unexported; :func:`autotuners_in` collects them from its modules so that an
adapter can declare ``fn.autotuned = autotuners_in("fla")``.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from triton.runtime.autotuner import Autotuner


def autotuned_kernels(fn: Callable) -> tuple[Autotuner, ...]:
    """The autotuned kernels ``fn`` declares (``fn.autotuned``), validated."""
    declared = getattr(fn, "autotuned", None)
    if declared is None:
        return ()
    kernels = tuple(declared) if isinstance(declared, (tuple, list)) else (declared,)
    tuners = tuple(_autotuner_of(k) for k in kernels)  # a triton.heuristics wrapper is looked through
    for k, tuner in zip(kernels, tuners):
        if tuner is None:
            raise TypeError(f"{getattr(fn, '__name__', fn)}.autotuned must hold triton.autotune'd kernels, "
                            f"got a {type(k).__name__}")
    return tuners


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


def _autotuner_of(obj) -> Autotuner | None:
    """``obj`` if it is an Autotuner, or the Autotuner under ``triton.heuristics`` wrappers."""
    for _ in range(4):  # heuristics over autotune over jit: a short chain
        if isinstance(obj, Autotuner):
            return obj
        obj = getattr(obj, "fn", None)
        if obj is None:
            return None
    return None


def autotuners_in(*packages: str) -> tuple[Autotuner, ...]:
    """Every autotuned kernel defined at module level in the imported modules of
    ``packages`` (``"fla"`` covers ``fla.ops.utils.cumsum`` and the rest): what a
    library's entry points launch, for ``fn.autotuned``. Import the entry points first;
    a package with no imported module or no autotuned kernel is an error, not ()."""
    found: dict[int, Autotuner] = {}
    for package in packages:
        modules = [m for name, m in list(sys.modules.items())
                   if m is not None and (name == package or name.startswith(package + "."))]
        if not modules:
            raise ValueError(f"autotuners_in: no module of {package!r} is imported; import its entry points first")
        before = len(found)
        for module in modules:
            for value in list(vars(module).values()):
                tuner = _autotuner_of(value)
                if tuner is not None:
                    found.setdefault(id(tuner), tuner)
        if len(found) == before:
            raise ValueError(f"autotuners_in: the imported modules of {package!r} define no triton.autotune'd kernel")
    return tuple(found.values())


_turns: dict[int, int] = {}


def each_in_turn(fn: Callable, index: int | None) -> int | None:
    """The config index for ``fn``'s next call of a check: ``index`` when the run pins one
    (``--autotune-config I``), else 0, 1, 2, ... call after call (None when ``fn``
    declares no autotuned kernel).

    Left to autotune, a kernel times every config on one shared output buffer and then
    runs the winner on it: a config that writes nothing returns the previous config's
    answer and, being fastest, wins (triton-lang/triton#9230); only later calls with
    the same key show it. Pinned in turn, each config runs alone on the check's freshly
    poisoned (NaN) outputs, so every config is checked within as many examples as
    it has, and no example pays for a timing sweep."""
    if index is not None or not autotuned_kernels(fn):
        return index
    turn = _turns.get(id(fn), 0)
    _turns[id(fn)] = turn + 1
    return turn


@contextlib.contextmanager
def pinned_all(fn: Callable, index: int | None) -> Iterator[None]:
    """Every autotuned kernel that ``fn`` declares runs its config ``index`` (modulo its
    number of configs) inside the block; ``index`` None leaves them autotuning."""
    kernels = autotuned_kernels(fn) if index is not None else ()
    with contextlib.ExitStack() as stack:
        for kernel in kernels:
            stack.enter_context(pinned(kernel, kernel.configs[index % len(kernel.configs)]))
        yield
