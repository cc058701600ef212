"""softmax(x, temperature): strategy, tolerance binding and properties."""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck import backend
from tritoncheck.bad_input import NON_POSITIVE, BadInput, randn, scalar_spoilers, tensor_spoilers
from tritoncheck.config import CONFIG
from tritoncheck.generic import generic_checks, precision, run
from tritoncheck.large_problem import LargeProblem, row_wise
from tritoncheck.limits import NO_LIMITS, Limits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.parity import control_baseline
from tritoncheck.properties import softmax_tolerance as rules
from tritoncheck.references import softmax as ref
from tritoncheck.registry import Check, Implementation, OpSpec, register
from tritoncheck.strategies import FAMILIES, Case, TensorSpec, sizes, special_values, tensors

TEMPERATURES = (1.0, 0.5, 2.0, 0.1, 7.3)
BLOCKS = (1024, 8192)  # the project kernel's single-block limits (interpreter, GPU)
# Past 2**16 and 2**17 (rows of a large vocabulary); a 1 x 131075 softmax forward and
# backward takes about 2 s under the interpreter, so the CPU profile draws it too.
LONG_ROW = 2**17 + 3


def _domain_cap(dtype: torch.dtype, temperature: float) -> float:
    return float(torch.finfo(dtype).max) * min(temperature, 1.0) / 2


