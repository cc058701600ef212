"""PyTorch parity: the flash-attention test rule beside the derived tolerance.

For every op the same computation is run in plain PyTorch in the input dtype (no
upcast) on the same inputs (each op record's ``baseline``), and its largest error against the fp64
reference is the yardstick: each output's record carries the kernel's largest error,
PyTorch's, and their ratio, and each failure message says both ("PyTorch's own
float16 result is off by X here, the kernel by Y").

``--tolerance parity`` fails an output only when it fails the derived rule *and* its
largest error exceeds ``PARITY_FACTOR`` times PyTorch's on that input. The comparison
is per output (largest error over the output), not per element, as in
flash-attention's tests: PyTorch's error at one element is one sample of a rounding
that is as often 0 as not (a correctly rounded kernel 1 ulp off where PyTorch happens
to be exact would fail an element-wise rule), while its largest error over the output
measures what that dtype costs on that input. A NaN or infinity where the reference
has a finite value (or the reverse) counts as an infinite error, in the kernel and in
PyTorch alike. When the baseline itself cannot run (it raises), there is no yardstick
and the derived rule decides alone; the message says so.

The default mode stays ``derived``: parity admits whatever PyTorch gets wrong by the
same amount (fp16 prefix sums that overflow, a loss rounded to fp16), which the
derived rule catches. ``benchmarks/parity_modes.py`` measures which mutants each mode
kills.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from tritoncheck import oracle
from tritoncheck.config import CONFIG
from tritoncheck.oracle import Comparison

MODES = ("derived", "parity")
PARITY_FACTOR = 2.0


# -------------------------------------------------------------------- the baselines
#
# Each takes (case, values, outs): the case, its materialised inputs, and the
# implementation's outputs (dropout needs the keep mask it returned), and returns the
# outputs of plain PyTorch in the input dtype, in the op's output order.

def control_baseline(target: str) -> Callable:
    """The baseline that calls a plain-PyTorch control (``module:function``) on the case."""
    def baseline(case, values, outs):
        from tritoncheck.registry import resolve
        return case.call(resolve(target), values)
    baseline.__name__ = target.rpartition(":")[2]
    return baseline


# ------------------------------------------------------------------ the yardstick

@dataclass(frozen=True)
class Parity:
    """PyTorch's largest error on the same input beside the kernel's, for one output."""

    baseline_max_abs: float | None  # None: the baseline could not run (why in ``note``)
    kernel_max_abs: float
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """kernel / PyTorch (inf when PyTorch is exact and the kernel is not; 0 when both are)."""
        if self.baseline_max_abs is None:
            return None
        if self.baseline_max_abs == 0:
            return 0.0 if self.kernel_max_abs == 0 else math.inf
        return self.kernel_max_abs / self.baseline_max_abs

    def within(self) -> bool:
        """The kernel's error is within PARITY_FACTOR of PyTorch's (False without a yardstick)."""
        if self.baseline_max_abs is None:
            return False
        return self.kernel_max_abs <= PARITY_FACTOR * self.baseline_max_abs


def _error(c: Comparison) -> float:
    return math.inf if c.special_mismatches else c.max_abs


# PyTorch's error is measured, not judged: the oracle's comparison with the largest finite
# allowance (an infinite one is a suite bug to the oracle, tritoncheck/oracle.py).
MEASURE_ONLY = float(np.finfo(np.float64).max)


def baseline_errors(op: str, dtype: torch.dtype, case, values: Mapping[str, Any], outs: Mapping[str, torch.Tensor],
                    expected: Mapping[str, np.ndarray]) -> dict[str, float | str]:
    """PyTorch's largest error per output of ``expected`` on the same inputs, or the reason it has none."""
    from tritoncheck.registry import OPS
    spec = OPS[op]
    if spec.baseline is None:
        return {name: f"{op}'s record has no plain-PyTorch baseline" for name in expected}
    try:
        with torch.no_grad():
            got = spec.unpack(spec.baseline(case, values, outs))
        return {name: _error(oracle.compare(name, got[name], expected[name], MEASURE_ONLY,
                                            dtype=spec.output_dtypes.get(name, dtype)))
                for name in expected}
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot run leaves the derived rule alone
        return {name: f"plain PyTorch could not run here ({type(exc).__name__}: {exc})" for name in expected}


