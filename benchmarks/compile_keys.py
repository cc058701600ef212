"""How many Triton compilations a run of the suite draws: the distinct compile keys of the
project's kernels per op and check (a script and a pytest plugin, not a test).

    python benchmarks/compile_keys.py --op attention --dtype float32     # quick profile, one op
    python benchmarks/compile_keys.py --keys --op varlen_attention       # and every key, per kernel
    python benchmarks/compile_keys.py                                    # every op, every dtype

A cold run's time on a GPU is mostly Triton compiling (docs/speed.md): a kernel compiles
once per distinct key, and the key is what Triton's launcher (``JITFunction.run`` in
``triton/runtime/jit.py``, 3.6 and 3.9 alike) computes from the launch's arguments: for
each parameter, a constexpr's value; a tensor's dtype (``*fp16``) and, unless the kernel
declares ``do_not_specialize_on_alignment`` for it, whether its data pointer is 16-byte
aligned (``D``); an integer's type (``i32``, or ``i64`` past 2**31) and, unless
``do_not_specialize``, whether it is divisible by 16 (``D``) or equal to 1 (then it becomes
a constexpr 1); floats and bools by type only; then the launch options (``num_warps``,
``num_stages``, ...). This plugin computes that key at every launch with Triton's own
binder: compiled, the very one the kernel launches with; under the interpreter (the CPU
machine: no GPU needed), one made the same way (``create_function_from_signature`` over
the kernel's parameters) with the generic backend's ``get_int_specialization`` /
``get_tensor_specialization``, which the NVIDIA backend inherits unchanged. A launch whose
key cannot be computed is recorded as such and never fails the run.

The hook is Triton's public ``add_pre_run_hook`` of each ``@triton.jit`` kernel defined at
module level in ``tritoncheck.kernels`` (under a ``triton.autotune`` or ``heuristics``
wrapper too: each config launches the kernel, and is counted), added by this plugin only:
nothing in the suite is patched. Under the interpreter Triton passes the hook only the
kernel's own parameters, not the launch options; the project's kernels derive
``num_warps`` and ``num_stages`` from their constexprs (block sizes, dtype), so they add no
key there. What the count leaves out: the kernels' source hash (one per kernel) and the
target (one GPU).

As a plugin (``-p compile_keys`` with ``benchmarks/`` on the path, and
``--compile-keys-out FILE``; ``--compile-keys-package P`` for another package's kernels) it
writes every (test, kernel, key) once, in launch order, as JSON lines; xdist workers
append to ``FILE.<worker>``. ``benchmarks/quick_profile.py`` uses it to print each row's
keys beside its timings. Kernels launched in other processes (``cp_attention``'s ranks)
are not seen. Where Triton has the compilation listener (``triton.knobs``, 3.4 on), each
compilation's seconds are written too (``"compiled"`` records; ``compile_seconds``): on a GPU,
how much of a cold run was compiling, summed over its processes.
"""
from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_PACKAGES = ("tritoncheck.kernels",)


# ------------------------------------------------------------------------ the plugin

class KeyRecorder:
    """Adds a pre-run hook to every launched kernel and writes each new (test, key)."""

    def __init__(self, out: Path, packages: tuple[str, ...] = KERNEL_PACKAGES):
        self.out = out
        self.packages = packages
        self.hooked: set[int] = set()
        self.test: str | None = None
        self.seen: set[tuple[str, str]] = set()
        self.listening = False

    def hook_kernels(self) -> None:
        """Hooks every kernel of the loaded kernel modules not hooked yet."""
        for name, module in list(sys.modules.items()):
            if module is None or not any(name == p or name.startswith(p + ".") for p in self.packages):
                continue
            for value in list(vars(module).values()):
                kernel = _launchable(value)
                if kernel is not None and id(kernel) not in self.hooked:
                    self.hooked.add(id(kernel))
                    kernel.add_pre_run_hook(self._hook_for(kernel))

    def _hook_for(self, kernel):
        name = kernel.fn.__qualname__ if hasattr(kernel, "fn") else repr(kernel)

        def record(*args, **kwargs):
            try:
                bound, specialization, options = _binder(kernel)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a count must never break the run it counts
                self.write(name, f"{name}: key not computed ({type(exc).__name__}: {exc})", f"{name} (no key)")
                return
            parts = [(kind, _plain(value)) for kind, value in specialization]
            key = name + str(parts) + (str(sorted((k, _plain(v)) for k, v in options.items())) if options else "")
            self.write(name, key, _label(name, list(bound), parts, options))
        return record

    def listen_to_compiler(self) -> None:
        """Records each compilation's seconds (``triton.knobs.compilation.listener``, where
        this Triton has it: 3.4 on): a cold run's compile time per kernel, beside its keys.
        Compiled kernels only (the interpreter compiles nothing)."""
        try:
            from triton import knobs
        except ImportError:  # before Triton 3.3
            return
        if not hasattr(knobs.compilation, "listener"):
            return

        def heard(*, src, metadata, metadata_group, times, cache_hit):
            if cache_hit:
                return
            name = getattr(getattr(src, "fn", None), "__name__", None) or str(getattr(src, "name", "?"))
            with self.out.open("a") as f:
                f.write(json.dumps({"test": self.test or "(outside a test)", "compiled": name,
                                    "s": times.total / 1e6}) + "\n")
        knobs.compilation.listener = heard

    def write(self, kernel: str, key: str, label: str) -> None:
        test = self.test or "(outside a test)"
        if (test, key) in self.seen:
            return
        self.seen.add((test, key))
        with self.out.open("a") as f:
            f.write(json.dumps({"test": test, "kernel": kernel, "key": key, "label": label}) + "\n")

    def pytest_runtest_setup(self, item):
        if not self.listening:  # not at configure: Triton is imported after the suite chose its backend
            self.listening = True
            self.listen_to_compiler()
        self.hook_kernels()  # kernel modules are imported at collection, some lazily by a check
        self.test = item.callspec.params["target"].id if hasattr(item, "callspec") and \
            "target" in item.callspec.params else item.nodeid

    def pytest_runtest_teardown(self, item):
        self.test = None


