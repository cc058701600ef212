"""mamba-ssm's Triton SSD kernel behind the tritoncheck contract (docs/third-party/mamba_ssm.md).

    PYTHONPATH=.:examples/mamba_ssm:MAMBA_SRC python -m pytest tests/test_checks.py --op ssd_scan \\
        --impl ssd_scan=adapters:ssd_scan ...

MAMBA_SRC: the folder ``examples/mamba_ssm/assemble.py`` builds from a mamba-ssm source (the
Triton SSD files only: ``import mamba_ssm`` itself needs the CUDA extension). Line numbers
below are of mamba-ssm at commit e9594ce (``__version__`` 2.3.2.post1, 2026-07-23), in
``mamba_ssm/ops/triton/`` unless named otherwise.

What is mapped. The contract is ``mamba_chunk_scan_combined``'s convention (docs/contract.md):
``ssd_scan`` calls ``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=D, z=z,
dt_bias=dt_bias, initial_states=initial_state, seq_idx=..., cu_seqlens=..., dt_softplus=...,
dt_limit=(dt_min, dt_max), return_final_states=True, return_varlen_states=...)`` and returns
``(y, final_state)`` with the state as float32:

- Packed sequences (``cu_seqlens``, batch 1, S > 1 sequences): mamba takes them as ``seq_idx``
  [1, T] int32 (the sequence of each token; built here from cu_seqlens) for the scan, and
  ``cu_seqlens`` with ``return_varlen_states=True`` for the per-sequence final states
  (``chunk_state_varlen``, ssd_combined.py:391-394; without return_varlen_states mamba drops
  cu_seqlens, ssd_combined.py:601-602). The state ``final_states`` it returns beside them is
  the last sequence's only. One sequence (cu_seqlens [0, T]) is an unpacked call.
- ``chunk_size`` (beyond the contract, like ``controls/ssd_scan.py``'s chunked control) is
  passed through: default 256, Mamba2's (modules/mamba2.py:59), or ``MAMBA_CHUNK_SIZE``
  from the environment at import; ``chunk_sizes`` declares 256, 128, 64, 32, 16. mamba
  states no constraint on it (no assert; its cumsum block is next_power_of_2(chunk_size),
  ssd_chunk_state.py:739, every other kernel masks a partial chunk); its tests use 64 and
  128 (tests/ops/triton/test_ssd.py:28). The suite's T is at most 70 on the CPU and 1024 on
  a GPU: 16 and 32 make the inter-chunk state passing run at CPU sizes.
- ``ssd_scan_fp32_states``: the same with ``state_dtype=torch.float32`` (added after 2.3.2.post1,
  ssd_combined.py:628, PR #972): mamba stores the chunk-start states, and so the
  per-sequence final states and the backward's states, in C's dtype by default
  (ssd_combined.py:382, 468-469, 483). Refused (NotImplementedError) by a mamba without it.

What is declared, and why:

- ``dtypes`` float32, float16, bfloat16 (mamba's tests run all three).
- ``fp32_dot_precision = "tf32"``: no ``tl.dot`` of the SSD path names an input precision
  (ssd_bmm.py:78, ssd_chunk_scan.py:118, 150, ssd_chunk_state.py:254, ...), so float32
  operands run Triton's default, tf32 on the GPU.
- ``bf16_dot_upcast = False``: half operands reach ``tl.dot`` in their dtype (C times the
  states cast to C's dtype, ssd_chunk_scan.py:117-118; the decayed scores cast to x's,
  :148-150; B times its decay cast to x's, ssd_chunk_state.py:253-254), so the suite skips
  bfloat16 on the interpreter, which has no bf16 tl.dot.
- ``chunk_sizes`` (above); ``supports_backward`` True on the GPU (MambaChunkScanCombinedFn,
  ssd_combined.py:596-625), False on the interpreter (below).
- ``autotuned``: every ``triton.autotune``'d kernel of the imported mamba_ssm modules (25:
  the SSD path's forward and backward kernels, keyed on chunk_size, hdim, dstate, nheads or
  dim, each 6-11 configs; the gated-norm and swiglu kernels of the same files come along,
  never launched), so ``--autotune-config I`` pins them and the interpreter never times one.
- ``refuses``: the NotImplementedErrors below, each raised before mamba runs.

Refused, with the reason (NotImplementedError, declared in ``refuses``):

- An initial state with packed sequences (S > 1): mamba takes one initial state per batch
  row (``initial_states`` [batch, H, P, N], ssd_combined.py:369), so with the packed
  sequences in batch row 0 only the sequence numbered 0 starts from it (state passing
  starts at seq_idx 0 and zeroes the state where seq_idx changes, ssd_state_passing.py:71-80;
  the chunk scan reads the carried state only where a token's seq_idx is the previous
  chunk's, ssd_chunk_scan.py:97-113); the contract gives each sequence its own.
- A gradient with packed sequences: mamba's backward asserts ``not return_varlen_states``
  (ssd_combined.py:622), and the per-sequence final states exist only with it.
- No tokens (T = 0; the suite's separate calls of an empty packed sequence): mamba's state
  passing stores the initial state into chunk 0 of an output with no chunks
  (ssd_state_passing.py:69, out [batch, 0, H, P N] from :207) and never writes the final
  state (its loop over chunks, :72, runs no iteration): a write out of bounds, which
  crashed the interpreter's process (segfault) in packed_equals_separate_calls, and on a
  GPU writes through an empty tensor's pointer. ``probe.py`` runs it in a child process.
- On the Triton interpreter, a gradient: the backward reads
  ``torch.cuda.get_device_properties(...).multi_processor_count`` (ssd_chunk_state.py:937,
  ssd_chunk_scan.py:1485, 1534), which needs a CUDA device.

Contract differences found by reading (none refused; the checks judge them):

- The step: ``clamp(softplus?(dt + dt_bias), dt_min, dt_max)`` in fp32, the contract's order
  (ssd_chunk_state.py:72-80), the clamp always (``dt_limit`` default (0, inf) clamps a
  negative step to 0 as the contract does). softplus is ``log(exp(v) + 1)`` in fp32 with
  Triton >= 3 (softplus.py:5-11; ``log1p(exp(v))`` before), and ``v`` itself past 20
  (ssd_chunk_state.py:77): for v below about -5, 1 + exp(v) rounds away the small step's
  digits (v = -10: a relative error up to 1e-3 in the step; v < -16.6: exp(v) < 2**-24 and
  the step is 0), where the contract's softplus is exact. The threshold at 20 costs less
  than fp32's rounding. The backward's clamp mask is 0 strictly outside [dt_min, dt_max]
  (ssd_chunk_state.py:152-158): the contract's subgradient.
- D: the contract's D is [H]; mamba also takes [H, P] (ssd_combined.py:355), not drawn.
- States: the chunk states and the carried state are fp32, the final state fp32
  (ssd_state_passing.py:208), but the chunk-start states the outputs read are stored in
  C's dtype (ssd_combined.py:382) and cast to it again before the dot (ssd_chunk_scan.py:117);
  with packed sequences the per-sequence final states come from those stored states and
  are in C's dtype (ssd_chunk_state.py:1029): float16/bfloat16 final states, cast to
  float32 here (``ssd_scan_fp32_states`` keeps them fp32).
- Packed sequences and an initial state (refused above): besides the contract difference,
  mamba's per-sequence final state of sequence 0 leaves the initial state out when that
  sequence ends inside the first chunk (``chunk_state_varlen`` has no initial-state argument
  and adds the carried state only for a sequence that started before its last chunk,
  ssd_chunk_state.py:700-706), while y and a longer sequence 0 include it:
  ``examples/mamba_ssm/probe.py`` shows it.
- Packed sequences share a chunk's cumulative sum of d A (ssd_chunk_state.py:84-85, no
  seq_idx there): a later sequence's decays exp(dA_cs_i - dA_cs_j) (ssd_chunk_scan.py:142)
  are differences of sums that include the earlier sequences' log decays, so they lose
  float32 digits when those are large (packed_equals_separate_calls found it on the CPU).
- A zero-length first sequence (cu_seqlens [0, 0, ...]): ``chunk_state_varlen`` computes
  its chunk as (0 - 1) // chunk_size = -1 and loads dA_cumsum one element before the
  buffer's start (ssd_chunk_state.py:662, 675); the value is masked out, so the state is
  right (zero), but the load is out of bounds (the suite's memory-safety run can see it).
- Determinism: unless ``MAMBA_DETERMINISTIC=1`` (or torch's deterministic algorithms,
  utils/determinism.py:21-27), the backward sums dA, d dt_bias, d dt and dD with
  ``tl.atomic_add`` over chunks and tiles (ssd_chunk_state.py:167, 174;
  ssd_combined.py:248, 254; ssd_chunk_scan.py:604, 737): not bitwise repeatable where
  several programs add to one address (more than one chunk or tile).

On the Triton interpreter (a CPU run): mamba's kernels run there, pinned to one autotune
config (the suite pins every kernel in ``autotuned``; unpinned, the autotuner's timing
needs a GPU driver: ``RuntimeError: 0 active drivers``). Its host code, though, enters
``torch.cuda.device(x.device.index)`` around every launch (e.g. ssd_chunk_state.py:727),
which raises ``TypeError`` for a CPU tensor's index None on a CPU-only torch (with a GPU,
None means the current device: a no-op): under the interpreter the adapter makes
``torch.cuda.device(None)`` a no-op (:func:`_allow_cpu_tensors`, as the project's own kernels skip the guard for CPU
tensors), nothing else. The backward is refused there (above).
"""
from __future__ import annotations

