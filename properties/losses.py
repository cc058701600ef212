"""cross_entropy(logits, target, ignore_index): strategy, tolerance binding and properties."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck import backend
from tritoncheck.bad_input import BadInput, Spoiler, randn, scalar_spoilers, tensor_spoilers
from tritoncheck.config import CONFIG
from tritoncheck.generic import generic_checks, precision, require_grad_fn, run, with_upstream
from tritoncheck.large_problem import LargeProblem, rows_past_int32
from tritoncheck.large_problem import randn as large_randn
from tritoncheck.limits import NO_LIMITS, Limits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.parity import control_baseline
from tritoncheck.properties import losses_tolerance as rules
from tritoncheck.references import losses as ref
from tritoncheck.registry import OPS, Check, Implementation, OpSpec, register
from tritoncheck.strategies import FAMILIES, Case, TensorSpec, special_values, tensors

BLOCKS = (128, 4096)  # the kernel's column block caps (interpreter, GPU): V past them takes the online path
IGNORE_INDICES = (-100, 0, -1)  # the default; and values inside [0, V) / negative, which the contract allows


@st.composite
def cross_entropy_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """Rows of logits of any vocabulary size (past one column block included), targets
    in [0, V), some rows set to ignore_index.

    The domain: -inf logits are allowed (a masked vocabulary): the loss of a row
    whose target logit is -inf is +inf, and a row of only -inf gives NaN (the math,
    as the references and F.cross_entropy); +inf and NaN logits are not drawn (the
    contract says nothing about them). Finite logits are bounded by a quarter of
    fp32's largest value so that the loss, max - min + log V at most, is finite in
    the float32 it is returned in (for fp16 the dtype's range is smaller already).
    Past |logits| ~ 2^24 fp32 cannot resolve log S next to the max: the loss keeps
    its relative accuracy (the rule's u |lse| terms) but the probabilities of the
    backward lose all digits (the gradient rule caps their error at [0, 1]).
    """
    # A 1 x 131075 loss with its gradient takes about 7 s under the interpreter (column
    # blocks of 128): the long branch is rarer there than for softmax. On a GPU the long
    # branch reaches the vocabularies models ship (Gemma 256k, 2^18 = 262144) and past them.
    v = draw(limits.length("cross_entropy", "V", 1, CONFIG.pick(700, 2**17 + 3), long_max=CONFIG.pick(2**17 + 3, 2**18 + 3),
                           long_percent=CONFIG.long_percent(3), blocks=BLOCKS))
    max_rows = max(1, min(CONFIG.pick(8, 4096), CONFIG.pick(2**12, 2**20) // v))
    m = draw(limits.size("M", 1, max_rows))
    cap = min(float(torch.finfo(dtype).max), float(torch.finfo(torch.float32).max) / 4)
    # "offset" twice: a large common offset of either sign (logits all near -1e4 are
    # what masking with a large finite negative gives) is where an unstabilised
    # logsumexp underflows or overflows, so it gets twice the weight of the others.
    logits = draw(tensors((m, v), dtype, families=FAMILIES + ("offset",), max_magnitude=cap,
                          specials=special_values(dtype, allow_neg_inf=True, max_magnitude=cap)))
    ignore_index = draw(limits.choice("ignore_index", IGNORE_INDICES))
    ignored = draw(st.lists(st.integers(0, m - 1), max_size=2))
    # Targets are int64 in [0, V) ("indices" draws integers below scale). Contiguous: a
    # strided int layout cannot be built (Layout.apply fills the gaps with NaN).
    target = TensorSpec(shape=(m,), dtype="int64", family="indices", scale=float(v),
                        seed=draw(st.integers(0, 2**32 - 1)), layout=None,
                        injections=tuple((i, float(ignore_index)) for i in ignored))
    return Case("cross_entropy", str(dtype).replace("torch.", ""), ("logits", "target", "ignore_index"),
                {"logits": logits, "target": target}, {"ignore_index": ignore_index})


def _ignore_index(case: Case) -> int:
    return int(case.params["ignore_index"])


def cross_entropy_tolerance(case, inputs64, expected, p):
    return {"loss": rules.cross_entropy(inputs64["logits"], inputs64["target"], _ignore_index(case),
                                            expected["loss"], p)}


def cross_entropy_grad_tolerance(case, inputs64, outputs64, grads64, p):
    return {"dlogits": rules.cross_entropy_grad(inputs64["logits"], inputs64["target"], _ignore_index(case),
                                                    inputs64["dloss"], grads64["logits"], p)}


def _loss_allowance(case: Case, impl: Implementation, logits: np.ndarray, target: np.ndarray) -> np.ndarray:
    loss = ref.cross_entropy(logits, target, _ignore_index(case))
    return rules.cross_entropy(logits, target, _ignore_index(case), loss, precision(impl, case))


@st.composite
def _with_ignored_row(draw, op: OpSpec, dtype: torch.dtype) -> Case:
    """The op's cases with an upstream gradient, and at least one ignored row."""
    case = draw(with_upstream(op, dtype))
    t = case.tensors["target"]
    row = draw(st.integers(0, t.shape[0] - 1))
    spec = TensorSpec(**{**t.__dict__, "injections": t.injections + ((row, float(case.params["ignore_index"])),)})
    return case.replace(tensors={"target": spec})


def ignored_rows_zero(case: Case, impl: Implementation) -> None:
    """Where target == ignore_index the loss is exactly 0, and so is the whole row of
    the gradient of the logits, whatever the logits of that row hold."""
    values = case.materialise(backend.device())
    target = values["target"].cpu().numpy()
    ignored = target == _ignore_index(case)
    assume(ignored.any())  # _with_ignored_row injects one; a replayed or user-built case may lack it
    _, outs = run(case, impl, dict(values))
    loss = outs["loss"].detach().cpu()
    bad = np.flatnonzero(ignored & (loss.numpy() != 0))
    if bad.size:
        raise AssertionError(f"target[{int(bad[0])}] == ignore_index = {_ignore_index(case)}, but the loss "
                             f"there is {loss[int(bad[0])].item()!r}, not 0 ({bad.size} such rows)")
    if not impl.supports_backward:
        return  # the loss half above is checked; a declared forward-only kernel has no gradient rows
    logits = values["logits"].detach().requires_grad_(True)
    _, outs = run(case, impl, {**values, "logits": logits})
    require_grad_fn(OPS["cross_entropy"], impl, outs)
    (grad,) = torch.autograd.grad(outs["loss"], logits, values["dloss"])
    g = grad.detach().cpu()[torch.from_numpy(ignored)]
    assert_identical("dlogits", torch.zeros_like(g), g,
                     f"the gradient rows of ignored targets (rows {np.flatnonzero(ignored).tolist()}) are not 0")


def loss_at_least_zero(case: Case, impl: Implementation) -> None:
    """Every loss of a row that is not ignored and has a finite logit is a number
    >= 0 (lse >= max >= logits[target]), less its rounding allowance: the rule's
    allowance, because an fp32 lse = m + log S with S slightly above 1 may come out a
    rounding error below m (GPU log is an approximation), which makes a correct loss
    of a dominant target logit a tiny negative number. +inf (target logit -inf) is
    allowed; NaN and -inf are not."""
    values, outs = run(case, impl)
    logits = to_numpy(values["logits"])
    target = values["target"].cpu().numpy()
    loss = to_numpy(outs["loss"])
    allowed = _loss_allowance(case, impl, logits, target)
    live = (target != _ignore_index(case)) & np.isfinite(logits).any(axis=-1)
    with np.errstate(invalid="ignore"):
        bad = live & ~(loss >= -allowed)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"loss[{i}] = {loss[i]!r} is below 0 by more than its allowance {allowed[i]:.3g} "
                             f"(target {int(target[i])}, row max {np.max(logits[i]):.6g}; {int(bad.sum())} such rows)")


_SHIFTS = (1.0, 3.0, -64.0, 1000.0, -3e4)


def _lse(a: np.ndarray) -> np.ndarray:
    """log sum_j e^{a_j} per row in fp64, -inf for a row of -inf."""
    m = np.max(a, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return np.log(np.sum(np.exp(a - m), axis=-1)) + m[:, 0]


def shift_invariant(case: Case, impl: Implementation) -> None:
    """Adding a per-row constant c to the logits leaves the loss unchanged: the
    implementation's loss of x + c is compared with its own loss of x, corrected
    exactly (in fp64) for the rounding of x + c to the dtype, within the sum of the
    two losses' allowances."""
    values, outs = run(case, impl)
    x = values["logits"]
    spec = case.tensors["logits"]
    m = x.shape[0]
    c = np.array([_SHIFTS[(spec.seed + i) % len(_SHIFTS)] for i in range(m)])[:, None]
    x64 = to_numpy(x)
    with np.errstate(invalid="ignore"):
        shifted = torch.from_numpy(x64 + c).to(x.dtype)
    # x + c overflows the dtype: no such input exists (a discard, counted, not a pass)
    assume(bool(torch.isfinite(shifted[torch.isfinite(x.cpu())]).all()))
    x_new = spec.layout.apply(shifted.to(x.device)) if spec.layout else shifted.to(x.device)
    _, outs2 = run(case, impl, {**values, "logits": x_new})
    x2 = to_numpy(x_new)
    target = values["target"].cpu().numpy()
    ii = _ignore_index(case)
    ignored = target == ii
    # loss(x + c + delta) = loss(x) + log(sum_j p_j e^{delta_j}) - delta_t, p = softmax(x) (exact).
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        finite = np.isfinite(x64)
        delta = np.where(finite, x2 - (x64 + c), 0.0)
        # log sum_j p_j e^{delta_j} = lse(x + delta) - lse(x), both in the log domain: with
        # p = (0, 1) and delta = (1.5, -1000) the sum e^{-1000} underflows (an H100 run
        # once reported that row's correct loss as a failure)
        lw = np.where(finite, x64, -np.inf)
        corr = (_lse(lw + delta) - _lse(lw) - delta[np.arange(m), np.where(ignored, 0, target)])
        corr = np.where(ignored | ~np.isfinite(corr), 0.0, corr)
    loss1 = to_numpy(outs["loss"])
    expected = loss1 + corr
    p = precision(impl, case)
    allowed = (rules.cross_entropy(x64, target, ii, ref.cross_entropy(x64, target, ii), p)
               + rules.cross_entropy(x2, target, ii, ref.cross_entropy(x2, target, ii), p)
               + 1e-12 * np.abs(corr))
    assert_close("loss", outs2["loss"], expected, allowed,
                 what=f"loss(logits + c) != loss(logits) (per-row shifts c from {sorted({float(v) for v in c[:, 0]})})",
                 dtype=torch.float32, record=False)



def _large_cross_entropy(v: int):
    def build(dtype, device):
        m = rows_past_int32(v)
        return {"logits": large_randn((m, v), dtype, device), "target": torch.randint(0, v, (m,), device=device)}
    return build


register(OpSpec(
    name="cross_entropy",
    signature="cross_entropy(logits, target, ignore_index=-100) -> loss",
    meaning="`logits [M, V]`, `target [M]` int64; `loss [M]` float32 `= logsumexp(logits[i]) - logits[i, target[i]]`, "
            "and exactly 0 where `target[i] == ignore_index`",
    scalars=("ignore_index",),
    dims={"M": ("logits", 0), "V": ("logits", 1)},
    arguments=("logits", "target", "ignore_index"),
    outputs=("loss",),
    kernel="tritoncheck.kernels.losses:cross_entropy",
    controls=("tritoncheck.controls.losses:torch_cross_entropy", "tritoncheck.controls.losses:stored_gradient_cross_entropy",
              "tritoncheck.controls.losses:torch_cross_entropy_input_dtype"),
    baseline=control_baseline("tritoncheck.controls.losses:torch_cross_entropy_input_dtype"),
    # a vocabulary as models use them (Llama 3: 128256)
    large_problem=LargeProblem(_large_cross_entropy(128256), "rows", ("logits", "target")),
    bad_input=BadInput(
        lambda dims, device: {"logits": randn((dims["b"], dims["n"]), device),
                              "target": torch.randint(0, dims["n"], (dims["b"],), device=device), "ignore_index": -100},
        tensor_spoilers("logits", fixed_rank=True) + tensor_spoilers("target", fixed_rank=True, integer=True)
        + (Spoiler("target", "one row more than logits", lambda a: torch.cat([a["target"], a["target"][:1]])),
           Spoiler("target", "a class index equal to V",
                   lambda a: torch.full_like(a["target"], a["logits"].shape[1])),
           Spoiler("target", "a negative class index", lambda a: torch.full_like(a["target"], -3)))
        + scalar_spoilers("ignore_index", (1.5, "none"))),
    reference=ref.cross_entropy,
    torch_reference=ref.cross_entropy_torch,
    cases=cross_entropy_cases,
    tolerance=cross_entropy_tolerance,
    grad_tolerance=cross_entropy_grad_tolerance,
    grad_inputs=("logits",),
    grad_outputs=("loss",),
    output_shapes=lambda case: {"loss": (case.tensors["logits"].shape[0],)},
    output_dtypes={"loss": torch.float32},
    checks=generic_checks(grad=True) + (
        Check("ignored_rows_zero", ignored_rows_zero, cases=_with_ignored_row),
        Check("loss_at_least_zero", loss_at_least_zero),
        Check("shift_invariant", shift_invariant),
    ),
))
