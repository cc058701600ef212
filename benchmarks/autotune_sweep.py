"""Run the reference checks once per autotune config of a kernel: a config wrong only at some sizes shows.

    python benchmarks/autotune_sweep.py --impl attention=mykernels.fa:flash_attention \\
        [--check matches_reference --check gradients_match_reference] [--dtype float16] [--examples 50]

The implementation declares its autotuned kernels as ``fn.autotuned = (kernel, ...)``
(tritoncheck/autotune_configs.py). For each kernel and each of its configs, pinned alone,
every check is hunted in every dtype with the self-test's seeded streams; one line per
(kernel, config, check, dtype): pass, or FAIL with the first line of the failure. Exits 1
when any config fails.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the interpreter's numpy chatter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", required=True, metavar="OP=module:function")
    parser.add_argument("--check", action="append", default=[])
    parser.add_argument("--dtype", action="append", default=[])
    parser.add_argument("--examples", type=int, default=50)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()

    from tritoncheck import backend
    backend.select(args.backend)
    import torch

    from tritoncheck import autotune_configs, registry, selfcheck
    op_name, _, target = args.impl.partition("=")
    impl = registry.register_implementation(op_name, target)
    op = registry.load()[op_name]
    checks = [c for c in op.checks if c.name in (args.check or ("matches_reference", "gradients_match_reference"))]
    dtypes = [getattr(torch, d) for d in args.dtype] or list(op.dtypes)
    kernels = autotune_configs.autotuned_kernels(impl.fn)
    if not kernels:
        parser.error(f"{target} declares no autotuned kernels (set {target.rpartition(':')[2]}.autotuned)")
    failed = 0
    for kernel in kernels:
        for config in list(kernel.configs):
            with autotune_configs.pinned(kernel, config):
                for check in checks:
                    for dtype in dtypes:
                        if selfcheck.runnable(op, impl, check, dtype):
                            continue
                        verdict = selfcheck.hunt(op, impl, check, dtype, args.examples)
                        failed += verdict.failed
                        text = ("FAIL " + verdict.text.splitlines()[0]) if verdict.failed else "pass"
                        print(f"{autotune_configs.name(kernel)}  {config}  {check.name}  "
                              f"{str(dtype).replace('torch.', '')}: {text}", flush=True)
    print(f"{failed} failing (config, check, dtype) hunts")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
