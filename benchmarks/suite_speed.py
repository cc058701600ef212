"""How many examples per second the suite checks, per op and dtype (a script, not a test).

    python benchmarks/suite_speed.py [--examples 50] [--op softmax] [--dtype float16] [--profile gpu|ci]
                                     [--workers N]

Each (op, dtype) runs the same seeded examples twice through
matches_reference (and gradients_match_reference where the op has gradients): the
first pass compiles what it needs, the second finds every kernel compiled, so
compile time = pass 1 - pass 2 and the warm rate is examples / pass 2. The warm pass's
time is split by phase (``tritoncheck/phases.py``): inputs (materialising the drawn cases),
kernel (the implementation, forward and backward), reference (fp64), allowance (the
derived rules), torch (PyTorch's same-dtype baseline), compare (errors, ULPs, vacuity
and the report's records of each output) and the rest (Hypothesis's drawing and
bookkeeping; the whole of an op's own checks, which are not split).

``--workers N`` runs the rows in N spawned processes, as ``pytest -n N`` does: worker i
on GPU i % G of the G visible GPUs (tritoncheck/devices.py), each taking the next row
when it is done with one; the last line is the whole run's rate, every example of both
passes over the wall time from the first row to the last. The same command with
CUDA_VISIBLE_DEVICES=0 and with two GPUs visible compares one GPU with two.
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the interpreter's numpy overflow chatter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=50)
    parser.add_argument("--op", action="append", default=[])
    parser.add_argument("--dtype", action="append", default=[], help="float32, float16, bfloat16 (default: all)")
    parser.add_argument("--profile", default=None, help="size class: ci (small) or gpu (large); default by backend")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--workers", type=int, default=0, help="run the rows in N processes (one GPU each, round-robin)")
    args = parser.parse_args()
    if args.workers:
        return run_workers(args)

    from tritoncheck import backend
    chosen = backend.select(args.backend)
    import torch

    from tritoncheck.config import CONFIG, PROFILE_SIZES
    CONFIG.size = PROFILE_SIZES[args.profile or ("gpu" if chosen == "cuda" else "ci")]
    device = torch.cuda.get_device_name() if chosen == "cuda" else "CPU (Triton interpreter)"
    print(f"backend {chosen}, device {device}, size {CONFIG.size}, {args.examples} examples per row, "
          f"torch {torch.__version__}, pid {os.getpid()}")
    print(HEADER)
    for name, dtype_name, check_name in rows(args.op, args.dtype):
        cold, warm, failed, shares = time_row(name, dtype_name, check_name, args.examples, chosen)
        print(_line(name, dtype_name, check_name, cold, warm, args.examples, failed, shares), flush=True)


def rows(op_names, dtype_names) -> list[tuple[str, str, str]]:
    """(op, dtype, check) of every row to time, by name."""
    from tritoncheck import registry, selfcheck
    ops = registry.load()
    out = []
    for name in op_names or sorted(ops):
        op = ops[name]
        impl = registry.implementations(name)[0]
        checks = [c for c in op.checks if c.name in ("matches_reference", "gradients_match_reference")]
        for dtype in (d for d in op.dtypes if not dtype_names or str(d)[6:] in dtype_names):
            out.extend((name, str(dtype)[6:], c.name) for c in checks if not selfcheck.runnable(op, impl, c, dtype))
    return out


PHASES = ("inputs", "kernel", "reference", "allowance", "torch baseline", "compare")
HEADER = (f"{'op':<28} {'dtype':<9} {'check':<26} {'cold s':>8} {'warm s':>8} {'ex/s warm':>10} {'compile %':>9}  "
          "warm share %: inputs kernel reference allowance torch compare rest")


def time_row(name: str, dtype_name: str, check_name: str, examples: int,
             chosen: str) -> tuple[float, float, bool, list[float]]:
    """Seconds of the cold and the warm pass of one row, whether the check failed, and
    the warm pass's share per phase (PHASES, then the rest) in percent."""
    import torch

    from tritoncheck import phases, registry, selfcheck
    op = registry.load()[name]
    impl = registry.implementations(name)[0]
    check = next(c for c in op.checks if c.name == check_name)
    times = []
    for warm_pass in (False, True):
        if warm_pass:
            phases.start()
        start = time.perf_counter()
        verdict = selfcheck.hunt(op, impl, check, getattr(torch, dtype_name), examples)
        if chosen == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    spent = phases.stop()
    shares = [100 * spent.get(p, 0.0) / times[1] for p in PHASES]
    return times[0], times[1], verdict.failed, shares + [max(0.0, 100 - sum(shares))]


