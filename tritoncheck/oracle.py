"""Comparing an output with its fp64 reference, and saying so when it fails.

:func:`assert_close` measures the error of every element (absolute, relative to the
output's scale, ULPs of the output dtype), checks it against the allowed error of
that element, records the figures for the tolerance report, and on failure raises
an ``AssertionError`` that names the worst element the way
``torch.testing.assert_close`` does: its index, the expected and actual values, the
error, the allowance and how many times over it the error is.

Two guards keep a comparison from passing without checking:

* Every allowance where the reference is finite must be a finite number >= 0. A NaN
  or infinite allowance is a bug in the rule that produced it (the error/allowance
  ratio would be NaN or inf/inf, and ``NaN > 1`` is false): :class:`InvalidAllowance`,
  naming the output and the rule, never a pass. A ratio that is NaN for any other
  reason counts as a violation.
* Vacuity. An element whose allowance reaches the magnitude of its expected value
  (``allowed >= |expected|``) would accept 0: there the comparison cannot catch a
  kernel that returns nothing. Such elements are counted per comparison
  (``vacuous`` of ``counted``). An element is counted whenever its expected value is
  above the fp64 reference's own error there (``noise``, :func:`reference_precision`:
  the comparison's rule evaluated with every unit roundoff u(fp64), the reference's
  condition and accumulation times u(fp64); 0 for an expected value that is exact,
  such as the 1 a row sum should reach). The allowance never decides what is counted:
  a looser rule cannot hide its own vacuity. Of the vacuous elements, those that no
  rule could pin down are *not checkable* and reported apart (``uncheckable``), not
  judged: elements the rule declares unconstrained (``unconstrained``), values within
  the rules' absolute underflow floors (:data:`FLOOR_MULTIPLE`:
  a correct implementation may flush them to 0 or round them in the subnormals), and
  values below the rounding error of the output's largest element (outputs whose
  errors are absolute at their scale, sums and gradients with cancellation, may err
  that much). The report carries the counts, and a test in which at least
  :data:`VACUOUS_EXAMPLES_MAX` (half) of the examples are mostly vacuous fails
  (:func:`tritoncheck.harness.vacuous_test`).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from tritoncheck import tolerance
from tritoncheck.tolerance import float64_on


@dataclass(frozen=True)
class Comparison:
    output: str
    dtype: torch.dtype
    numel: int
    max_abs: float
    max_rel: float  # max |error| / max |expected|
    max_ulp: float  # in ulps of the output dtype at the expected value
    headroom: float  # max |error| / allowed; <= 1 passes
    worst: tuple[int, ...] | None  # index of the largest error/allowed
    expected: float
    got: float
    allowed: float
    violations: int
    special_mismatches: int  # NaN/inf where the reference has none, or the reverse
    scale: float  # max |expected| over finite entries (the x axis of the report's plots)
    counted: int = 0  # elements above the reference's noise, less the not checkable ones (module docstring)
    vacuous: int = 0  # of which the allowance reaches |expected|: 0 would pass there
    uncheckable: int = 0  # vacuous elements that no rule could pin down (module docstring), reported apart
    # max |error| / |expected| over the counted elements only: there |expected| is above the
    # floors and the output's own rounding, so the ratio is defined and finite; None when
    # no element counted (the relative error is not defined anywhere in this output)
    max_rel_counted: float | None = None
    rule: str | None = None  # the rule that gave the allowance (a defined op's says what it is)

    @property
    def ok(self) -> bool:
        return self.violations == 0 and self.special_mismatches == 0

    @property
    def mostly_vacuous(self) -> bool:
        """More than half of the counted elements would accept 0."""
        return 2 * self.vacuous > self.counted > 0


# A test fails when at least this share of the examples that compared an output, and at
# least VACUOUS_EXAMPLES_MIN of them, were mostly vacuous for it (``Comparison.mostly_vacuous``):
# a test in which half the examples checked nothing has not shown the output right. Not a
# quarter: how many draws land in a regime the dtype cannot pin (bf16 layer norm on offset
# rows, bf16 scores past 1/u) is the strategy's mix, and at the ci profile's 10 examples a
# quarter is 3 derandomized draws: the default CPU run failed four correct kernels' tests
# that way (layer norm float32 constant rows 4 of 14, dropout layer norm bf16 11 of 26, a
# linear attention at 3 examples 1 of 3), a verdict on the draws, not on the check.
VACUOUS_EXAMPLES_MAX = 0.5
VACUOUS_EXAMPLES_MIN = 2  # one vacuous example alone is a draw, whatever the share
# The rules' absolute floors are multiples of the underflow floor, one per rounding that
# may land in the subnormals or be flushed (3 in rope, M for a sum over M rows, up to 4096
# rows in the gpu profile): below this many floors an expected value is not counted. In
# fp16 that is 2.4e-4 (the smallest normal is 6.1e-5), in fp32 and bf16 4.8e-35.
FLOOR_MULTIPLE = 2.0**12


class InvalidAllowance(AssertionError):
    """A tolerance rule returned a NaN, infinite or negative allowance: a bug in the
    suite, not in the implementation under test."""


def to_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def _check_allowance(output: str, e: torch.Tensor, allowed: torch.Tensor, fin: torch.Tensor,
                     rule: str | None) -> None:
    bad = fin & ~(torch.isfinite(allowed) & (allowed >= 0))
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise InvalidAllowance(
            f"suite bug: the allowance for output {output!r} from {rule or 'the rule of this check'} is "
            f"{float(allowed[first])!r} at index {list(first)} (expected {float(e[first])!r}), in "
            f"{int(bad.sum())} of {e.numel()} elements; an allowance must be a finite number >= 0 wherever "
            "the reference is finite")


def compare(output: str, got: torch.Tensor, expected: np.ndarray, allowed: np.ndarray | float,
            dtype: torch.dtype | None = None, rule: str | None = None, noise: np.ndarray | float = 0.0,
            unconstrained: np.ndarray | None = None) -> Comparison:
    """Measure ``got`` against ``expected`` (fp64) with per-element ``allowed`` error (a NumPy
    masked array: its masked elements are unconstrained, as ``unconstrained`` says).

    ``noise``: the fp64 reference's own error bound per element (the rule at
    :func:`~tritoncheck.tolerance.reference_precision`); 0 where ``expected`` is exact.
    Only elements above it count for vacuity (module docstring). ``unconstrained``: a mask
    of the elements the rule itself declares no correct result pins down (it says why
    beside it): not checkable, reported apart like the floors.

    NaN must match NaN and an infinity the same infinity exactly; finite expected
    values must be met by finite results within ``allowed``, which must be finite
    and >= 0 there (``rule`` names where it came from, for the error if it is not).

    Computed in float64 torch on ``got``'s device (``expected`` and ``allowed``, NumPy
    or tensors, are moved there): on a GPU the per-element work of a large output runs
    there, and one transfer brings back the figures.
    """
    dtype = dtype or got.dtype
    device = got.device if isinstance(got, torch.Tensor) else torch.device("cpu")
    g, e = float64_on(got, device), float64_on(expected, device)
    if g.shape != e.shape:
        raise AssertionError(f"output {output!r} has shape {list(g.shape)}, the reference has {list(e.shape)}")
    if isinstance(allowed, np.ma.MaskedArray):  # a rule's elements that nothing pins down: masked
        mask = np.ma.getmaskarray(allowed)
        unconstrained = mask if unconstrained is None else (np.asarray(unconstrained) != 0) | mask
        allowed = allowed.filled(0.0)
    try:
        allowed = float64_on(allowed, device).broadcast_to(e.shape)
    except RuntimeError as exc:
        raise ValueError(f"allowance for output {output!r} does not broadcast to {list(e.shape)}: {exc}") from None
    free = None if unconstrained is None else float64_on(unconstrained, device).broadcast_to(e.shape) != 0
    if free is not None:  # not judged: any value (an infinity too) passes there
        allowed = torch.where(free, float(np.finfo(np.float64).max), allowed)
    fin = torch.isfinite(e)
    _check_allowance(output, e, allowed, fin, rule)
    if e.numel() == 0:
        return Comparison(output=output, dtype=dtype, numel=0, max_abs=0.0, max_rel=0.0, max_ulp=0.0, headroom=0.0,
                          worst=None, expected=0.0, got=0.0, allowed=0.0, violations=0, special_mismatches=0,
                          scale=0.0)
    same_special = (torch.isnan(e) & torch.isnan(g)) | (torch.isinf(e) & (g == e))
    mismatches = ~fin & ~same_special
    # An exact value past the dtype's largest finite number rounds to infinity: an
    # infinity of the right sign is then the correctly rounded result.
    big = float(torch.finfo(dtype).max) if dtype.is_floating_point else math.inf
    overflow = fin & (e.abs() > big) & (g == torch.sign(e) * math.inf)
    nonfinite_got = fin & ~torch.isfinite(g) & ~overflow
    if free is not None:
        nonfinite_got = nonfinite_got & ~free
    err = torch.where(fin & torch.isfinite(g), (g - e).abs(), 0.0)
    err = torch.where(nonfinite_got, math.inf, err)
    ratio = torch.where(fin & (err != 0), err / allowed, 0.0)
    scale = torch.where(fin, e.abs(), 0.0).amax()
    worst_flat = torch.where(mismatches, math.inf, ratio).flatten().argmax()
    ulps = err / tolerance.ulp(e, dtype) if dtype.is_floating_point else torch.zeros_like(err)
    counted_mask, uncheckable_mask = _masks(e, allowed, fin, dtype, scale, _noise(output, noise, e), free)
    counted, vacuous = counted_mask.sum(), (counted_mask & (allowed >= e.abs())).sum()
    uncheckable = uncheckable_mask.sum()
    rel_counted = torch.where(counted_mask, err / e.abs().clamp(min=math.ulp(0.0)), 0.0).amax()
    # ~(ratio <= 1): a NaN ratio is a violation, never a pass
    figures = torch.stack([err.amax(), torch.where(fin, ulps, 0.0).amax(), ratio.amax(), scale,
                           worst_flat.double(), e.flatten()[worst_flat], g.flatten()[worst_flat],
                           allowed.flatten()[worst_flat], (fin & ~(ratio <= 1)).sum().double(),
                           mismatches.sum().double(), counted.double(), vacuous.double(),
                           uncheckable.double(), rel_counted]).tolist()
    max_abs, max_ulp, headroom, scale, worst_flat, expected_w, got_w, allowed_w, violations, mismatched, counted, \
        vacuous, uncheckable, rel_counted = figures
    return Comparison(
        output=output, dtype=dtype, numel=e.numel(),
        max_abs=max_abs,
        max_rel=max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf),
        max_ulp=max_ulp,
        headroom=headroom,
        worst=tuple(int(i) for i in np.unravel_index(int(worst_flat), tuple(e.shape))),
        expected=expected_w, got=got_w, allowed=allowed_w,
        violations=int(violations),
        special_mismatches=int(mismatched),
        scale=scale,
        counted=int(counted),
        vacuous=int(vacuous),
        uncheckable=int(uncheckable),
        max_rel_counted=rel_counted if counted > 0 else None,
        rule=rule,
    )


def allowance_mostly_vacuous(expected: np.ndarray, allowed: np.ndarray, dtype: torch.dtype,
                             noise: np.ndarray | float = 0.0) -> bool:
    """Whether ``allowed`` would accept 0 for most of the counted elements of ``expected``
    (``noise``: as for :func:`compare`), before anything is compared: a check can discard
    such an example instead of running it."""
    device = expected.device if isinstance(expected, torch.Tensor) else torch.device("cpu")
    e = float64_on(expected, device)
    fin = torch.isfinite(e)
    scale = torch.where(fin, e.abs(), 0.0).amax() if e.numel() else torch.zeros((), dtype=torch.float64)
    free = None
    if isinstance(allowed, np.ma.MaskedArray):  # unconstrained elements (compare's docstring)
        free = float64_on(np.ma.getmaskarray(allowed), device).broadcast_to(e.shape) != 0
        allowed = allowed.filled(0.0)
    counted, vacuous, _ = (int(n) for n in _vacuity(e, float64_on(allowed, device).broadcast_to(e.shape), fin, dtype,
                                                    scale, _noise("expected", noise, e), free))
    return 2 * vacuous > counted > 0


def _noise(output: str, noise, e: torch.Tensor) -> torch.Tensor:
    try:
        return float64_on(noise, e.device).broadcast_to(e.shape)
    except RuntimeError as exc:
        raise ValueError(f"reference noise for output {output!r} does not broadcast to {list(e.shape)}: {exc}") from None


def _vacuity(e: torch.Tensor, allowed: torch.Tensor, fin: torch.Tensor, dtype: torch.dtype,
             scale: torch.Tensor, noise: torch.Tensor,
             unconstrained: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(counted, vacuous, uncheckable) elements, as the module docstring defines them (0-d tensors)."""
    counted, uncheckable = _masks(e, allowed, fin, dtype, scale, noise, unconstrained)
    return counted.sum(), (counted & (allowed >= e.abs())).sum(), uncheckable.sum()


