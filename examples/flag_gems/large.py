"""The large-index check (tritoncheck/large_index.py) on one adapter, in its own process:

    python examples/flag_gems/large.py varlen_attention adapters:varlen_attention

``pytest tests/test_large_index.py -m large --impl ...`` deselects every test (the plugin
keeps only the suite's checks under --impl), so this calls the check the same way that
test does: the op's input past 2**31 elements, its sampled slices against the fp64
reference, in bfloat16. Exit 0: every slice matched; 1: one did not (the message says
which); a CUDA error (a wild offset) ends the process, which is why each op runs alone.
"""
from __future__ import annotations

import sys

import torch

from tritoncheck import backend, large_index, registry

backend.select("auto")


def main(op: str, target: str) -> int:
    impl = registry.Implementation.of(op, registry.resolve(target), kind="user", target=target)
    if backend.current() != "cuda":
        print(f"{op}: not run, the large-index check needs a GPU")
        return 0
    free, _ = torch.cuda.mem_get_info()
    need = large_index.bytes_needed(op, torch.bfloat16)
    if free < need:
        print(f"{op}: not run, needs about {need / 2**30:.0f} GiB of GPU memory, {free / 2**30:.0f} GiB free")
        return 0
    try:
        compared = large_index.check(op, impl, torch.bfloat16, backend.device())
    except AssertionError as exc:
        print(f"{op} {target}: FAILED past 2**31 elements: {exc}")
        return 1
    print(f"{op} {target}: {compared} slices past 2**31 elements match the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