def _launchable(obj):
    """The jit kernel under ``obj`` (through autotune / heuristics wrappers), or None."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    for _ in range(4):
        if isinstance(obj, (JITFunction, InterpretedFunction)):
            return obj
        obj = getattr(obj, "fn", None)
        if obj is None:
            return None
    return None


def _binder(kernel):
    """Triton's own argument binder for ``kernel``: (bound, specialization, options) of a
    launch, the specialization being the compile key's part from the arguments. Compiled,
    the one the kernel launches with (the last of its ``device_caches`` entry, with the
    device's backend); under the interpreter, one built the same way with the generic
    backend."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, KernelParam, create_function_from_signature
    if isinstance(kernel, JITFunction):
        from triton.runtime.driver import driver
        return kernel.device_caches[driver.active.get_current_device()][-1]
    signature = inspect.signature(kernel.fn)  # an InterpretedFunction keeps jit's keywords in .kwargs
    dns = kernel.kwargs.get("do_not_specialize") or ()
    dns_oa = kernel.kwargs.get("do_not_specialize_on_alignment") or ()
    params = [KernelParam(i, p, i in dns or p.name in dns, i in dns_oa or p.name in dns_oa)
              for i, p in enumerate(signature.parameters.values())]
    return create_function_from_signature(signature, params, BaseBackend)


def _label(kernel: str, names: list[str], parts: list[tuple], options: dict) -> str:
    """The key in words: constexprs by name, pointers' dtypes, and the integers whose key
    part is more than a plain i32 (an i64, a divisibility by 16); float and plain i32
    arguments are left out (they never differ)."""
    words = []
    for name, (kind, value) in zip(names, parts):
        if kind == "constexpr":
            words.append(f"{name}={value}")
        elif str(kind).startswith("*") or kind not in ("i32", "fp32", "fp64", "u1") or value:
            words.append(f"{name}:{kind}{'/' + str(value) if value else ''}")
    words += [f"{k}={v}" for k, v in sorted(options.items())]
    return f"{kernel}({', '.join(words)})"


def _plain(value):
    """A key part as text that is the same for equal values (dtypes, jit functions)."""
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def pytest_addoption(parser):
    group = parser.getgroup("compile keys")
    group.addoption("--compile-keys-out", default=None, metavar="FILE",
                    help="write each test's distinct Triton compile keys here")
    group.addoption("--compile-keys-package", action="append", default=[], metavar="PACKAGE",
                    help="hook the kernels of this package's modules (repeatable; default tritoncheck.kernels)")


def pytest_configure(config):
    out = config.getoption("--compile-keys-out")
    if out:
        worker = getattr(config, "workerinput", {}).get("workerid")
        path = Path(f"{out}.{worker}" if worker else out)
        packages = tuple(config.getoption("--compile-keys-package")) or KERNEL_PACKAGES
        config.pluginmanager.register(KeyRecorder(path, packages), "compile-key-recorder")


# ------------------------------------------------------------------------ reading a run

def read_keys(out: Path) -> list[dict]:
    """The records of a run: ``out`` and its workers' ``out.gw<i>`` files."""
    return [r for r in _records(out) if "key" in r]


def compile_seconds(out: Path) -> float | None:
    """The seconds a run's processes spent compiling (cache misses; None: no record of any,
    as under the interpreter or a Triton without the compilation listener)."""
    seconds = [r["s"] for r in _records(out) if "compiled" in r]
    return sum(seconds) if seconds else None


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(out.parent.glob(out.name + "*"))
            for line in path.read_text().splitlines() if line]


