"""An agent loop with tritoncheck.verify as its reward: candidates in, verdicts out.

    python examples/agent_loop.py

A kernel-writing agent writes each candidate to a file and asks for a verdict; a
failed verdict's message, case and replay command go back into the next prompt. The
candidates below stand in for an agent's drafts: a cache that games a one-call check,
one that crashes its process, and a correct one. Each verify() runs in its own child
process, so a crashing draft costs a verdict, not the loop. Without ``seed=`` every
call draws fresh cases (held out: a draft cannot be tuned to the last call's draws);
the verdict carries the seed, so ``verify(..., seed=verdict.seed)`` replays them.

The guard at the bottom is required: verify spawns its child, which imports this file.
"""
import sys
import tempfile
from pathlib import Path

import tritoncheck

DRAFTS = {
    "draft_cached": '''
import torch
_cache = {}
def softmax(x, temperature=1.0):
    key = (tuple(x.shape), tuple(x.stride()), x.dtype, temperature)
    if key not in _cache:
        _cache[key] = torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)
    return _cache[key].clone()
softmax.supports_backward = False
''',
    "draft_crashing": '''
import ctypes
import torch
def softmax(x, temperature=1.0):
    if x.shape[-1] > 7:
        ctypes.string_at(0)   # stands in for a kernel that reads through a wild pointer
    return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)
softmax.supports_backward = False
''',
    "draft_correct": '''
import torch
def softmax(x, temperature=1.0):
    return torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)
softmax.supports_backward = False
softmax.uses_triton = False
''',
}


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="agent-loop-"))
    sys.path.insert(0, str(workdir))  # the spawned child gets this sys.path too
    feedback = None
    for name, source in DRAFTS.items():
        # a real loop would put `feedback` into the prompt that writes this draft
        (workdir / f"{name}.py").write_text(source)
        verdict = tritoncheck.verify("softmax", f"{name}:softmax", budget_s=300, max_examples=5,
                                     dtypes=("float32",), report_dir=workdir / f"report-{name}")
        print(verdict.summary(), end="\n\n")
        if verdict.passed:
            print(f"accepted {name}: {len(verdict.checks_run)} checks passed; report {verdict.report}")
            return 0
        feedback = f"{verdict.failure.message}\n{verdict.failure.case or ''}\n{verdict.failure.replay or ''}"
    print(f"no draft passed; last feedback:\n{feedback}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