@st.composite
def softmax_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS, min_rows: int = 1) -> Case:
    """Rows of any length (past one block included) under up to two leading dims;
    ``min_rows`` is for properties that compare rows."""
    n = draw(limits.length("softmax", "N", 1, CONFIG.pick(2100, LONG_ROW), long_max=LONG_ROW,
                           long_percent=CONFIG.long_percent(), blocks=BLOCKS))
    max_rows = max(min_rows, min(CONFIG.pick(12, 4096), CONFIG.pick(2**14, 2**20) // n))
    if min_rows > 1:
        first = draw(sizes(min_rows, max_rows))
        lead = (first,) + tuple(draw(st.lists(sizes(1, max(1, max_rows // first)), max_size=1)))
    else:
        lead = tuple(draw(st.lists(sizes(1, max_rows), max_size=2).filter(lambda d: math.prod(d) <= max_rows)))
    temperature = draw(limits.choice("temperature", TEMPERATURES))
    # The domain: x / T finite in the input dtype. An input near the dtype's max
    # divided by T < 1 overflows in torch.softmax(x / t) and in any kernel that
    # forms x / T before subtracting the max, which the contract cannot mean.
    cap = _domain_cap(dtype, temperature)
    x = draw(tensors(lead + (n,), dtype, families=FAMILIES, max_magnitude=cap,
                     specials=special_values(dtype, allow_neg_inf=True, max_magnitude=cap)))
    return Case("softmax", str(dtype).replace("torch.", ""), ("x", "temperature"), {"x": x},
                {"temperature": temperature})


def softmax_tolerance(case, inputs64, expected, p):
    return {"y": rules.softmax(inputs64["x"], expected["y"], case.params["temperature"], p)}


def softmax_grad_tolerance(case, inputs64, outputs64, grads64, p):
    return {"dx": rules.softmax_grad(inputs64["x"], outputs64["y"], inputs64["dy"], grads64["x"],
                                         case.params["temperature"], p)}


def rows_sum_to_one(case: Case, impl: Implementation) -> None:
    """Each row with a finite entry sums to one, within an allowance derived for the sum
    (``rules.softmax_row_sum``: the normaliser's own rounding, not the elements'
    allowances, which the sum cancels)."""
    values, outs = run(case, impl)
    x = to_numpy(values["x"])
    y = to_numpy(outs["y"])
    live = np.isfinite(x).any(axis=-1)
    allowed = rules.softmax_row_sum(x, y, case.params["temperature"], precision(impl, case))
    sums = np.where(live, y.sum(axis=-1), 1.0)
    assert_close("row sums of y", torch.from_numpy(sums), np.ones_like(sums), np.where(live, allowed, 0.0),
                 what="rows do not sum to one", dtype=getattr(torch, case.dtype), record=False, vacuity=True)


def values_in_unit_interval(case: Case, impl: Implementation) -> None:
    """Every output of a row with a finite entry is a number in [0, 1] (no NaN, no inf)."""
    values, outs = run(case, impl)
    x = to_numpy(values["x"])
    y = to_numpy(outs["y"])
    live = np.broadcast_to(np.isfinite(x).any(axis=-1, keepdims=True), y.shape)
    bad = live & ~((y >= 0) & (y <= 1))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"softmax output outside [0, 1] at {list(idx)}: {y[idx]!r} "
                             f"({int(bad.sum())} such elements)")


@st.composite
def _with_neg_inf(draw, op: OpSpec, dtype: torch.dtype) -> Case:
    """Cases whose x holds -inf: a padding-style tail per row, or scattered entries."""
    case = draw(op.cases(dtype))
    family = draw(st.sampled_from(("neg_inf_tail", "neg_inf_mask")))
    x = case.tensors["x"]
    return case.replace(tensors={"x": TensorSpec(**{**x.__dict__, "family": family})})


def neg_inf_gives_zero(case: Case, impl: Implementation) -> None:
    """-inf entries in a row that has a finite entry give exactly 0."""
    values, outs = run(case, impl)
    x = to_numpy(values["x"])
    y = to_numpy(outs["y"])
    live = np.broadcast_to(np.isfinite(x).any(axis=-1, keepdims=True), y.shape)
    spots = live & np.isneginf(x)
    bad = spots & (y != 0)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"x{list(idx)} is -inf in a row with finite entries, but y there is {y[idx]!r}, "
                             f"not 0 ({int(bad.sum())} of {int(spots.sum())} such entries)")


def all_neg_inf_row_gives_nan(case: Case, impl: Implementation) -> None:
    """A row of x that is entirely -inf gives a row of NaN (as torch.softmax); the
    other rows are unaffected (checked against the reference)."""
    values = case.materialise(backend.device())
    last = tuple(s - 1 for s in values["x"].shape[:-1])
    values["x"][last] = float("-inf")  # for 1-D x, x[()] is the whole row
    _, outs = run(case, impl, values)
    y = to_numpy(outs["y"])
    if not np.isnan(y[last]).all():
        raise AssertionError(f"the last row of x was set to -inf; y there should be all NaN, got "
                             f"{y[last][:8]!r}{'...' if y.shape[-1] > 8 else ''}")


def _transport(y: np.ndarray, allowed: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """softmax(z + delta) from y = softmax(z), exactly: y e^delta / sum(y e^delta),
    and the allowance of y carried through the same map (its own share, plus its
    effect on the normalising sum)."""
    with np.errstate(invalid="ignore", over="ignore"):
        shift = np.max(np.where(y > 0, delta, -np.inf), axis=-1, keepdims=True)
        w = np.exp(delta - np.where(np.isfinite(shift), shift, 0.0))
        norm = np.sum(y * w, axis=-1, keepdims=True)
        moved = y * w / norm
        moved_allowed = allowed * w / norm + moved * np.sum(allowed * w, axis=-1, keepdims=True) / norm
    return moved, moved_allowed


def _metamorphic(case: Case, impl: Implementation, x_new: torch.Tensor, delta: np.ndarray,
                 t_new: float, what: str) -> None:
    """Compare impl(x_new, t_new) with impl's own softmax(x, T) moved by the exact
    change ``delta`` of the scaled logits that rounding x_new into the dtype caused."""
    values, outs = run(case, impl)
    x = to_numpy(values["x"])
    t = case.params["temperature"]
    y1 = to_numpy(outs["y"])
    _, outs2 = run(case, impl, {"x": x_new, "temperature": t_new})
    p = precision(impl, case)
    x2 = to_numpy(x_new)
    # Rounding x_new can move a logit by a lot (bf16 at 1e4 has a spacing of 64); past
    # exp's range the transported softmax says nothing, so such cases are not drawn.
    assume(np.max(np.abs(np.where(np.isfinite(delta), delta, 0.0)), initial=0.0) < 30)
    moved, moved_allowed = _transport(y1, rules.softmax(x, ref.softmax(x, t), t, p),
                                      np.where(np.isfinite(delta), delta, 0.0))
    allowed = moved_allowed + rules.softmax(x2, ref.softmax(x2, t_new), t_new, p)
    live = np.isfinite(x).any(axis=-1, keepdims=True)
    assert_close("y", outs2["y"], np.where(live, moved, np.nan), allowed, what=what, record=False)


_SHIFTS = (1.0, 3.0, -64.0, 1000.0, -3e4)


def shift_invariant(case: Case, impl: Implementation) -> None:
    """softmax(x + c) equals softmax(x) for a per-row constant c: the kernel's own
    outputs are compared, corrected exactly for the rounding of x + c to the dtype."""
    values = case.materialise(backend.device())
    x = values["x"]
    c = _SHIFTS[case.tensors["x"].seed % len(_SHIFTS)]
    dtype = x.dtype
    x64 = to_numpy(x)
    shifted = torch.from_numpy(x64 + c).to(dtype)
    kept = shifted[torch.isfinite(x).cpu()].double()
    # x + c leaves the domain (x / T finite; see softmax_cases): no such input, a discard
    assume(bool((kept.abs() <= _domain_cap(dtype, case.params["temperature"])).all()))
    x_new = case.tensors["x"].layout.apply(shifted.to(x.device)) if case.tensors["x"].layout else shifted.to(x.device)
    delta = (to_numpy(x_new) - (x64 + c)) / case.params["temperature"]
    _metamorphic(case, impl, x_new, delta, case.params["temperature"], f"softmax(x + {c:g}) != softmax(x)")


def temperature_equivalent(case: Case, impl: Implementation) -> None:
    """softmax(x, T) equals softmax(x / T, 1), corrected exactly for the rounding of
    x / T to the dtype."""
    values = case.materialise(backend.device())
    x = values["x"]
    t = case.params["temperature"]
    x64 = to_numpy(x)
    scaled = torch.from_numpy(x64 / t).to(x.dtype)
    # x / T overflows the dtype: the equivalent input does not exist, a discard
    assume(bool(torch.isfinite(scaled[torch.isfinite(x).cpu()]).all()))
    delta = to_numpy(scaled) - x64 / t
    _metamorphic(case, impl, scaled.to(x.device), delta, 1.0, f"softmax(x / {t:g}, 1) != softmax(x, {t:g})")


def rows_independent(case: Case, impl: Implementation) -> None:
    """Row r's output does not change, bit for bit, when every other row changes."""
    spec = case.tensors["x"]
    assume(math.prod(spec.shape[:-1]) >= 2)  # the strategy draws >= 2 rows; a replayed case may not
    values, outs = run(case, impl)
    x = values["x"]
    other = TensorSpec(**{**spec.__dict__, "seed": (spec.seed + 1) % 2**32, "injections": ()}).materialise(x.device)
    r = tuple(s // 2 for s in spec.shape[:-1])
    other[r] = x[r]
    _, outs2 = run(case, impl, {"x": other, "temperature": case.params["temperature"]})
    assert_identical("y", outs["y"][r], outs2["y"][r],
                     f"row {list(r)} of y changed when the other rows of x changed")


register(OpSpec(
    name="softmax",
    signature="softmax(x, temperature=1.0) -> y",
    meaning="softmax of `x / temperature` over the last dim; `x` is `[..., N]`, `temperature > 0`. A row that is "
            "all `-inf` gives NaN (as `torch.softmax`); `-inf` entries in a row with a finite entry give exactly 0.",
    scalars=("temperature",),
    dims={"N": ("x", -1)},
    choices={"temperature": TEMPERATURES},
    arguments=("x", "temperature"),
    outputs=("y",),
    kernel="tritoncheck.kernels.softmax:softmax",
    controls=("tritoncheck.controls.softmax:torch_softmax", "tritoncheck.controls.softmax:torch_softmax_fp32",
              "tritoncheck.controls.softmax:torch_softmax_cuda_backward"),
    baseline=control_baseline("tritoncheck.controls.softmax:torch_softmax"),
    # rows past every common block size keep the multi-block path in play
    large_problem=LargeProblem(row_wise(2**17 + 3), "rows", ("x",)),
    bad_input=BadInput(
        lambda dims, device: {"x": randn((dims["b"], dims["n"]), device), "temperature": 0.7},
        tensor_spoilers("x", fixed_rank=False) + scalar_spoilers("temperature", (*NON_POSITIVE, "hot"))),
    reference=ref.softmax,
    torch_reference=ref.softmax_torch,
    cases=softmax_cases,
    tolerance=softmax_tolerance,
    grad_tolerance=softmax_grad_tolerance,
    grad_inputs=("x",),
    grad_outputs=("y",),
    output_shapes=lambda case: {"y": case.tensors["x"].shape},
    checks=generic_checks(grad=True) + (
        Check("rows_sum_to_one", rows_sum_to_one),
        Check("values_in_unit_interval", values_in_unit_interval),
        Check("neg_inf_gives_zero", neg_inf_gives_zero, cases=_with_neg_inf),
        Check("all_neg_inf_row_gives_nan", all_neg_inf_row_gives_nan),
        Check("shift_invariant", shift_invariant),
        Check("temperature_equivalent", temperature_equivalent, needs_arguments=("temperature",)),
        Check("rows_independent", rows_independent, cases=lambda op, dtype: op.cases(dtype, min_rows=2)),
    ),
))
