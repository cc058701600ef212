"""Kernels that take their process down, for tests/test_verify.py: a verify() call on each
must end in a failed verdict naming what happened while the caller lives on."""
import ctypes
import time

import torch
import triton
import triton.language as tl


def segfaulting_softmax(x, temperature=1.0):
    """Reads address 0: SIGSEGV on the first call."""
    ctypes.string_at(0)
    return torch.softmax(x / temperature, dim=-1)


def hanging_softmax(x, temperature=1.0):
    """Never returns (a spin on a flag that no one sets, as a kernel waiting on a lock would)."""
    while True:
        time.sleep(0.05)


@triton.jit
def _store_past_the_end(Y, N, SPAN: tl.constexpr):
    # the mask is missing: SPAN elements are stored from Y whatever N is
    offs = tl.program_id(0).to(tl.int64) * SPAN + tl.arange(0, SPAN)
    tl.store(Y + offs, tl.full((SPAN,), 1.0, tl.float32))


def oob_writing_softmax(x, temperature=1.0):
    """Computes the right answer, then a kernel stores 2**26 float32 (256 MiB) from the start
    of a 1-element tensor: under the interpreter, a write through the host heap past its end
    (on a GPU, an illegal memory access)."""
    y = torch.softmax(x.float() / temperature, dim=-1).to(x.dtype)
    scratch = torch.empty(1, dtype=torch.float32, device=x.device)
    _store_past_the_end[(64,)](scratch, 1, SPAN=2**20)
    return y
