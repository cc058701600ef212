"""How long the ``tritoncheck`` command takes to answer before any check runs (a script that
prints a table, not a test): ``--help``, ``--list-ops``, and a usage error (an unknown op).

    python benchmarks/command_start.py                         # this checkout
    python benchmarks/command_start.py --baseline /path/to/other/checkout --runs 5

Each command runs ``--runs`` times in a fresh process from an empty directory, with the
checkout first on PYTHONPATH (as an install would put it); the table gives the median and
the fastest wall seconds, and what the process had imported of pytest, Triton and torch.
``--baseline`` runs the same in another checkout, alternating with this one, so that a
loaded machine slows both alike.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
COMMANDS = {"--help": ["--help"], "--list-ops": ["--list-ops"], "unknown op": ["sofmax=m:f"]}
PROBE = ("import runpy, sys; sys.argv = ['tritoncheck', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('tritoncheck', run_name='__main__')\n"
         "except SystemExit:\n    pass\n"
         "print('imported:', ' '.join(m for m in ('torch', 'pytest', 'triton') if m in sys.modules), file=sys.stderr)")


def once(checkout: Path, args: list[str], cwd: str) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    imported = next((line.partition(":")[2].strip() for line in done.stderr.splitlines()
                     if line.startswith("imported:")), "?")
    return seconds, imported or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, timed alongside")
    args = parser.parse_args()
    checkouts = {"this": HERE, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    times: dict[tuple[str, str], list[float]] = {}
    imported: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(args.runs):
            for name, argv in COMMANDS.items():
                for label, checkout in checkouts.items():
                    seconds, what = once(checkout, argv, cwd)
                    times.setdefault((name, label), []).append(seconds)
                    imported[(name, label)] = what
    print(f"{'command':<12} {'checkout':<9} {'median s':>9} {'fastest s':>10}  imported")
    for (name, label), ts in times.items():
        print(f"{name:<12} {label:<9} {statistics.median(ts):>9.2f} {min(ts):>10.2f}  {imported[(name, label)]}")


if __name__ == "__main__":
    main()
