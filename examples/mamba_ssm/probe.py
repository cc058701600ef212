"""Standalone probes of mamba-ssm's ``mamba_chunk_scan_combined`` for what the adapter's docstring
found by reading (docs/third-party/mamba_ssm.md), against the project's fp64 reference.

    PYTHONPATH=.:examples/mamba_ssm:MAMBA_SRC python examples/mamba_ssm/probe.py

On a GPU, or on the CPU under the Triton interpreter (selected when torch sees no GPU; the
adapter's CPU-tensor guard and config 0 of every autotuned kernel, as the suite pins them).
Each probe prints ``ok`` or ``DIFF`` (mamba differs from the contract) with the figures;
exit 1 if any printed DIFF.

- ``packed+initial``: packed sequences with mamba's one initial state (it belongs to the
  sequence numbered 0, the others start from zero), mamba called directly (the adapter
  refuses the case): its per-sequence final state of sequence 0 against the fp64
  recurrence, when sequence 0 ends inside the first chunk and when it runs past it.
- ``softplus``: one token, x = B = C = 1, dt = 0, dt_bias = v, softplus on: the final state is
  the step softplus(v) itself; its relative error for v from -2 to -20, float32.
- ``packed, empty first``: cu_seqlens starting [0, 0, ...] through the adapter: y and the
  per-sequence final states (the empty one must be zero).
- ``no tokens``: mamba called directly with T = 0 and an initial state (the adapter refuses
  it), in a child process (on the interpreter it crashed the process; on a GPU a fault would
  end the CUDA context): the final state must be the initial state.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import torch

from tritoncheck import backend

backend.select("auto")  # before triton's import: the interpreter without a GPU

import adapters  # noqa: E402  (examples/mamba_ssm on PYTHONPATH)
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined  # noqa: E402

from tritoncheck.autotune_configs import pinned_all  # noqa: E402
from tritoncheck.references.ssd_scan import ssd_scan as reference  # noqa: E402

DEVICE = backend.device()
INTERPRETING = backend.current() == "interpret"
CHUNK = 16 if INTERPRETING else 64  # small on the CPU: the interpreter is slow
diffs = []


def report(name: str, ok: bool, detail: str) -> None:
    print(f"{name}: {'ok' if ok else 'DIFF'}: {detail}")
    if not ok:
        diffs.append(name)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def numpy(t):
    return None if t is None else t.detach().cpu().double().numpy()


def packed_initial_state() -> None:
    H, P, N = 2, 16, 16
    for first in (CHUNK // 2, CHUNK + CHUNK // 2):  # sequence 0 ends inside the first chunk / past it
        cu = [0, first, first + CHUNK, first + 2 * CHUNK + 3]
        T = cu[-1]
        x, B, C = randn(1, T, H, P), randn(1, T, 1, N), randn(1, T, 1, N)
        dt, A, h0 = torch.rand(1, T, H, device=DEVICE) * 0.1, -torch.rand(H, device=DEVICE), randn(1, H, P, N)
        cu_t = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
        seq_idx = adapters._sequence_index(cu_t, T)  # the adapter's own cu_seqlens -> seq_idx
        y, _, states = mamba_chunk_scan_combined(x, dt, A, B, C, CHUNK, initial_states=h0, seq_idx=seq_idx,
                                                 cu_seqlens=cu_t, return_final_states=True, return_varlen_states=True)
        h0s = np.zeros((len(cu) - 1, H, P, N))
        h0s[0] = numpy(h0[0])
        y_ref, s_ref = reference(numpy(x), numpy(dt), numpy(A), numpy(B), numpy(C), initial_state=h0s,
                                 cu_seqlens=np.array(cu))
        y_err = np.abs(numpy(y) - y_ref).max() / np.abs(y_ref).max()
        errs = [np.abs(numpy(states[i]) - s_ref[i]).max() / max(np.abs(s_ref[i]).max(), 1e-30) for i in range(3)]
        where = "inside the first chunk" if first < CHUNK else "past the first chunk"
        report(f"packed+initial, sequence 0 of {first} tokens ({where}, chunk {CHUNK})", max(errs) < 1e-3,
               f"y rel error {y_err:.1e}; final state rel error per sequence {', '.join(f'{e:.1e}' for e in errs)}")


def softplus_steps() -> None:
    v = torch.tensor([-2.0, -5.0, -8.0, -10.0, -12.0, -15.0, -16.0, -17.0, -20.0], device=DEVICE)
    H = v.numel()
    ones = torch.ones(1, 1, H, 16, device=DEVICE)
    _, state = adapters.ssd_scan(ones, torch.zeros(1, 1, H, device=DEVICE), -torch.ones(H, device=DEVICE),
                                 torch.ones(1, 1, 1, 16, device=DEVICE), torch.ones(1, 1, 1, 16, device=DEVICE),
                                 dt_bias=v, dt_softplus=True)
    step = state[0, :, 0, 0].double().cpu().numpy()
    exact = np.log1p(np.exp(v.double().cpu().numpy()))
    rel = np.abs(step - exact) / exact
    ulps = rel / 2.0**-24
    rows = ", ".join(f"v={a:g}: {r:.1e}" for a, r in zip(v.tolist(), rel))
    report("softplus of small steps, float32", ulps.max() < 64, f"relative error of the step {rows}")


def packed_empty_first() -> None:
    H, P, N = 2, 16, 16
    cu = [0, 0, CHUNK + 5, CHUNK + 5, 2 * CHUNK + 9]
    T = cu[-1]
    x, B, C = randn(1, T, H, P), randn(1, T, 1, N), randn(1, T, 1, N)
    dt, A = torch.rand(1, T, H, device=DEVICE) * 0.1, -torch.rand(H, device=DEVICE)
    y, states = adapters.ssd_scan(x, dt, A, B, C, cu_seqlens=torch.tensor(cu, device=DEVICE), chunk_size=CHUNK)
    y_ref, s_ref = reference(numpy(x), numpy(dt), numpy(A), numpy(B), numpy(C), cu_seqlens=np.array(cu))
    y_err = np.abs(numpy(y) - y_ref).max() / np.abs(y_ref).max()
    s_err = max(np.abs(numpy(states[i]) - s_ref[i]).max() / max(np.abs(s_ref).max(), 1e-30) for i in range(len(cu) - 1))
    empty = [float(states[i].abs().max()) for i in (0, 2)]
    report(f"packed, empty first sequence, cu_seqlens {cu}", y_err < 1e-3 and s_err < 1e-3 and max(empty) == 0,
           f"y rel error {y_err:.1e}, final states rel error {s_err:.1e}, largest |state| of the empty ones {empty}")


def no_tokens_child() -> int:
    """In the child: T = 0 with an initial state; prints the largest |final state - initial state|."""
    H, P, N = 2, 16, 16
    h0 = randn(1, H, P, N)
    dt, A = torch.rand(1, 0, H, device=DEVICE), -torch.ones(H, device=DEVICE)
    _, final = mamba_chunk_scan_combined(randn(1, 0, H, P), dt, A, randn(1, 0, 1, N), randn(1, 0, 1, N), CHUNK,
                                         initial_states=h0, return_final_states=True)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    print(f"{float((final.float() - h0).abs().max())}")
    return 0


def no_tokens() -> None:
    done = subprocess.run([sys.executable, __file__, "--no-tokens-child"], capture_output=True, text=True,
                          env=dict(os.environ), timeout=600)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode < 0:
        report("no tokens (T = 0) with an initial state", False, f"the process died of signal {-done.returncode}")
    elif done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["?"])[-1]
        report("no tokens (T = 0) with an initial state", False, f"exit {done.returncode}: {error}")
    else:
        off = float(last)
        report("no tokens (T = 0) with an initial state", off == 0.0,
               f"largest |final state - initial state| {off:.3g} (must be 0)")


def main() -> int:
    child = sys.argv[1:] == ["--no-tokens-child"]
    torch.manual_seed(0)
    if INTERPRETING:
        adapters._allow_cpu_tensors()
    if not child:
        print(f"device {DEVICE} ({backend.current()}), chunk {CHUNK}, mamba_ssm state_dtype argument: "
              f"{adapters.HAS_STATE_DTYPE}")
    with pinned_all(adapters.ssd_scan, 0):
        if child:
            return no_tokens_child()
        for probe in (packed_initial_state, softplus_steps, packed_empty_first, no_tokens):
            probe()
    print(f"{len(diffs)} probe(s) differ from the contract" if diffs else "every probe ok")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
