"""Which backend runs the kernels, and what each backend is known not to do.

The Triton interpreter must be chosen before ``triton`` is first imported (it reads
``TRITON_INTERPRET`` at import), so :func:`select` is called from the plugin's
``pytest_configure``, before any test module (and so any kernel) is imported.
This module itself never imports triton.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

BACKENDS = ("auto", "cuda", "interpret")
_selected: str | None = None


def select(choice: str = "auto") -> str:
    """Resolve ``choice`` to ``"cuda"`` or ``"interpret"`` and set up the environment."""
    global _selected
    if choice not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {choice!r}")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "interpret"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--backend cuda was asked for, but torch sees no CUDA device")
    want = "1" if choice == "interpret" else "0"
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") != want:
        raise RuntimeError(
            "triton was imported before the backend was chosen; TRITON_INTERPRET "
            "must be set before the first `import triton`"
        )
    os.environ["TRITON_INTERPRET"] = want
    _selected = choice
    return choice


def current() -> str:
    """The selected backend; selects ``auto`` if nothing chose one yet (scripts, replays)."""
    return _selected or select(os.environ.get("TRITONCHECK_BACKEND", "auto"))


def device() -> torch.device:
    return torch.device("cuda" if current() == "cuda" else "cpu")


@dataclass(frozen=True)
class BackendLimit:
    """A known limitation of a backend, turned into a skip with its reason."""

    backend: str
    dtype: torch.dtype
    ops: tuple[str, ...]
    reason: str
    # An implementation that sets this attribute to True on its function declares it
    # avoids the limitation (e.g. it upcasts bf16 before tl.dot).
    waived_by: str | None = None

    def applies(self, backend: str, op: str, dtype: torch.dtype, fn=None) -> bool:
        if self.waived_by and getattr(fn, self.waived_by, False):
            return False
        if getattr(fn, "uses_triton", True) is False:  # plain PyTorch: no interpreter involved
            return False
        return backend == self.backend and dtype == self.dtype and op in self.ops


# The one table of backend limits. Facts seen on Triton 3.0 to 3.9 (design notes).
KNOWN_LIMITS: tuple[BackendLimit, ...] = (
    BackendLimit(
        "interpret",
        torch.bfloat16,
        ("attention", "linear_attention", "cp_attention", "fused_moe"),
        "the Triton interpreter holds bfloat16 as 16-bit integers, so tl.dot on bf16 "
        "operands returns garbage (triton#11584, #10919); bf16 dot kernels are checked on the GPU",
        waived_by="bf16_dot_upcast",
    ),
    BackendLimit(
        "interpret",
        torch.float8_e5m2,
        ("scaled_mm",),
        "the Triton interpreter's fp8 tl.dot decodes float8_e5m2 operands through float16 wrongly below the "
        "normals (2^-16 and 2^-15 read as 0, 3 * 2^-16 as 2^-15; Triton 3.9), while tl.load(...).to(tl.float32) "
        "reads every value right; e5m2 dot kernels are checked on the GPU",
        waived_by="e5m2_dot_upcast",
    ),
)


def limit_for(op: str, dtype: torch.dtype, fn=None, backend: str | None = None) -> BackendLimit | None:
    backend = backend or current()
    for limit in KNOWN_LIMITS:
        if limit.applies(backend, op, dtype, fn):
            return limit
    return None
