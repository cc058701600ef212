"""Replay one failing case, exactly, without Hypothesis or pytest.

    python -m tritoncheck.replay reports/failures/<test id>.json [--impl module:function]
    python -m tritoncheck.replay reports/failures/<test id>.json --describe   # the case, not run

The file, written by the suite when a check fails, holds the check's name, the
implementation's import path and the case (shapes, layouts, dtype, value family,
seed, injected values): inputs are rebuilt bit for bit from it, and the autotune config
the implementation's declared autotuned kernels ran is pinned again (``--autotune-config``
overrides it; under the interpreter, which cannot time configs, a file without one pins 0).

Exit status: 0 the case passes now; 1 it fails; 2 the file is not a replay file or the
implementation does not import; 3 the case is outside the check's domain for the
implementation given.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritoncheck.replay", description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--impl", help="module:function to run instead of the recorded implementation")
    parser.add_argument("--backend", default=None, help="cuda or interpret (default: the recorded backend)")
    parser.add_argument("--autotune-config", default=None, metavar="I|tuned",
                        help="the config the implementation's declared autotuned kernels run (default: the one the "
                             "failure ran, recorded in the file; 0 under the interpreter, which cannot time "
                             "configs; tuned: let them autotune)")
    parser.add_argument("--describe", action="store_true",
                        help="print the check, the implementation and the case in words, and run nothing (a case "
                             "that crashed its process can be read before it is run again)")
    args = parser.parse_args(argv)
    try:
        data = json.loads(open(args.file).read())
    except (OSError, ValueError) as exc:
        data = f"{type(exc).__name__}: {exc}"
    if not isinstance(data, dict) or not {"check", "case"} <= set(data):
        print(f"{args.file}: not a replay file ({data if isinstance(data, str) else 'no check and case'})",
              file=sys.stderr)
        return 2
    if args.describe:
        from tritoncheck.strategies import Case
        print(f"{data['check']} of {data.get('impl_name')} ({data.get('impl')}) on {data.get('backend')}:\n"
              f"{Case.from_json(data['case']).describe()}")
        return 0

    from tritoncheck import backend
    backend.select(args.backend or data.get("backend", "auto"))
    from tritoncheck import registry
    from tritoncheck.registry import Implementation
    from tritoncheck.strategies import Case

    ops = registry.load()
    if data.get("definition"):  # an op defined with tritoncheck.op: importing its module registers it
        from tritoncheck.define import discovery
        discovery.import_modules([data["definition"].partition(":")[0]], "the replay file's definition")
    case = Case.from_json(data["case"])
    op = ops[case.op]
    target = args.impl or data["impl"]
    if not target:
        print("the file names no importable implementation; pass --impl module:function", file=sys.stderr)
        return 2
    try:
        impl = Implementation.of(case.op, registry.resolve(target), name=data.get("impl_name"), target=target)
    except ValueError as exc:  # an implementation that no longer imports, or declares something wrong
        print(f"cannot replay with {target}: {exc}", file=sys.stderr)
        return 2
    check = {c.name: c for c in op.checks}[data["check"]]
    print(f"replaying {check.name} for {impl.name} ({target}) on {backend.current()}:\n{case.describe()}\n")
    from hypothesis.errors import UnsatisfiedAssumption

    from tritoncheck import autotune_configs
    try:
        config = _autotune_config(args.autotune_config, data, impl.fn)
    except ValueError as exc:
        print(f"--autotune-config: {exc}", file=sys.stderr)
        return 2
    try:
        with autotune_configs.pinned_all(impl.fn, config):
            check.run(case, impl)
    except UnsatisfiedAssumption as exc:
        # the suite discards such a case instead of failing it (e.g. another --impl's outputs
        # leave the check's domain): neither a pass nor a failure
        print(f"not applicable: the case is outside the check's domain for this implementation {exc}".rstrip())
        return 3
    except AssertionError as exc:
        print(f"FAILED: {exc}")
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    print("passed: the case no longer fails")
    return 0


def _autotune_config(asked: str | None, data: dict, fn) -> int | None:
    """The config index the replay pins (None: autotune): asked, else recorded, else 0 under
    the interpreter for a function that declares autotuned kernels."""
    from tritoncheck import autotune_configs, backend
    if asked == "tuned":
        return None
    if asked is not None:
        if not asked.isdigit():
            raise ValueError(f"expected a config index (0, 1, ...) or 'tuned', got {asked!r}")
        return int(asked)
    if data.get("autotune_config") is not None:
        return int(data["autotune_config"])
    return 0 if backend.current() == "interpret" and autotune_configs.autotuned_kernels(fn) else None


if __name__ == "__main__":
    sys.exit(main())