def _masks(e: torch.Tensor, allowed: torch.Tensor, fin: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor,
           noise: torch.Tensor, unconstrained: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The counted elements and the not checkable ones (the module docstring), as masks."""
    if not dtype.is_floating_point:
        return torch.zeros_like(fin), torch.zeros_like(fin)
    mag = torch.where(fin, e, 0.0).abs()
    above_noise = fin & (mag > torch.nan_to_num(noise, nan=0.0))  # a NaN bound hides nothing
    pinnable = mag > torch.clamp(tolerance.unit_roundoff(dtype) * scale,
                                 min=FLOOR_MULTIPLE * tolerance.underflow_floor(dtype))
    if unconstrained is not None:
        pinnable = pinnable & ~unconstrained.broadcast_to(e.shape)
    return above_noise & pinnable, above_noise & ~pinnable & (allowed >= mag)


def failure_text(c: Comparison, what: str) -> str:
    idx = list(c.worst) if c.worst is not None else []
    lines = [
        f"{what}: output {c.output!r} is off in {c.violations + c.special_mismatches} of {c.numel} "
        f"elements ({100 * (c.violations + c.special_mismatches) / max(c.numel, 1):.2f}%)"
    ]
    if c.special_mismatches:
        lines.append(f"  {c.special_mismatches} elements disagree on NaN/inf with the reference")
    lines.append(
        f"  worst at index {idx}: expected {c.expected:.9g}, got {c.got:.9g}, "
        f"|error| {abs(c.got - c.expected):.3g}, allowed {c.allowed:.3g} "
        f"({c.headroom:.3g} x the tolerance)"
    )
    lines.append(
        f"  largest |error| {c.max_abs:.3g} = {c.max_rel:.3g} of the output's scale "
        f"{c.scale:.3g} = {c.max_ulp:.3g} ULP of {str(c.dtype).replace('torch.', '')}"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------- recording for reports

_recorder: contextvars.ContextVar[Callable[[Comparison], None] | None] = contextvars.ContextVar(
    "recorder", default=None)


def current_sink() -> Callable[..., None] | None:
    """Where comparisons are recorded now (None: not recording); for checks that record
    more than a Comparison (tritoncheck/parity.py adds PyTorch's error)."""
    return _recorder.get()


@contextlib.contextmanager
def recording(sink: Callable[..., None]) -> Iterator[None]:
    """Send the comparisons made inside to ``sink(comparison, parity=None, passed=None,
    row=True)``; ``row`` False: for the vacuity verdict only, not a report row."""
    token = _recorder.set(sink)
    try:
        yield
    finally:
        _recorder.reset(token)


def assert_close(output: str, got: torch.Tensor, expected: np.ndarray, allowed: np.ndarray | float,
                 what: str = "does not match the fp64 reference", dtype: torch.dtype | None = None,
                 record: bool = True, rule: str | None = None, noise: np.ndarray | float = 0.0,
                 vacuity: bool | None = None, unconstrained: np.ndarray | None = None) -> Comparison:
    """Compare, record the figures, and raise if any element is off.

    ``record``: a row of the tolerance report (the reference checks' outputs).
    ``vacuity``: counts toward the test's vacuity verdict; by default as ``record``.
    Every comparison with a reference (fp64, with its ``noise``, or an exact value)
    passes True; the comparisons of an implementation with itself (two calls that must
    agree) leave it off: there an output of 0 in both calls passes whatever the
    allowance, so vacuity is not what they measure."""
    c = compare(output, got, expected, allowed, dtype, rule, noise, unconstrained)
    sink = _recorder.get()
    if sink is not None and (record or vacuity):
        sink(c, row=record)
    if not c.ok:
        raise AssertionError(failure_text(c, what))
    return c


def assert_identical(output: str, a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Bitwise equality (NaNs compare equal to NaNs in the same places)."""
    if a.shape != b.shape:
        raise AssertionError(f"{what}: output {output!r} changed shape {list(a.shape)} -> {list(b.shape)}")
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    if not bool(same.all()):
        bad = (~same).nonzero()
        first = tuple(int(i) for i in bad[0])
        raise AssertionError(
            f"{what}: output {output!r} differs in {bad.shape[0]} of {a.numel()} elements; "
            f"first at index {list(first)}: {a[first].item()!r} vs {b[first].item()!r}"
        )