import contextlib
import inspect
import math
import os

import torch
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

from tritoncheck import backend
from tritoncheck.autotune_configs import autotuners_in

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CHUNK_SIZES = (256, 128, 64, 32, 16)
DEFAULT_CHUNK_SIZE = int(os.environ.get("MAMBA_CHUNK_SIZE", "256"))
HAS_STATE_DTYPE = "state_dtype" in inspect.signature(mamba_chunk_scan_combined).parameters

# the refusals' own words (declared in `refuses` below)
_PACKED_INITIAL = "mamba_ssm takes one initial state per batch row"
_PACKED_GRADIENT = "mamba_ssm has no backward for per-sequence final states"
_INTERPRETER_GRADIENT = "mamba_ssm's backward needs a CUDA device"
_NO_STATE_DTYPE = "this mamba_ssm has no state_dtype argument"
_NO_TOKENS = "mamba_ssm writes out of bounds with no tokens"


def _interpreting() -> bool:
    return backend.current() == "interpret"


def _allow_cpu_tensors() -> None:
    """Make ``torch.cuda.device(None)`` (a CPU tensor's device index) a no-op, as it is where
    torch sees a GPU (None: the current device); any other index goes to torch's own.
    Interpreter runs only."""
    device = torch.cuda.device
    if getattr(device, "_tritoncheck_cpu_guard", False):
        return

    def cuda_device(index):
        return contextlib.nullcontext() if index is None else device(index)

    cuda_device._tritoncheck_cpu_guard = True
    torch.cuda.device = cuda_device


