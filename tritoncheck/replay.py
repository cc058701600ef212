"""Replay one failing case, exactly, without Hypothesis or pytest.

    python -m tritoncheck.replay reports/failures/<test id>.json [--impl module:function]
    python -m tritoncheck.replay reports/failures/<test id>.json --describe   # the case, not run

The file, written by the suite when a check fails, holds the check's name, the
implementation's import path and the case (shapes, layouts, dtype, value family,
seed, injected values): inputs are rebuilt bit for bit from it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritoncheck.replay", description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--impl", help="module:function to run instead of the recorded implementation")
    parser.add_argument("--backend", default=None, help="cuda or interpret (default: the recorded backend)")
    parser.add_argument("--describe", action="store_true",
                        help="print the check, the implementation and the case in words, and run nothing (a case "
                             "that crashed its process can be read before it is run again)")
    args = parser.parse_args(argv)
    data = json.loads(open(args.file).read())
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
    case = Case.from_json(data["case"])
    if case.op not in ops and data.get("op_origin"):  # an op defined with tritoncheck.op: import its module
        importlib.import_module(data["op_origin"].partition(":")[0])
    op = ops[case.op]
    target = args.impl or data["impl"]
    if not target:
        print("the file names no importable implementation; pass --impl module:function", file=sys.stderr)
        return 2
    impl = Implementation.of(case.op, registry.resolve(target), name=data.get("impl_name"), target=target)
    check = {c.name: c for c in op.checks}[data["check"]]
    print(f"replaying {check.name} for {impl.name} ({target}) on {backend.current()}:\n{case.describe()}\n")
    from hypothesis.errors import UnsatisfiedAssumption
    try:
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


if __name__ == "__main__":
    sys.exit(main())
