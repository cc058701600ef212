"""The rounding-bias statistic of ``unbiased_rounding`` (tritoncheck/generic.py): the mean
signed error of every narrowing output against fp64, over many elements.

A kernel that computes in fp32 and stores float16 or bfloat16 by truncating (rounding
toward zero) errs by less than an ulp at each element and passes every per-element
rule; but every element moves toward zero by half an ulp on average, and a residual
stream that adds such an output 72 times shrank by 8.98 % (ROCm/aiter#5151). A
per-element allowance cannot see a bias; a mean over many elements can.

The statistic. For an output whose dtype is narrower than the fp32 the contract computes
in (float16, bfloat16; a float32 output is the fp32 result stored as it is, nothing
narrows, and the check does not apply), each element i with a finite fp64 reference r_i away from zero
(:func:`counted_from`: clear of fp32's flush to zero; one element per distinct
r_i, so that repeated values count once; the inputs are drawn spread over many
spacings, :func:`spread_values`) has its error in ulps of the output
dtype, less the error n_i = (RN(r_i) - r_i) / ulp(r_i) of rounding the exact value to
nearest (even) itself, taken two ways: toward zero, s_i = sign(r_i) ((y_i - r_i) / ulp(r_i)
- n_i) (a truncating store: -1/2 on average), and toward -inf, s_i = (y_i - r_i) / ulp(r_i) -
n_i (a store that rounds down); b_i, the op's derived allowance (the rule
matches_reference uses) in ulps; and c_i, the same rule with every rounding to the input
or output dtype removed (:func:`compute_only`): the bound on what the fp32 arithmetic
adds, plus 1 where r_i lies within c_i of a midpoint between two neighbours (the fp32
result may round to the other one, a spacing away).

Why centred on n_i: the exact values of a case need not spread over their spacings.
Averages of a few values (attention over a window of 6 keys: sums over 6, ties), a
near-uniform softmax (every output near 1/N), bfloat16's coarse grid: their roundings
to nearest share a sign without any store being biased (the GPU run found six correct
controls and the project's attention failing a zero-centred statistic). Subtracting
what round-to-nearest of the exact value errs leaves a correct single store at 0,
except at flips, whatever the values. With weights
w_i = 1 / max(b_i, 1/2)^2 (an element the rule lets err by many ulps, a cancellation,
hardly counts), T = sum_i w_i s_i fails when

    |T| > sum_i w_i (c_i + BIAS_RN) + x sqrt(sum_i w_i^2 (min(|s_i| + c_i, b_i) + BIAS_RN)^2),
    x = sqrt(2 ln(2 / delta)),

reported as a weighted mean m = T / W (W = sum_i w_i) against the same bound over W.

The derivation (what is assumed). A correct implementation's error at element i is
q_i + k_i: k_i the fp32 arithmetic's, |k_i| <= c_i, shared between elements or not (a
row's max, sum or mean), biased or not, charged worst case; q_i the sum of its roundings
to the input or output dtype, each round-to-nearest (a kernel's final store; a
plain-PyTorch implementation's intermediate roundings in the input dtype). The q_i are
assumed independent between elements (each element rounds its own values) and symmetric
about a centre within BIAS_RN of 0: given |q_i - centre|, its sign is a fair coin.
Round-to-nearest-even is that only approximately: over one spacing h a density f rounds
with a mean error of about f'/f h^2 / 24, below 10^-2 ulp in bfloat16 and 10^-3 in
float16 for values within a few standard deviations of a normal draw; values just above
a power of two see a spacing twice that below (the same first-order term); ties round to
even, up or down with the parity of the last bit; float16's subnormals lie on a uniform
grid, rounded alike; fp32's flush to zero (biased toward zero) is excluded. BIAS_RN =
1/16 ulp covers these with room. Conditioned on the magnitudes, sum_i w_i (q_i - centre_i)
is then a Rademacher sum, and Hoeffding's inequality gives
P(|sum| >= x sqrt(sum_i w_i^2 (q_i - centre_i)^2)) <= 2 exp(-x^2 / 2) = delta, whatever the
magnitudes (no range or variance need be known: the bound adapts to the errors seen);
|q_i - centre_i| <= min(|s_i| + c_i, b_i) + BIAS_RN where the rule holds (where it does
not, matches_reference fails). So a correct implementation fails with
probability at most delta per statistic and output, FALSE_ALARM (1e-8) per example in all
(``Check.false_alarm``). What would break the assumption: a rounding to the narrow dtype
shared by many output elements (a per-row scale rounded to float16, which no control or
project kernel does), or values that round alike without being equal: inputs that share
their values (constant rows, rows at a large common offset, which a llama-style RMSNorm
normalises to values that all round near 1.0 alike) are not drawn for this check.

Power: a truncating store gives m near -1/2 (less where the fp32 result is exactly
representable). The call is repeated on reseeded inputs of the same shapes (up to
MAX_CALLS) until the bound is at most DETECTABLE, so that such a bias fails; an example
that cannot get there (every element ill-conditioned) is discarded, as the check could
not fail on it. Under the Triton interpreter every fp32 -> bfloat16 store truncates (its
own conversion, tritoncheck/tolerance.py): bfloat16 outputs are checked on a GPU there.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import numpy as np
import torch
from hypothesis import assume

from tritoncheck import tolerance
from tritoncheck.limits import NotApplicable
from tritoncheck.registry import OPS, Implementation, OpSpec
from tritoncheck.stats import FALSE_ALARM
from tritoncheck.strategies import Case

NARROW = (torch.float16, torch.bfloat16)
# The narrow dtypes judged. bfloat16 is not: on one H200 the statistic failed five correct
# plain-PyTorch controls in bfloat16 (torch_rms_norm_llama at -0.26 ulp against 0.20
# allowed, add_rms_norm's, linear attention's, softmax's CUDA backward, fused_moe's expert
# loop), each rounding intermediates to bfloat16 (and, under the interpreter, every fp32 ->
# bfloat16 store truncates anyway). Their errors are not symmetric about round-to-nearest's
# own at bfloat16's 8 bits; until the derivation covers roundings of intermediates on that
# grid, a verdict there would be a false alarm as often as a finding.
JUDGED = (torch.float16,)
BIAS_RN = 1.0 / 16  # the mean rounding error round-to-nearest may keep, in ulps (module docstring)
DETECTABLE = 0.35  # judge an example once a bias of 0.35 ulp (a truncation's is ~0.5) would fail it
SPACINGS = 16  # references this many subnormal spacings from zero and up are counted (counted_from)
MAX_CALLS = 64  # calls on reseeded inputs per example, at most (small cases need many)
DIRECTIONS = {"toward zero": "away from zero", "toward -inf": "toward +inf"}
# one call of the implementation: (its outputs, the fp64 reference, the fp64 inputs, its
# Precision), as tritoncheck/generic.py's unbiased_rounding makes it
Observe = Callable[[Case, Implementation], tuple[Mapping[str, torch.Tensor], Mapping[str, Any], Mapping[str, Any],
                                                 tolerance.Precision]]


def narrowing_outputs(op: OpSpec, dtype: torch.dtype) -> tuple[str, ...]:
    """The outputs of ``op`` whose dtype is narrower than fp32 when its inputs are ``dtype``."""
    return tuple(n for n in op.outputs if op.output_dtypes.get(n, dtype) in NARROW)


def judged_outputs(op: OpSpec, dtype: torch.dtype) -> tuple[str, ...]:
    """The narrowing outputs the statistic judges: the float16 ones (:data:`JUDGED`)."""
    return tuple(n for n in narrowing_outputs(op, dtype) if op.output_dtypes.get(n, dtype) in JUDGED)


def require_narrowing(op: OpSpec, dtype: torch.dtype) -> None:
    """Raise :class:`NotApplicable` (the check is skipped with the reason) where no output
    narrows, or where every narrowing output is bfloat16 (:data:`JUDGED`)."""
    outputs = narrowing_outputs(op, dtype)
    if not outputs:
        raise NotApplicable(f"not applicable: no output of {op.name} is narrower than fp32 in "
                            f"{str(dtype).replace('torch.', '')} (nothing is rounded to a narrower dtype)")
    if not judged_outputs(op, dtype):
        raise NotApplicable("not applicable: bfloat16 outputs are not judged (on one H200, five correct plain-PyTorch "
                            "controls that round intermediates to bfloat16 exceeded the bound: the statistic's "
                            "symmetry assumption fails on bfloat16's coarse grid; docs/rounding-bias.md); float16 "
                            "outputs are")


# Value families whose elements share their values, or whose results do: a constant row,
# rows at a common offset of 1e4 (float16's spacing there is 8: a handful of distinct
# values), values at the dtype's extremes. Their roundings are not independent between
# elements (a llama-style RMSNorm of offset rows rounds every normalised value near 1.0
# the same way), which the statistic assumes; the values families spread over many
# spacings (normal at every scale, with outliers or -inf masks) keep it.
SHARED_VALUE_FAMILIES = ("constant", "offset", "tiny", "near_max")


def spread_values(case: Case) -> Case:
    """``case`` with each floating-point tensor of a :data:`SHARED_VALUE_FAMILIES` family
    drawn normal instead, and no injected special values: the same shapes, layouts, scales
    and scalars."""
    return dataclasses.replace(case, tensors={
        n: dataclasses.replace(s, family="normal", injections=())
        if s.torch_dtype.is_floating_point and s.family in SHARED_VALUE_FAMILIES else dataclasses.replace(
            s, injections=() if s.torch_dtype.is_floating_point else s.injections)
        for n, s in case.tensors.items()})


def narrowing_cases(op: OpSpec, dtype: torch.dtype):
    """The op's cases with :func:`spread_values`, where one of its outputs narrows (:func:`require_narrowing`)."""
    require_narrowing(op, dtype)
    return op.cases(dtype).map(spread_values)


