"""Planted memory-safety bugs, for the memory checker rather than the self-test.

A store past the end of an output changes no value the suite compares when the
bytes it clobbers belong to no tensor the check reads, so no property is sure to
catch it; ``compute-sanitizer --tool memcheck`` is (``scripts/memcheck.sh`` runs it
over every project kernel and over the mutants here, and expects these flagged).
This module is not a family module, so the self-test does not hunt it.
"""
from __future__ import annotations

from tritoncheck.kernels import elementwise as _kernel
from tritoncheck.mutation import mutant

__all__ = ["store_past_the_end"]

store_past_the_end = mutant(
    "swiglu",
    _kernel,
    [("tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=mask)", "tl.store(Y + idx, y.to(Y.dtype.element_ty))")],
    name="store_past_the_end",
    bug=(
        "The forward's store drops its mask, so the last program writes up to BLOCK - 1 "
        "elements past the end of y (the missing-mask bug of a hand-written tail). The values "
        "inside y are right. Triggered by any M * N that is not a multiple of the block."
    ),
    kills=("memcheck",),  # not a registry check: compute-sanitizer's memcheck must report it
)