def _line(name, dtype_name, check_name, cold, warm, examples, failed, shares, gpu="") -> str:
    return (f"{name:<28} {dtype_name:<9} {check_name:<26} {cold:8.2f} {warm:8.2f} "
            f"{examples / warm:10.1f} {100 * max(cold - warm, 0) / cold:8.0f}%  "
            + " ".join(f"{x:.0f}" for x in shares) + f"{gpu}{'  FAILED' if failed else ''}")


def _worker(index: int, backend_name: str, size: str, examples: int, todo, done) -> None:
    """One spawned worker: GPU index % G, like xdist's gw<index>; rows from ``todo`` until None."""
    import torch

    from tritoncheck import backend, devices
    from tritoncheck.config import CONFIG
    chosen = backend.select(backend_name)
    gpu = devices.select_worker_gpu(f"gw{index}", chosen)
    if chosen == "cuda" and gpu is None:
        gpu = torch.cuda.current_device()
    CONFIG.size = size
    torch.set_num_threads(1)
    while (row := todo.get()) is not None:
        cold, warm, failed, shares = time_row(*row, examples, chosen)
        done.put((row, cold, warm, failed, shares, gpu))


def run_workers(args) -> None:
    import multiprocessing

    import torch

    from tritoncheck import backend
    from tritoncheck.config import PROFILE_SIZES
    chosen = backend.select(args.backend)
    size = PROFILE_SIZES[args.profile or ("gpu" if chosen == "cuda" else "ci")]
    gpus = torch.cuda.device_count() if chosen == "cuda" else 0
    todo_rows = rows(args.op, args.dtype)
    print(f"backend {chosen}, {gpus} GPU(s), {args.workers} workers, size {size}, {args.examples} examples per row, "
          f"{len(todo_rows)} rows, torch {torch.__version__}")
    print(HEADER + "  gpu")
    context = multiprocessing.get_context("spawn")
    todo, done = context.Queue(), context.Queue()
    for row in todo_rows:
        todo.put(row)
    for _ in range(args.workers):
        todo.put(None)
    start = time.perf_counter()
    procs = [context.Process(target=_worker, args=(i, chosen, size, args.examples, todo, done))
             for i in range(args.workers)]
    for p in procs:
        p.start()
    per_gpu: dict = {}
    for _ in todo_rows:
        while True:
            try:
                row, cold, warm, failed, shares, gpu = done.get(timeout=5)
                break
            except queue.Empty:
                crashed = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if crashed:
                    raise SystemExit(f"worker(s) {crashed} died (exit codes {[procs[i].exitcode for i in crashed]})") from None
        per_gpu[gpu] = per_gpu.get(gpu, 0) + 1
        print(_line(*row, cold, warm, args.examples, failed, shares, gpu=f"  {gpu}"), flush=True)
    wall = time.perf_counter() - start
    for p in procs:
        p.join()
    total = 2 * args.examples * len(todo_rows)
    print(f"whole run: {total} examples (both passes) in {wall:.1f} s wall = {total / wall:.1f} ex/s on "
          f"{args.workers} workers; rows per GPU: {dict(sorted(per_gpu.items(), key=str))}")


if __name__ == "__main__":
    main()
