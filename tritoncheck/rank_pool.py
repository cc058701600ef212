"""A pool of W processes joined in one torch.distributed group, to run distributed callables on.

A distributed op's implementation (``OpSpec.distributed``: ``cp_attention``) runs on W ranks at
once: each gets its own inputs, they talk through ``torch.distributed`` (gloo on CPU,
NCCL on GPUs, rank r on GPU r), and each returns its own outputs. Starting W processes
(each importing torch and Triton) costs seconds, so one pool per (W, backend) lives as
long as the pytest process and runs every example; each rank imports an implementation
once, from its ``module:function`` name (what ``--impl`` gives), and keeps it.

A failure leaves a group in an unknown state (a rank that raised may have left its
peers waiting in a send or a collective), so after any failure (an exception on a rank,
a rank that died, a call past its time limit) the pool is torn down and the next call
starts a fresh one.
"""
from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import queue
import shutil
import tempfile
import time
import traceback
from datetime import timedelta

import torch

START_TIMEOUT_S = 180  # W fresh processes importing torch and Triton on a busy 2-core CI machine
CALL_TIMEOUT_S = 120  # one example on every rank; past it the call hung (a send with no receive)
GROUP_TIMEOUT_S = 60  # torch.distributed's own limit on a collective: a rank left waiting errors out


class RankFailure(RuntimeError):
    """A distributed call did not return on every rank: an exception (with the rank's
    traceback), a rank that died, or one that hung. A check fails with it, as with any
    exception out of an implementation; it is not a check's assertion, so a planted bug
    that makes a rank raise is not killed by it (tritoncheck/selfcheck.py)."""


def _dumps(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


def _rank_main(rank: int, world: int, dist_backend: str, init_file: str, suite_backend: str,
               tasks, results) -> None:
    """One rank: join the group, then run tasks ``(seq, target, payload)`` until None."""
    import torch.distributed as dist

    from tritoncheck import backend, registry
    backend.select(suite_backend)  # TRITON_INTERPRET before Triton is imported
    torch.set_num_threads(1)  # W ranks beside the xdist workers on the same cores
    device = torch.device("cpu")
    if dist_backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(dist_backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    results.put((rank, 0, ("ready", str(device))))
    implementations = {}
    while True:
        task = tasks.get()
        if task is None:
            break
        seq, target, payload = task
        try:
            fn = implementations.get(target) or implementations.setdefault(target, registry.resolve(target))
            args, kwargs = _loads(payload)
            args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
            out = fn(*args, **kwargs)
            if not isinstance(out, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in out):
                raise AssertionError(f"returned {type(out).__name__}, not a tuple of tensors")
            results.put((rank, seq, ("ok", _dumps(tuple(t.detach().cpu() for t in out)))))
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
            results.put((rank, seq, ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=8))))
    dist.destroy_process_group()


class RankPool:
    """W spawned ranks in one process group; :meth:`call` runs a callable on all of them."""

    def __init__(self, world_size: int, suite_backend: str):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self.suite_backend = suite_backend
        self.dist_backend = "nccl" if suite_backend == "cuda" else "gloo"
        self._procs: list = []
        self._seq = 0

    @property
    def started(self) -> bool:
        return bool(self._procs)

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # CUDA cannot fork; gloo and Triton need no fork either
        self._dir = tempfile.mkdtemp(prefix="tritoncheck-ranks-")
        init_file = os.path.join(self._dir, "rendezvous")
        self._results = context.Queue()
        self._tasks = [context.Queue() for _ in range(self.world_size)]
        self._procs = [context.Process(target=_rank_main, daemon=True,
                                       args=(r, self.world_size, self.dist_backend, init_file, self.suite_backend,
                                             self._tasks[r], self._results))
                       for r in range(self.world_size)]
        try:
            for p in self._procs:
                p.start()
        except BaseException:
            self.close(graceful=False)
            raise
        self._collect(0, START_TIMEOUT_S, "start")

    def _collect(self, seq: int, timeout: float, what: str) -> list:
        """Each rank's message for ``seq``; a failure tears the pool down and raises."""
        got: list = [None] * self.world_size
        deadline = time.monotonic() + timeout
        while any(g is None for g in got):
            try:
                rank, s, message = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    waiting = [r for r, g in enumerate(got) if g is None]
                    self.close(graceful=False)
                    if dead:
                        raise RankFailure(f"{what}: rank(s) {[r for r, _ in dead]} of {self.world_size} died "
                                          f"(exit codes {[c for _, c in dead]})") from None
                    raise RankFailure(f"{what}: rank(s) {waiting} of {self.world_size} did not answer in "
                                      f"{timeout:.0f} s (a send without a matching receive, or a collective "
                                      "some rank never reached)") from None
                continue
            if s == seq:  # older answers belong to a call that already failed
                got[rank] = message
        errors = [(r, m) for r, m in enumerate(got) if m[0] == "error"]
        if errors:
            self.close(graceful=False)
            r, (_, text, trace) = errors[0]
            raise RankFailure(f"{what}: rank {r} of {self.world_size} raised {text}"
                              + (f" (and ranks {[e[0] for e in errors[1:]]})" if len(errors) > 1 else "")
                              + f"\nrank {r}'s traceback:\n{trace}")
        return got

    def call(self, target: str, per_rank_args: list[tuple[tuple, dict]], timeout: float = CALL_TIMEOUT_S) -> list:
        """Run ``target`` (``module:function``) on every rank, rank r with ``per_rank_args[r]``
        (args, kwargs; tensors are moved to the rank's device); return each rank's outputs
        (a tuple of CPU tensors), in rank order."""
        if len(per_rank_args) != self.world_size:
            raise ValueError(f"per_rank_args: {len(per_rank_args)} entries for {self.world_size} ranks")
        if not self.started:
            self._start()
        self._seq += 1
        for r, args in enumerate(per_rank_args):
            self._tasks[r].put((self._seq, target, _dumps(args)))
        return [_loads(m[1]) for m in self._collect(self._seq, timeout, f"{target} on {self.world_size} ranks")]

    def close(self, graceful: bool = True) -> None:
        """Stop the ranks: ask them to leave the group (``graceful``), or kill them at once
        (after a failure: a rank may be stuck in a send no one will receive)."""
        if not self._procs:
            return
        started = [p for p in self._procs if p.pid is not None]  # a failed start leaves some unstarted
        if graceful:
            for t in self._tasks:
                try:
                    t.put(None)
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + 5
            for p in started:
                p.join(max(0.0, deadline - time.monotonic()))
        for p in started:
            if p.is_alive():
                p.kill()
        for p in started:
            p.join(5)
        self._procs = []
        shutil.rmtree(self._dir, ignore_errors=True)


_POOLS: dict[tuple[int, str], RankPool] = {}


def pool(world_size: int, suite_backend: str) -> RankPool:
    """The process's pool of ``world_size`` ranks for ``suite_backend`` (started on first call)."""
    key = (world_size, suite_backend)
    if key not in _POOLS:
        _POOLS[key] = RankPool(world_size, suite_backend)
    return _POOLS[key]


@atexit.register
def _close_pools() -> None:
    for p in _POOLS.values():
        p.close()