def counted_from(dtype: torch.dtype) -> float:
    """The smallest |reference| counted: SPACINGS subnormal spacings of ``dtype`` (its
    subnormals round to nearest on a uniform grid, as fp16 linear attention's outputs do),
    and as many times fp32's smallest normal (below it an fp32 intermediate may be flushed
    to zero: a bias of the GPU's, toward zero, and bfloat16's subnormals lie there)."""
    info, fp32 = torch.finfo(dtype), torch.finfo(torch.float32)
    return SPACINGS * max(float(info.tiny) * float(info.eps), float(fp32.tiny))


def compute_only(p: tolerance.Precision) -> tolerance.Precision:
    """``p`` without its roundings to the input and output dtypes: what a rule then allows is
    the fp32 arithmetic's share (the rules take the input dtype's unit from ``p.dtype``)."""
    info = torch.finfo(torch.float64)
    return dataclasses.replace(p, dtype=torch.float64, store=0.0, floor=float(info.tiny) * float(info.eps))


@dataclasses.dataclass(frozen=True)
class Bias:
    """One output's weighted mean error in one direction, and what round-to-nearest allows it (ulps)."""

    mean: float  # m = T / W
    arithmetic: float  # sum w c / W
    margin: float  # x sqrt(sum w^2 (|s| + c + BIAS_RN)^2) / W
    elements: int
    share_below: float  # of the errors, the share on the negative side

    @property
    def allowed(self) -> float:
        return self.arithmetic + BIAS_RN + self.margin

    @property
    def failed(self) -> bool:
        return abs(self.mean) > self.allowed


