"""How robust are the self-test's kills: hunt every claimed (mutant, check) with other seeds.

    python benchmarks/kill_robustness.py [--seeds 1 2 3] [--shard 0/2]

The self-test hunts each (mutant, check) with one seeded stream per dtype. A kill that
only one lucky stream makes shows up here as a survivor under another seed: the fix
is a strategy that reaches the trigger more often. Prints one line per survivor and a
summary; run shards in parallel processes (one per core) and add up their summaries.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the interpreter's numpy chatter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th hunt starting at i")
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    index, count = (int(x) for x in args.shard.split("/"))

    from tritoncheck import backend
    backend.select(args.backend)
    import torch
    torch.set_num_threads(1)
    from tritoncheck import selfcheck

    jobs = [(s, m, c) for s in args.seeds for m in selfcheck.mutants() for c in m.kills][index::count]
    start, survivors = time.perf_counter(), 0
    for seed, m, check in jobs:
        selfcheck.HUNT_SEED = seed
        verdict = selfcheck.kill(m, check)
        if not verdict.failed:
            survivors += 1
            print(f"survived  seed {seed}  {m.target}  {check}  ({verdict.text})", flush=True)
    print(f"shard {args.shard}: {len(jobs)} hunts with seeds {args.seeds}, {survivors} survived, "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
