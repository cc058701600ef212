"""Run each kernel on a fixed sample of fuzzed cases, forward and backward, for a
memory checker to watch (a script, not a test: run it under compute-sanitizer).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 7 \\
        python3 scripts/memcheck.py [--examples 3] [--op swiglu] [--impl swiglu=tritoncheck.mutants.memory:store_past_the_end]

PyTorch's caching allocator carves many tensors out of one cudaMalloc, and the
sanitizer only sees the edges of what was cudaMalloc'd: a store a few elements past
an output lands inside the same segment and goes unseen. With caching off every
tensor is its own allocation, so a write past any tensor's end is reported.

The cases are drawn from each op's own strategy with a fixed seed (``ci`` sizes:
the sanitizer slows kernels 10-100x), so a clean run is a statement about the same
inputs every time. Exits 0 when every call returned; what the sanitizer found it
reports itself, with the exit code given by --error-exitcode.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sample_cases(strategy, examples: int, seed: int) -> list:
    """``examples`` cases from ``strategy``, the same ones on every run."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    drawn = []

    @hypothesis_seed(seed)
    @settings(max_examples=examples, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case):
        drawn.append(case)

    collect()
    return drawn[:examples]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=3, help="cases per (op, dtype)")
    parser.add_argument("--op", action="append", default=[])
    parser.add_argument("--impl", action="append", default=[], metavar="OP=module:function")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="cuda", help="interpret only to try the script without a GPU")
    args = parser.parse_args()

    from tritoncheck import backend
    backend.select(args.backend)
    import torch

    from tritoncheck import generic, registry
    ops = registry.load()
    for spec in args.impl:
        op, _, target = spec.partition("=")
        registry.register_implementation(op, target)
    chosen = args.op or ([op for op in ops if registry.implementations(op)] if args.impl else sorted(ops))
    for name in chosen:
        op = ops[name]
        for impl in registry.implementations(name):
            for dtype in op.dtypes:
                if impl.unsupported(dtype):
                    continue
                strategy = generic.with_upstream(op, dtype) if op.grad_inputs else op.cases(dtype)
                cases = sample_cases(strategy, args.examples, args.seed)
                for case in cases:
                    values = case.materialise(backend.device())
                    for arg in op.grad_inputs:
                        values[arg] = values[arg].detach().requires_grad_(True)
                    outs = op.unpack(case.call(impl.fn, values))
                    if op.grad_inputs and impl.supports_backward:
                        torch.autograd.grad([outs[n] for n in op.grad_outputs], [values[a] for a in op.grad_inputs],
                                            [values[f"d{n}"] for n in op.grad_outputs], allow_unused=True)
                    if backend.current() == "cuda":
                        torch.cuda.synchronize()
                print(f"{name:28s} {impl.name:28s} {str(dtype).replace('torch.', ''):9s} {len(cases)} cases, "
                      f"forward{' and backward' if op.grad_inputs and impl.supports_backward else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