def bias(errors: np.ndarray, bound: np.ndarray, arithmetic: np.ndarray, delta: float) -> Bias:
    """:class:`Bias` of ``errors`` s_i (ulps) that the rule bounds by ``bound`` b_i, of which
    the fp32 arithmetic's share is at most ``arithmetic`` c_i."""
    if errors.size == 0:
        return Bias(0.0, 0.0, math.inf, 0, 0.0)
    w = 1.0 / np.square(np.maximum(bound, 0.5))
    weight = float(w.sum())
    x = math.sqrt(2 * math.log(2 / delta))
    rounding = np.minimum(np.abs(errors) + arithmetic, bound) + BIAS_RN  # >= |q_i - centre_i| where the rule holds
    return Bias(mean=float((w * errors).sum()) / weight, arithmetic=float((w * arithmetic).sum()) / weight,
                margin=x * math.sqrt(float(np.sum(np.square(w * rounding)))) / weight, elements=int(errors.size),
                share_below=float(np.mean(errors < 0)))


@dataclasses.dataclass
class _Pool:
    """One output's counted elements over the calls: reference, error less round-to-nearest's
    error of the reference, rule bound and fp32 share with the possible flip (ulps)."""

    parts: list = dataclasses.field(default_factory=list)

    def add(self, got: torch.Tensor, expected, allowed, fp32_share, dtype: torch.dtype) -> None:
        y = got.detach().to("cpu", torch.float64).numpy()
        r = np.asarray(expected, dtype=np.float64)
        info = torch.finfo(dtype)
        # an element the rule leaves unconstrained (masked, or an infinite bound) is not judged here either
        allowed, fp32_share = (np.broadcast_to(np.ma.filled(np.ma.asarray(a, dtype=np.float64), np.inf), r.shape)
                               for a in (allowed, fp32_share))
        keep = np.isfinite(r) & np.isfinite(y) & (np.abs(r) >= counted_from(dtype)) & (np.abs(r) <= float(info.max)) \
            & np.isfinite(allowed)
        r, y = r[keep], y[keep]
        spacing = tolerance.ulp(r, dtype)
        b, c = (a[keep] / spacing for a in (allowed, fp32_share))
        # the error of rounding the exact value itself (round-to-nearest-even, as torch converts):
        # the centre a correct store errs about; where r lies within the fp32 share of a
        # midpoint, the fp32 result may round to the other neighbour, one spacing away
        centre = (torch.from_numpy(r).to(dtype).double().numpy() - r) / spacing
        flips = (0.5 - np.abs(centre) <= c).astype(np.float64)
        self.parts.append((r, (y - r) / spacing - centre, b, c + flips))

    def judged(self, delta: float) -> dict[str, Bias]:
        """Per direction, the :class:`Bias` of the errors about round-to-nearest's own (centred)."""
        r, e, b, c = (np.concatenate(x) for x in zip(*self.parts)) if self.parts else (np.zeros(0),) * 4
        _, first = np.unique(r, return_index=True)  # one sample per reference value
        r, e, b, c = r[first], e[first], b[first], c[first]
        return {"toward zero": bias(np.sign(r) * e, b, c, delta), "toward -inf": bias(e, b, c, delta)}