def baseline_grad_errors(op: str, case, values: Mapping[str, Any], expected: Mapping[str, np.ndarray]
                         ) -> dict[str, float | str]:
    """PyTorch's largest gradient error per differentiable input (keys ``d<input>``)."""
    from tritoncheck.registry import OPS
    spec = OPS[op]
    present = spec.present_grad_inputs(values)
    names = [f"d{n}" for n in present]
    if spec.baseline is None:
        return {name: f"{op}'s record has no plain-PyTorch baseline" for name in names}
    args = {k: (v.detach().clone().requires_grad_(k in present) if isinstance(v, torch.Tensor) else v)
            for k, v in values.items()}
    try:
        with torch.enable_grad():
            outs = spec.unpack(spec.baseline(case, args, {}))
            grads = torch.autograd.grad([outs[n] for n in spec.grad_outputs], [args[n] for n in present],
                                        [values[f"d{n}"] for n in spec.grad_outputs], allow_unused=True)
    except Exception as exc:  # noqa: BLE001 - as above
        return {name: f"plain PyTorch's backward could not run here ({type(exc).__name__}: {exc})" for name in names}
    out = {}
    for n, g in zip(present, grads):
        try:
            out[f"d{n}"] = _error(oracle.compare(f"d{n}", g, expected[n], MEASURE_ONLY, dtype=values[n].dtype))
        except (AssertionError, TypeError) as exc:  # no gradient (None), or one of another shape
            out[f"d{n}"] = f"plain PyTorch's gradient cannot be compared ({exc})"
    return out


def assert_close(output: str, got: torch.Tensor, expected: np.ndarray, allowed, baseline: float | str,
                 dtype: torch.dtype, what: str = "does not match the fp64 reference",
                 computed_in: torch.dtype | None = None, rule: str | None = None,
                 noise: np.ndarray | float = 0.0, unconstrained: np.ndarray | None = None) -> Comparison:
    """:func:`oracle.assert_close` with PyTorch's error beside it: recorded for the report,
    quoted in the failure message, and in ``--tolerance parity`` mode the second
    condition a failure needs. ``computed_in``: the dtype PyTorch computed in (the
    input dtype; default ``dtype``, the output's), for the message. ``noise``: the
    reference's own error, ``unconstrained`` the elements the rule says no result pins
    down, as for ``oracle.compare``."""
    c = oracle.compare(output, got, expected, allowed, dtype, rule, noise, unconstrained)
    figures = Parity(baseline if not isinstance(baseline, str) else None, _error(c),
                     baseline if isinstance(baseline, str) else "")
    failed = not c.ok and not (CONFIG.tolerance == "parity" and figures.within())
    sink = oracle.current_sink()
    if sink is not None:
        sink(c, parity=figures, passed=not failed)
    if failed:
        raise AssertionError(oracle.failure_text(c, what) + "\n" + describe(figures, computed_in or dtype))
    return c


def describe(figures: Parity, computed_in: torch.dtype) -> str:
    """The sentence a failure message carries about PyTorch's own error."""
    name = str(computed_in).replace("torch.", "")
    if figures.baseline_max_abs is None:
        return f"  no PyTorch yardstick: {figures.note}"
    ratio = figures.ratio
    line = (f"  PyTorch's own {name} result is off by {figures.baseline_max_abs:.3g} here, the kernel by "
            f"{figures.kernel_max_abs:.3g} ({ratio:.3g} x PyTorch's)")
    if CONFIG.tolerance == "parity":
        line += f"; --tolerance parity fails it: past the derived allowance and {PARITY_FACTOR:g} x PyTorch's error"
    elif ratio <= 1:
        # not a pass: PyTorch's result is sometimes no better than the rule admits (a loss
        # rounded to float16); but a correct kernel that rounds as PyTorch does must never
        # fail, and the reader should know which way to look (docs/rule-audit.md)
        line += ("\n  no worse than PyTorch's own result: if the implementation rounds as PyTorch does, the derived "
                 "rule may lack a rounding PyTorch performs (a gap in the suite's rule, not the kernel: report it "
                 "with the replay file; docs/rule-audit.md)")
    return line
