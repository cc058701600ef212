"""How the project's launched kernels are compiled: one variant per combination of
constexprs, whatever the runtime arguments hold.

Triton compiles a kernel again for each new pattern of its runtime arguments' values:
an integer divisible by 16 or equal to 1, a pointer aligned to 16 bytes. A fuzzing run
draws hundreds of layouts (strides, storage offsets, odd sizes), and almost every new
one is such a pattern: on an H100, 40 examples of attention's float32 `deterministic`
check took 108 s, nearly all of it compiling (a warm example costs about 0.1 s), and
the whole suite at 40 examples per test spent most of its 319 s compiling
(docs/speed.md). Compiled without value specialisation, a kernel's loads use the
strides as runtime values (no vectorisation proven from a stride of 1 or an aligned
base); the kernels are 0-3 % of an example's time, so the suite trades that for one
compile per constexpr combination. A production build would specialise.

Measured on an H100 (3 xdist workers, fresh Triton cache, 40 examples each of attention
float32 `deterministic`, attention float16 `gradients_match_reference` and linear
attention bfloat16 `inputs_unchanged`): 249 compiled kernels and 188 s specialised,
113 and 118 s without (commit after 2fcb99f).
"""
from __future__ import annotations

import inspect

import triton
import triton.language as tl


def _runtime_parameters(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.annotation not in (tl.constexpr, "tl.constexpr")]


def unspecialised_jit(fn):
    """``triton.jit(fn)`` with no value specialisation of its runtime arguments (integer
    divisibility or == 1, pointer alignment): see the module docstring."""
    names = _runtime_parameters(fn)
    return triton.jit(fn, do_not_specialize=names, do_not_specialize_on_alignment=names)