def _reseeded(case: Case, k: int) -> Case:
    """``case`` with every tensor's seed moved by ``k``: the same shapes, layouts and scalars."""
    return dataclasses.replace(case, tensors={n: dataclasses.replace(s, seed=(s.seed + k) % 2**32)
                                              for n, s in case.tensors.items()})


def _collect(op: OpSpec, case: Case, impl: Implementation, pools: Mapping[str, _Pool], observe: Observe) -> None:
    outs, expected, inputs64, p = observe(case, impl)
    allowed = op.tolerance(case, inputs64, expected, p)
    fp32_share = op.tolerance(case, inputs64, expected, compute_only(p))
    dtype = getattr(torch, case.dtype)
    for name, pool in pools.items():
        if name in outs:  # an output the implementation returns (declared returns)
            pool.add(outs[name], expected[name], allowed[name], fp32_share[name], op.output_dtypes.get(name, dtype))


def measure(case: Case, impl: Implementation, observe: Observe) -> tuple[int, dict[str, dict[str, Bias]]]:
    """The calls made, and per narrowing output per direction its :class:`Bias`, pooled over
    calls on reseeded inputs until every bound is at most DETECTABLE (or MAX_CALLS).
    ``observe(case, impl)`` runs one call: (outputs, fp64 reference, fp64 inputs, precision)."""
    op = OPS[case.op]
    names = judged_outputs(op, getattr(torch, case.dtype))
    pools = {n: _Pool() for n in names}
    delta = FALSE_ALARM / (len(DIRECTIONS) * max(len(names), 1))
    calls = 0
    while True:
        _collect(op, case if calls == 0 else _reseeded(case, calls), impl, pools, observe)
        calls += 1
        found = {n: pool.judged(delta) for n, pool in pools.items()}
        widest = max((b for by in found.values() for b in by.values()), key=lambda b: b.allowed)
        if widest.allowed <= DETECTABLE or calls == MAX_CALLS:
            return calls, found
        # the margin shrinks as 1 / sqrt(calls): stop early where MAX_CALLS cannot bring it down
        room = DETECTABLE - widest.arithmetic - BIAS_RN
        if calls >= 2 and (room <= 0 or calls * (widest.margin / room) ** 2 > MAX_CALLS):
            return calls, found


def judge(calls: int, found: Mapping[str, Mapping[str, Bias]]) -> None:
    """The verdict on :func:`measure`'s figures: an AssertionError for a bias past its bound;
    an example in which no output could show a bias of DETECTABLE is discarded (``assume``)."""
    judgeable = {n: by for n, by in found.items() if all(b.allowed <= DETECTABLE for b in by.values())}
    assume(judgeable)  # the check could not fail on this example: discarded, not passed
    for name, by in judgeable.items():
        for direction, b in by.items():
            if b.failed:
                side = direction if b.mean < 0 else DIRECTIONS[direction]
                raise AssertionError(
                    f"output {name!r} is biased {side}: its mean error is {b.mean:+.3f} ulp (weighted, over "
                    f"{b.elements} distinct elements of {calls} call(s) on reseeded inputs of these shapes), where "
                    f"round-to-nearest allows {b.allowed:.3f} (fp32 arithmetic {b.arithmetic:.3f} + rounding "
                    f"{BIAS_RN:.3f} + statistical margin {b.margin:.3f}, false-alarm rate {FALSE_ALARM:.0e} per "
                    f"example); {b.share_below:.0%} of the errors are {direction}. Each element may be within an "
                    "ulp, but a store that truncates (rounds toward zero) or rounds down moves every one the same "
                    "way, and the bias adds up over layers (ROCm/aiter#5151: a residual stream shrank 8.98 % in 72 "
                    "calls).")