def split_id(test: str) -> tuple[str, str, str]:
    """(op, dtype, check) of a test id ``op-impl-dtype-check`` (impl may hold dashes)."""
    op, _, rest = test.partition("-")
    for dtype in ("float32", "float16", "bfloat16"):
        if f"-{dtype}-" in rest:
            return op, dtype, rest.partition(f"-{dtype}-")[2]
    return op, "", rest


def per_op(records: list[dict]) -> dict[str, set[str]]:
    keys = collections.defaultdict(set)
    for r in records:
        keys[split_id(r["test"])[0]].add(r["key"])
    return keys


def print_table(records: list[dict], show_keys: bool) -> None:
    """Per op: distinct keys in all (the cold run's compilations); per check, the keys it
    launches and those new to the op when it ran (tests in run order)."""
    by_op: dict[str, list[dict]] = collections.defaultdict(list)
    for r in records:
        by_op[split_id(r["test"])[0]].append(r)
    print(f"{'op':<28} {'dtype':<9} {'check':<40} {'keys':>5} {'new':>5}")
    for op, rows in by_op.items():
        seen: set[str] = set()
        tests: dict[str, set[str]] = collections.defaultdict(set)
        new: collections.Counter = collections.Counter()
        for r in rows:
            tests[r["test"]].add(r["key"])
            if r["key"] not in seen:
                seen.add(r["key"])
                new[r["test"]] += 1
        for test, keys in tests.items():
            _, dtype, check = split_id(test)
            print(f"{op:<28} {dtype:<9} {check:<40} {len(keys):>5} {new[test]:>5}")
        kernels = collections.Counter(r["kernel"] for r in {r["key"]: r for r in rows}.values())
        print(f"{op:<28} {'all':<9} {'(distinct keys: compilations)':<40} {len(seen):>5}   "
              + ", ".join(f"{k} {n}" for k, n in kernels.most_common()))
        if show_keys:
            labels = {r["key"]: r["label"] for r in rows}
            for label in sorted(labels[k] for k in seen):
                print(f"    {label}")


def print_summary(records: list[dict]) -> None:
    """Per op: the distinct keys of each dtype's tests and of all of them (one run's
    compilations: a dtype's kernels are distinct keys, so all = the sum)."""
    keys: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for r in records:
        op, dtype, _ = split_id(r["test"])
        keys[op, dtype].add(r["key"])
        keys[op, "all"].add(r["key"])
    dtypes = ("float32", "float16", "bfloat16", "all")
    print(f"{'op':<28}" + "".join(f"{d:>10}" for d in dtypes))
    for op in sorted({op for op, _ in keys}):
        print(f"{op:<28}" + "".join(f"{len(keys[op, d]) if (op, d) in keys else '-':>10}" for d in dtypes))
    print(f"{'total':<28}" + "".join(f"{sum(len(v) for (_, d), v in keys.items() if d == dt):>10}" for dt in dtypes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", action="append", default=[], help="this op (repeatable; default all)")
    parser.add_argument("--dtype", action="append", default=[], help="this dtype (repeatable; default all)")
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--seed", default="0", help="--hypothesis-seed (the quick profile is not derandomized)")
    parser.add_argument("--keys", action="store_true", help="print every distinct key")
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--save", type=Path, default=None, help="keep the run's records (JSON lines) in this file")
    parser.add_argument("--load", type=Path, default=None, help="print a saved run's records instead of running")
    args = parser.parse_args()
    if args.load:
        records = read_keys(args.load)
        print_table(records, args.keys)
        print_summary(records)
        return 0
    with tempfile.TemporaryDirectory(prefix="compile-keys-") as tmp:
        out = Path(tmp) / "keys.jsonl"
        cmd = [sys.executable, "-m", "pytest", "tests/test_checks.py", "-q", "-p", "no:randomly", "-p", "no:xdist",
               "-p", "no:cacheprovider", "-p", "compile_keys", f"--compile-keys-out={out}",
               "--hypothesis-profile", args.profile, "--hypothesis-seed", args.seed, "--report-dir", tmp,
               *[f"--op={op}" for op in args.op], *[f"--dtype={d}" for d in args.dtype], *args.pytest_arg]
        # a fresh Hypothesis database: examples saved by earlier runs (the quick profile
        # replays them) would make the count depend on the checkout's history
        env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(Path(tmp) / "hypothesis"),
               "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        tail = proc.stdout.strip().splitlines()[-1:] or proc.stderr.strip().splitlines()[-1:]
        print(f"pytest: {' '.join(tail)}")
        records = read_keys(out)
    if args.save:
        args.save.write_text("".join(json.dumps(r) + "\n" for r in records))
    print_table(records, args.keys)
    print_summary(records)
    return 0 if records else 1


if __name__ == "__main__":
    raise SystemExit(main())
