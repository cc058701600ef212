"""Which planted bugs each tolerance mode kills: the trade-off of ``--tolerance parity``, measured.

    python benchmarks/parity_modes.py [--shard 0/2] [--backend auto] [--seed N]

Hunts every (mutant, reference check) the self-test claims (``matches_reference``,
``gradients_match_reference``: the two checks the mode changes) once under the derived
rule and once under parity (fail only past both the derived allowance and 2x plain
PyTorch's error in the input dtype), with the self-test's seeds and example budget, and
prints one row per hunt: mutant x check x mode -> killed or survived. Run shards in
parallel processes (one per core) and concatenate their tables.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the interpreter's numpy chatter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODE_CHECKS = ("matches_reference", "gradients_match_reference")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th hunt starting at i")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--seed", type=int, default=None, help="hunt seed (default: the self-test's)")
    args = parser.parse_args()
    index, count = (int(x) for x in args.shard.split("/"))

    from tritoncheck import backend
    backend.select(args.backend)
    import torch
    torch.set_num_threads(1)
    from tritoncheck import parity, selfcheck
    from tritoncheck.config import CONFIG
    if args.seed is not None:
        selfcheck.HUNT_SEED = args.seed

    jobs = [(m, c) for m in selfcheck.mutants() for c in m.kills if c in MODE_CHECKS][index::count]
    start, survived = time.perf_counter(), {mode: 0 for mode in parity.MODES}
    print(f"{'mutant':<48} {'check':<26} " + " ".join(f"{mode:>16}" for mode in parity.MODES), flush=True)
    for m, check in jobs:
        cells = []
        for mode in parity.MODES:
            CONFIG.tolerance = mode
            verdict = selfcheck.kill(m, check)
            cells.append(f"killed {verdict.dtype and str(verdict.dtype).replace('torch.', '')}"
                         if verdict.failed else "survived")
            survived[mode] += not verdict.failed
        print(f"{m.op + '.' + m.name:<48} {check:<26} " + " ".join(f"{c:>16}" for c in cells), flush=True)
    print(f"shard {args.shard}: {len(jobs)} (mutant, check) hunts per mode; survived: "
          + ", ".join(f"{mode} {n}" for mode, n in survived.items())
          + f"; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