def _wants_gradient(tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _sequence_index(cu_seqlens: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """mamba's ``seq_idx`` [1, T] int32: the number of the packed sequence each token is in."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    numbers = torch.arange(lengths.numel(), dtype=torch.int32, device=cu_seqlens.device)
    return torch.repeat_interleave(numbers, lengths, output_size=n_tokens).unsqueeze(0)


def _scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens, chunk_size,
          extra):
    tensors = (x, dt, A, B, C, D, z, dt_bias, initial_state)
    if x.shape[1] == 0:
        raise NotImplementedError(
            f"{_NO_TOKENS} (T = 0: _state_passing_fwd_kernel stores the initial state into chunk 0 of its "
            "0-chunk output, ssd_state_passing.py:69, and never writes the final state): not called")
    if _interpreting():
        if _wants_gradient(tensors):
            raise NotImplementedError(f"{_INTERPRETER_GRADIENT} (torch.cuda.get_device_properties in "
                                      "ssd_chunk_state.py's _chunk_state_bwd_db): no gradient under the interpreter")
        _allow_cpu_tensors()
    packed = cu_seqlens is not None and cu_seqlens.numel() > 2  # one sequence: an unpacked call
    seq_idx = None
    if packed:
        if initial_state is not None:
            raise NotImplementedError(
                f"{_PACKED_INITIAL} (initial_states [batch, H, P, N]): with {cu_seqlens.numel() - 1} packed "
                "sequences only the first would start from it, the contract gives each its own")
        if _wants_gradient(tensors):
            raise NotImplementedError(f"{_PACKED_GRADIENT} (return_varlen_states=True: MambaChunkScanCombinedFn."
                                      "backward asserts it is False)")
        seq_idx = _sequence_index(cu_seqlens, x.shape[1])
    outs = mamba_chunk_scan_combined(
        x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_state, seq_idx=seq_idx,
        cu_seqlens=cu_seqlens if packed else None, dt_softplus=dt_softplus, dt_limit=(float(dt_min), float(dt_max)),
        return_final_states=True, return_varlen_states=packed, **extra)
    # (out, final_states) or, packed, (out, final_states of the last sequence, the per-sequence states)
    return outs[0], outs[-1].to(torch.float32)


def ssd_scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0, dt_max=math.inf,
             initial_state=None, cu_seqlens=None, chunk_size=DEFAULT_CHUNK_SIZE):
    """``mamba_chunk_scan_combined`` with mamba's defaults (module docstring): ``(y, final_state)``."""
    return _scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens, chunk_size,
                 {})


def ssd_scan_fp32_states(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0,
                         dt_max=math.inf, initial_state=None, cu_seqlens=None, chunk_size=DEFAULT_CHUNK_SIZE):
    """:func:`ssd_scan` with ``state_dtype=torch.float32``: the stored states in fp32."""
    if not HAS_STATE_DTYPE:
        raise NotImplementedError(f"{_NO_STATE_DTYPE} (added after 2.3.2.post1, state-spaces/mamba#972)")
    return _scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, cu_seqlens, chunk_size,
                 {"state_dtype": torch.float32})


# The autotuned kernels the adapters launch: every autotuned kernel of the imported mamba_ssm
# modules (--autotune-config I runs config I of each; the suite pins them in turn otherwise).
for _fn in (ssd_scan, ssd_scan_fp32_states):
    _fn.dtypes = _DTYPES
    _fn.fp32_dot_precision = "tf32"  # no tl.dot of the SSD path names an input precision
    _fn.bf16_dot_upcast = False  # half operands reach tl.dot in their dtype
    _fn.chunk_sizes = CHUNK_SIZES
    _fn.supports_backward = not _interpreting()  # the backward queries the CUDA device's SM count
    _fn.autotuned = autotuners_in("mamba_ssm")
    # the refusals' messages, plain words (no regex metacharacters)
    _fn.refuses = (_PACKED_INITIAL, _PACKED_GRADIENT, _INTERPRETER_GRADIENT, _NO_STATE_DTYPE, _NO_TOKENS)
