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
then those of config I only, which is why the sweep exists. A pinned config the device
cannot run (``OutOfResources``: shared memory past the GPU's at a large head dim) runs the
kernel's next config instead, as Triton's autotuner would have discarded it; only a
kernel none of whose configs runs fails. A library's kernels are
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


def describe(config) -> str:
    """A config as its constexprs and launch options: ``BLOCK=128 num_warps=4 num_stages=3``."""
    if config is None:
        return "(not launched)"
    options = {k: getattr(config, k, None) for k in ("num_warps", "num_stages")}
    return " ".join(f"{k}={v}" for k, v in {**config.kwargs, **options}.items() if v is not None)


# What Triton's own autotuner discards (triton/runtime/autotuner.py, Autotuner._bench): a
# config this device cannot compile or launch (shared memory or registers past the
# hardware's, ptxas refusing it, a static_assert of the config). Pinned to such a config, a
# check would fail a kernel that autotuning would have run with another one.
def _device_refusals() -> tuple[type[BaseException], ...]:
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime import errors
    return tuple(getattr(errors, n) for n in ("OutOfResources", "PTXASError") if hasattr(errors, n)) + (
        CompileTimeAssertionFailure,)


# (kernel, config) -> "kernel config" and why this device cannot run it: each is skipped
# once seen (a pin falls through to the kernel's next config), and the report can list them.
_refused: dict[tuple[int, str], tuple[str, str]] = {}


def refused_configs() -> dict[str, str]:
    """The configs this process found the device cannot run, with the reason: ``"kernel config" -> reason``."""
    return dict(_refused.values())


def _key(kernel: Autotuner, config) -> tuple[int, str]:
    return id(kernel), str(config)


def _run_first_runnable(kernel: Autotuner, order: list):
    """``kernel.run`` for a pin: the pinned config, or where the device cannot run it
    (:func:`_device_refusals`) the next of ``order`` that it can, as Triton's autotuner
    would have discarded it; the first refusal, with every config's, when none runs."""
    def run(*args, **kwargs):
        known = [c for c in order if _key(kernel, c) not in _refused]
        errors = []
        for config in known or order:
            kernel.configs = [config]
            try:
                return type(kernel).run(kernel, *args, **kwargs)
            except _device_refusals() as exc:
                _refused[_key(kernel, config)] = (f"{name(kernel)} {config}", f"{type(exc).__name__}: {exc}")
                errors.append(exc)
        first = errors[0]
        if hasattr(first, "add_note"):  # Python 3.11+
            first.add_note(f"none of the {len(order)} autotune configs of {name(kernel)} can run on this device: "
                           + "; ".join(f"{c}: {_refused[_key(kernel, c)][1]}" for c in order if _key(kernel, c) in _refused))
        raise first
    return run


@contextlib.contextmanager
def pinned(kernel: Autotuner, config) -> Iterator[None]:
    """Run ``kernel`` with ``config`` only, inside the block; where the device cannot run
    ``config`` (:func:`_device_refusals`), with the next of the kernel's configs that it
    can (recorded in :func:`refused_configs`), failing only when none runs."""
    configs = configs_of(kernel)
    if config not in configs:
        raise ValueError(f"{config} is not one of {name(kernel)}'s autotune configs")
    pinned_now, cache = kernel.configs, dict(kernel.cache)
    start = configs.index(config)
    kernel.configs = [config]
    kernel.cache.clear()
    shadowed = vars(kernel).get("run")  # a pin inside another pin of the same kernel
    kernel.run = _run_first_runnable(kernel, configs[start:] + configs[:start])  # this object only, until exit
    outermost = id(kernel) not in _full
    _full.setdefault(id(kernel), configs)
    try:
        yield
    finally:
        if shadowed is None:
            del kernel.run
        else:
            kernel.run = shadowed
        if outermost:
            del _full[id(kernel)]
        kernel.configs = pinned_now
        kernel.cache.clear()
        kernel.cache.update(cache)


# id(kernel) -> its own config list while a pin narrows kernel.configs: a check that runs
# every config (autotune_configs_agree) inside the harness's pin sees them all.
_full: dict[int, list] = {}


def configs_of(kernel: Autotuner) -> list:
    """The kernel's autotune configs, also inside a pin."""
    return _full.get(id(kernel), kernel.configs)


def config_count(fn: Callable) -> int:
    """How many indices :func:`pinned_all` needs to run every config of every kernel ``fn`` declares."""
    return max((len(configs_of(k)) for k in autotuned_kernels(fn)), default=0)


@contextlib.contextmanager
def autotuning(fn: Callable, fastest: int) -> Iterator[dict]:
    """Every autotuned kernel ``fn`` declares autotunes inside the block as Triton's
    Autotuner does: on a new key it runs every config on the call's own buffers (with the
    kernel's pre-hooks, reset_to_zero and restore_value), then the fastest once more. Only
    the clock is replaced: each config's benchmark runs it twice, as a timing loop runs it
    more than once, and config ``fastest`` (modulo the count) is timed fastest, so this
    runs under the interpreter too, where nothing can be timed. A config the device cannot
    run is discarded by the Autotuner itself. Yields {id(kernel): the config it chose},
    filled when the block ends."""
    chosen: dict[int, object] = {}
    with contextlib.ExitStack() as stack:
        for kernel in autotuned_kernels(fn):
            stack.enter_context(_timed_as(kernel, fastest, chosen))
        yield chosen


@contextlib.contextmanager
def _timed_as(kernel: Autotuner, fastest: int, chosen: dict) -> Iterator[None]:
    configs = list(configs_of(kernel))
    winner = configs[fastest % len(configs)]
    own = {k: vars(kernel)[k] for k in ("run", "_bench", "do_bench") if k in vars(kernel)}
    narrowed, cache = kernel.configs, dict(kernel.cache)
    benchmarking = {}

    def bench(*args, config, **meta):
        benchmarking["config"] = config
        return type(kernel)._bench(kernel, *args, config=config, **meta)

    def do_bench(kernel_call, quantiles):
        kernel_call()
        kernel_call()
        config = benchmarking["config"]
        t = 0.0 if config == winner else 1.0 + next((i for i, c in enumerate(configs) if c == config), len(configs))
        return [t] * len(quantiles)

    for attribute in own:
        delattr(kernel, attribute)  # the Autotuner's own run (a pin's is an instance attribute)
    kernel._bench, kernel.do_bench = bench, do_bench
    # Triton's on-disk autotuning cache (cache_results, TRITON_CACHE_AUTOTUNING; never under the
    # interpreter) would answer from an earlier run's timings, never calling this clock: found on
    # an H200, where a second block chose the first block's winner
    disk_cache = vars(kernel).get("cache_results")
    kernel.cache_results = False
    kernel.configs = configs
    kernel.cache.clear()
    kernel.best_config = None  # set by the Autotuner's run: None if the block never launched it
    try:
        yield
    finally:
        chosen[id(kernel)] = kernel.best_config
        del kernel._bench, kernel.do_bench
        if disk_cache is None:
            del kernel.cache_results  # an older Triton's Autotuner, without the attribute
        else:
            kernel.cache_results = disk_cache
        for attribute, value in own.items():
            setattr(kernel, attribute, value)
        kernel.configs = narrowed
        kernel.cache.clear()
        kernel.cache.update(cache)


@contextlib.contextmanager
def pinned_to(fn: Callable, chosen: dict) -> Iterator[None]:
    """Every autotuned kernel ``fn`` declares runs the config ``chosen`` names for it (as
    :func:`autotuning` yields them) inside the block."""
    with contextlib.ExitStack() as stack:
        for kernel in autotuned_kernels(fn):
            if chosen.get(id(kernel)) is not None:
                stack.enter_context(pinned(kernel, chosen[id(kernel)]))
        yield


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
            configs = configs_of(kernel)
            stack.enter_context(pinned(kernel, configs[index % len(configs)]))
        yield
