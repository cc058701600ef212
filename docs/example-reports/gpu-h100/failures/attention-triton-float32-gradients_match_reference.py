"""Standalone reproducer for attention-triton-float32-gradients_match_reference (written by the suite; no pytest or Hypothesis needed).

Run from the suite's checkout:  python attention-triton-float32-gradients_match_reference.py   (or: python -m tritoncheck.replay attention-triton-float32-gradients_match_reference.json)
"""
import importlib
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, "/work/main")  # the suite's checkout, for kernels/, references/, properties/
os.environ.setdefault("TRITON_INTERPRET", "1" if "cuda" == "interpret" else "0")
import numpy as np  # noqa: E402
import torch  # noqa: E402


def load(target):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


device = "cuda" if "cuda" == "cuda" else "cpu"
inputs = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in torch.load(HERE / "attention-triton-float32-gradients_match_reference.pt").items()}
args = [inputs[a] for a in ('q', 'k', 'v', 'causal', 'sm_scale')]
impl, reference = load("tritoncheck.kernels.attention:attention"), load("tritoncheck.references.attention:attention")
got = impl(*args, **{})
got = got if isinstance(got, tuple) else (got,)
expected = reference(*[a.detach().cpu().double().numpy() if torch.is_tensor(a) and a.is_floating_point()
                       else (a.cpu().numpy() if torch.is_tensor(a) else a) for a in args])
expected = expected if isinstance(expected, tuple) else (expected,)
for name, g, e in zip(('o', 'lse'), got, expected):
    g = g.detach().cpu().double().numpy()
    err = np.where(np.isfinite(e) & np.isfinite(g), np.abs(g - e), np.where(np.isnan(e) == np.isnan(g), 0.0, np.inf))
    i = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
    print(f"attention output {name}: max |error| {err.max() if err.size else 0:.3g} at {list(map(int, i))} "
          f"(expected {e[i] if err.size else 0:.9g}, got {g[i] if err.size else 0:.9g})")
print("replaying the failed check, gradients_match_reference:")
from tritoncheck import replay  # noqa: E402

sys.exit(replay.main([str(HERE / "attention-triton-float32-gradients_match_reference.json")]))
