"""elu_feature_map(x) and linear_attention(q, k, v, causal, eps): strategies,
tolerance bindings and properties.

Domain of linear_attention (the contract: q, k feature-mapped, non-negative; v any
real values): q and k are drawn as values of any family and then mapped to features,
either by elu(x) + 1 (the contract's feature map, computed in fp64 and rounded to the
dtype) or by |x| (features that span many orders of magnitude, down to the 1e-4 ..
1e-6 where eps matters). The map is recorded in the case's params (``q_map``,
``k_map``), so a case rebuilt from its JSON replays with the same inputs. The
contract's intermediates must be finite in the input dtype: z = sum_j k_j,
P = sum_j k_j |v_j|^T (which bounds |S|), q_i . z and q_i . P, the inputs q and v
themselves and the output bound q_i . P / eps, all at most the dtype's largest
value / 16 (fp32's for bf16). A case whose draw exceeds that has k,
then q, then v scaled down by a power of two until it holds (the same rule
softmax follows: an fp16 user whose ``einsum`` state overflows fp16 has left the
contract; the kernel's fp32 state does not overflow there, but a plain implementation
in the input dtype does). The scaling is part of materialising the case, so every
check and the replay see the same inputs. Under the Triton interpreter, bf16 inputs
below the smallest normal number are flushed to 0 (the interpreter converts bf16
subnormals to fp32 wrongly; the GPU profile draws them).

elu_feature_map under the interpreter, bf16: the interpreter also garbles fp32
subnormal results cast to bf16 (x below about -87.3 gives a wrong value below 2^-126
where the GPU is right). No check fails on it: the wrong value and the right one both
lie in [0, 2^-126), inside the underflow floor every rule allows (fp32's smallest
normal, for FTZ), and it is never 0 where a positive value is due; so bf16 runs on
the interpreter in full, with no backend limit.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck import backend, generic, parity, rounding_bias, tolerance
from tritoncheck.backend import BF16_DOT_ON_INTERPRETER
from tritoncheck.bad_input import BadInput, Spoiler, randn, scalar_spoilers, tensor_spoilers, widen_last
from tritoncheck.config import CONFIG
from tritoncheck.declarations import BF16_DOT_UPCAST, CHUNK_SIZES
from tritoncheck.generic import generic_checks, precision, run
from tritoncheck.large_problem import LargeProblem, heads, row_wise
from tritoncheck.limits import NO_LIMITS, Limits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.parity import control_baseline
from tritoncheck.properties import linear_attention_tolerance as rules
from tritoncheck.references import linear_attention as ref
from tritoncheck.registry import OPS, Check, Implementation, OpSpec, register
from tritoncheck.strategies import FAMILIES, Case, Layout, TensorSpec, layouts, sizes, special_values, tensors

# ------------------------------------------------------------------ elu_feature_map

ELU_BLOCK = 1024  # elements per program of the project kernel


def _elu_specials(dtype: torch.dtype) -> list[float]:
    """The dtype's specials (+-max, 0, -0, tiny, subnormal, +-inf) and large
    negatives on both sides of each dtype's underflow edge of exp (fp16 -16.6,
    bf16 -92.2, fp32 -103.3)."""
    return special_values(dtype, allow_inf=True) + [-10.0, -17.0, -20.0, -88.0, -93.0, -104.0, -1e4]


@st.composite
def elu_feature_map_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """x of rank 1 to 4, any layout, every value family (near the max, tiny, -inf
    masks, ...) and injected specials: the contract defines y everywhere
    (elu(-inf) + 1 = 0, elu(inf) + 1 = inf, NaN stays NaN)."""
    budget = CONFIG.pick(4096, 2**20)
    last = draw(limits.specialised("elu_feature_map", "N", 1, budget, blocks=(ELU_BLOCK,)))
    rank = draw(st.integers(1, 4))
    lead = tuple(draw(st.lists(sizes(1, max(1, min(64, budget // last))), min_size=rank - 1, max_size=rank - 1)
                      .filter(lambda d: math.prod(d) * last <= budget)))
    x = draw(tensors(lead + (last,), dtype, families=FAMILIES, specials=_elu_specials(dtype), max_injections=3))
    return Case("elu_feature_map", str(dtype).replace("torch.", ""), ("x",), {"x": x})


def elu_feature_map_tolerance(case, inputs64, expected, p):
    return {"y": rules.elu_feature_map(inputs64["x"], expected["y"], p)}


def elu_feature_map_grad_tolerance(case, inputs64, outputs64, grads64, p):
    return {"dx": rules.elu_feature_map_grad(inputs64["x"], inputs64["dy"], grads64["x"], p)}


def _underflow_sweep(dtype: torch.dtype) -> torch.Tensor:
    """x from past the dtype's underflow edge of exp (its smallest subnormal) to 3."""
    info = torch.finfo(dtype)
    edge = math.log(float(info.tiny) * float(info.eps))
    return torch.linspace(edge - 3.0, 3.0, 1021, dtype=torch.float64).to(dtype)


def feature_map_positive_finite(case: Case, impl: Implementation) -> None:
    """y >= 0 and finite wherever x is finite, and y > 0 wherever the fp64 value of the
    formula rounds to a positive number of the dtype (it exceeds half the smallest
    subnormal by more than the fp32 exp's derived error). Checked on the drawn x and
    on a sweep of x across the dtype's underflow edge."""
    values = case.materialise(backend.device())
    dtype = values["x"].dtype
    sweep = _underflow_sweep(dtype).to(values["x"].device)
    for name, x in (("x", values["x"]), ("sweep", sweep)):
        _, outs = run(case, impl, {"x": x})
        xs, y = to_numpy(x), to_numpy(outs["y"])
        with np.errstate(over="ignore", invalid="ignore"):
            y64 = ref.elu_feature_map(xs)
            xf = np.where(np.isfinite(xs), xs, 0.0)
        finite = np.isfinite(xs)
        info = torch.finfo(dtype)
        half_sub = float(info.tiny) * float(info.eps) / 2
        margin = 1 + tolerance.SAFETY * tolerance.U32 * (tolerance.EXP_ULPS + np.abs(xf))
        must_be_positive = finite & (y64 > half_sub * margin)
        bad_sign = finite & ~((y >= 0) & np.isfinite(y))
        bad_zero = must_be_positive & ~(y > 0)
        for bad, what in ((bad_sign, "is negative or not finite"), (bad_zero, "is not positive")):
            if bad.any():
                idx = tuple(int(i) for i in np.argwhere(bad)[0])
                raise AssertionError(
                    f"elu_feature_map({name}){list(idx)} {what}: x = {xs[idx]!r}, y = {y[idx]!r}, fp64 y = "
                    f"{y64[idx]!r} ({int(bad.sum())} such elements of {bad.size})")


register(OpSpec(
    name="elu_feature_map",
    signature="elu_feature_map(x) -> y",
    meaning="`y = elu(x) + 1 = max(x, 0) + exp(min(x, 0))`",
    dims={"N": ("x", -1)},
    arguments=("x",),
    outputs=("y",),
    kernel="tritoncheck.kernels.linear_attention:elu_feature_map",
    controls=("tritoncheck.controls.linear_attention:torch_elu_feature_map",),
    baseline=control_baseline("tritoncheck.controls.linear_attention:torch_elu_feature_map"),
    large_problem=LargeProblem(row_wise(8191), "rows", ("x",)),
    bad_input=BadInput(lambda dims, device: {"x": randn((dims["b"], dims["n"]), device)},
                       tensor_spoilers("x", fixed_rank=False)),
    reference=ref.elu_feature_map,
    torch_reference=ref.elu_feature_map_torch,
    cases=elu_feature_map_cases,
    tolerance=elu_feature_map_tolerance,
    grad_tolerance=elu_feature_map_grad_tolerance,
    grad_inputs=("x",),
    grad_outputs=("y",),
    output_shapes=lambda case: {"y": case.tensors["x"].shape},
    checks=generic_checks(grad=True) + (
        Check("feature_map_positive_finite", feature_map_positive_finite),
    ),
))

# ------------------------------------------------------------------ linear_attention

CHUNKS = (16, 32, 64)  # the project kernel's causal chunk sizes (linear_attention.chunk_sizes)
EPSILONS = (1e-6, 1e-3)
# Feature scales: order one, the tiny features where q . z ~ eps (1e-4 with D N ~ 100
# terms gives q . z ~ 1e-6), features far below eps, and large ones.
FEATURE_SCALES = (1.0, 1e-4, 1e-2, 1e-6, 10.0, 1e3)
FEATURE_FAMILIES = ("normal", "tiny", "constant", "outlier", "offset", "near_max")
VALUE_FAMILIES = ("normal", "constant", "outlier", "offset", "tiny", "near_max")
FEATURE_MAPS = ("elu", "abs")
HEADS_SWAPPED = Layout(order=(0, 2, 1, 3))  # storage [B, N, H, D] viewed as [B, H, N, D]
DOMAIN_DIVISOR = 16.0


def _map_features(t: torch.Tensor, how: str) -> None:
    """Replace t's values (in place, its layout kept) by their features, in fp64, rounded."""
    x = t.detach().to("cpu", torch.float64)
    y = ref.elu_feature_map_torch(x) if how == "elu" else x.abs()
    t.copy_(y.to(t.dtype).to(t.device))


def _scale_into(t: torch.Tensor, size: float, limit: float) -> None:
    """Scale t (in place) by the power of two that brings ``size`` to at most ``limit``."""
    if size > limit:
        t.mul_(2.0 ** -math.ceil(math.log2(size / limit)))


def _largest(t: torch.Tensor) -> float:
    """The largest element of a non-negative tensor, 0 for an empty one."""
    return float(t.max()) if t.numel() else 0.0


class FeatureCase(Case):
    """A linear_attention case whose q and k are mapped to non-negative features and
    scaled into the domain (module docstring) when materialised."""

    @classmethod
    def of(cls, case: Case) -> FeatureCase:
        if isinstance(case, FeatureCase):
            return case
        return cls(case.op, case.dtype, case.args, case.tensors, dict(case.params), dict(case.kwargs))

    def materialise(self, device="cpu"):
        values = super().materialise(device)
        q, k, v = values["q"], values["k"], values["v"]
        _map_features(q, self.params.get("q_map", "abs"))
        _map_features(k, self.params.get("k_map", "abs"))
        dtype = q.dtype
        limit = min(float(torch.finfo(dtype).max), float(torch.finfo(torch.float32).max)) / DOMAIN_DIVISOR
        # the sizes below in fp64 on the tensors' device (the GPU's: no host round trip)
        _scale_into(k, _largest(k.to(torch.float64).sum(dim=2)), limit)
        k64 = k.to(torch.float64)
        z = k64.sum(dim=2)
        # q and v themselves too: a 3-pass tf32 dot rounds an operand within 2^-11 of
        # fp32's max to inf (then 0 * inf = NaN through a causal mask; seen on an H100)
        q64 = q.to(torch.float64)
        _scale_into(q, max(_largest((q64 * z[:, :, None]).sum(-1)), _largest(q64)), limit)
        q64 = q.to(torch.float64)
        va = v.to(torch.float64).abs()
        p_abs = k64.transpose(-1, -2) @ va
        m_abs = q64 @ p_abs
        # |o_i| <= M_i / eps (q . z_i >= 0): an output past the range is inf or NaN by the
        # order of the sums, which no rule can compare, so o stays finite as well
        o_size = _largest(m_abs) / self.params.get("eps", 1e-6)
        _scale_into(v, max(_largest(p_abs), _largest(m_abs), o_size, _largest(va)), limit)
        if dtype == torch.bfloat16 and backend.current() == "interpret":
            # The interpreter converts bf16 subnormals to fp32 wrongly (1e-39 loads as
            # 4.4e-39, 9.2e-41 as 0; right on the GPU), which moves an output whose row
            # has only subnormal features by its whole size. On the interpreter bf16
            # inputs below the smallest normal are flushed to 0; the GPU draws them.
            tiny = float(torch.finfo(dtype).tiny)
            for t in (q, k, v):
                t.masked_fill_(t.abs() < tiny, 0.0)
        return values


@st.composite
def linear_attention_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """B, H small; N around the chunk sizes; D, Dv from 1 to 128 (16 and 32 often);
    the [B, N, H, D] transposed layout common; q, k non-negative features over many
    orders of magnitude; v signed; eps 1e-6 or 1e-3; causal or not."""
    n = draw(limits.size("N", 1, CONFIG.pick(130, 4096), blocks=CHUNKS))
    d, dv = (draw(limits.specialised("linear_attention", dim, 1, CONFIG.pick(64, 128), blocks=(16, 32, 64))
                  if CONFIG.shapes is not None or limits.bounds(dim) else
                  st.one_of(st.sampled_from((16, 32)), sizes(1, CONFIG.pick(64, 128), blocks=(16, 32, 64))))
             for dim in ("D", "Dv"))
    # the fp64 reference holds [B, H, N, D, Dv] for causal: bound B H N D Dv
    budget = CONFIG.pick(2**19, 2**24) // (n * d * dv)
    b = draw(limits.specialised("linear_attention", "B", 1, max(1, min(2, budget)), span=(1, 2)))
    h = draw(limits.specialised("linear_attention", "H", 1, max(1, min(CONFIG.pick(2, 8), budget // b)),
                                span=(1, CONFIG.pick(2, 8))))
    causal = draw(limits.choice("causal", (False, True)))
    eps = draw(limits.choice("eps", EPSILONS))
    shared = draw(st.one_of(st.just(HEADS_SWAPPED), st.none()))  # one layout for q, k, v, or each its own
    specs = {}
    for name, last, fams, scales in (("q", d, FEATURE_FAMILIES, FEATURE_SCALES),
                                     ("k", d, FEATURE_FAMILIES, FEATURE_SCALES),
                                     ("v", dv, VALUE_FAMILIES, (1.0, 1e-3, 10.0, 1e3))):
        spec = draw(tensors((b, h, n, last), dtype, families=fams, scales=scales,
                            specials=special_values(dtype), layout=False))
        layout = shared or draw(st.one_of(st.just(HEADS_SWAPPED), layouts(4)))
        specs[name] = TensorSpec(**{**spec.__dict__, "layout": layout})
    maps = {"q_map": draw(st.sampled_from(FEATURE_MAPS)), "k_map": draw(st.sampled_from(FEATURE_MAPS))}
    return FeatureCase("linear_attention", str(dtype).replace("torch.", ""), ("q", "k", "v", "causal", "eps"),
                       specs, {"causal": causal, "eps": eps, **maps})


def _allowed(values, o64, causal: bool, p) -> np.ndarray:
    return rules.linear_attention(values["q"], values["k"], values["v"], o64, causal, values["eps"], p)


def la_matches_reference(case: Case, impl: Implementation) -> None:
    """o matches the fp64 reference (bidirectional form, or the causal cumsum form), run
    on the same rounded inputs, within the derived tolerance."""
    case = FeatureCase.of(case)
    values = case.materialise(backend.device())
    before = generic.snapshot(values)
    _, outs = run(case, impl, values)
    values = before  # the reference from the inputs as they were before the call (tritoncheck/generic.py)
    generic._check_output_types(OPS[case.op], case, outs)
    expected, _ = OPS[case.op].expected(case, values)
    allowed = _allowed(values, expected["o"], values["causal"], precision(impl, case))
    baseline = parity.baseline_errors(case.op, getattr(torch, case.dtype), case, values, outs, expected)
    parity.assert_close("o", outs["o"], expected["o"], allowed, baseline["o"], dtype=getattr(torch, case.dtype))


def _chunk_sizes(impl: Implementation) -> str | None:
    sizes_ = getattr(impl.fn, "chunk_sizes", None)
    return None if sizes_ else f"{impl.name} declares no chunk_sizes (no chunk_size keyword to vary)"


def chunk_size_invariant(case: Case, impl: Implementation) -> None:
    """Every chunk size the implementation declares (``fn.chunk_sizes``) gives the same
    causal output, within twice the derived tolerance (each is within it of the same
    fp64 value)."""
    case = FeatureCase.of(case).replace(causal=True)
    case = FeatureCase.of(case)
    values = case.materialise(backend.device())
    chunks = tuple(getattr(impl.fn, "chunk_sizes", None))
    # through Implementation.call, as every check's call: its declared names, layout and limits hold here too
    outs = {c: impl.outputs(impl.call(values, case.args, {"chunk_size": c}))["o"] for c in chunks}
    expected, _ = OPS[case.op].expected(case, values)
    allowed = 2 * _allowed(values, expected["o"], True, precision(impl, case))
    first = chunks[0]
    for c in chunks[1:]:
        assert_close("o", outs[c], to_numpy(outs[first]), allowed,
                     what=f"chunk_size={c} disagrees with chunk_size={first}", record=False)


def _future_split(case: Case) -> int:
    """The last position i kept: chunk edges often, else anywhere before the end."""
    n = case.tensors["q"].shape[2]
    seed = case.tensors["v"].seed
    picks = sorted({e for c in CHUNKS for e in (c - 1, c, c + 1)} | {0, n // 2, n - 2, seed % max(n - 1, 1)})
    picks = [i for i in picks if 0 <= i <= n - 2]
    return picks[seed % len(picks)]


def causal_mask_respected(case: Case, impl: Implementation) -> None:
    """Causal: changing k and v at positions j > i (to other features and values, an
    infinity or a NaN in v included) leaves o at positions <= i bitwise unchanged."""
    case = FeatureCase.of(FeatureCase.of(case).replace(causal=True))
    n = case.tensors["q"].shape[2]
    assume(n >= 2)
    i = _future_split(case)
    _, outs = run(case, impl)
    values = case.materialise(backend.device())
    other = FeatureCase.of(case.replace(tensors={
        name: TensorSpec(**{**case.tensors[name].__dict__, "seed": (case.tensors[name].seed + 1) % 2**32,
                            "injections": ()}) for name in ("k", "v")})).materialise(backend.device())
    values["k"][:, :, i + 1:] = other["k"][:, :, i + 1:]
    values["v"][:, :, i + 1:] = other["v"][:, :, i + 1:]
    if case.tensors["v"].seed % 2:  # non-finite values in the future
        values["v"][..., n - 1, 0] = float("inf")
        values["v"][..., (i + n) // 2 + 1 if (i + n) // 2 + 1 < n else n - 1, -1] = float("nan")
    _, outs2 = run(case, impl, values)
    assert_identical("o", outs["o"][:, :, : i + 1], outs2["o"][:, :, : i + 1],
                     f"o at positions <= {i} changed when k, v at positions > {i} changed")


def last_causal_equals_bidirectional(case: Case, impl: Implementation) -> None:
    """The last causal output row (which sums over every key) equals the last row of the
    bidirectional output, within the sum of their derived tolerances."""
    case = FeatureCase.of(case)
    values = case.materialise(backend.device())
    _, causal = run(case, impl, {**values, "causal": True})
    _, bidir = run(case, impl, {**values, "causal": False})
    p = precision(impl, case)
    o64 = ref.linear_attention_torch(values["q"], values["k"], values["v"], causal=False, eps=values["eps"])
    allowed = _allowed(values, o64, False, p)[:, :, -1] + _allowed(values, o64, True, p)[:, :, -1]
    assert_close("o[:, :, -1]", causal["o"][:, :, -1], to_numpy(bidir["o"][:, :, -1]), allowed,
                 what="the last causal row differs from the last bidirectional row", record=False)


def _needs_both_masks(impl: Implementation) -> str | None:
    """The check calls with causal=True and with causal=False whatever the drawn case says:
    a kernel whose declared limits exclude either is skipped up front (with this reason),
    not run to a refusal on every example after a full causal call."""
    allowed = impl.limits.values.get("causal")
    if allowed is not None and not {True, False} <= set(allowed):
        return f"{impl.name}'s declared limits allow causal in {tuple(allowed)}; this check compares both masks"
    return None


def la_inputs_unchanged(case: Case, impl: Implementation) -> None:
    """The call leaves every input's storage bit for bit as it was, the gaps of strided
    views and the bytes before a storage offset included."""
    generic.inputs_unchanged(FeatureCase.of(case), impl)


def la_calls_independent(case: Case, impl: Implementation) -> None:
    """calls_independent (tritoncheck/generic.py) on feature-mapped inputs: the second
    call's values are mapped and scaled into the domain like the first's (FeatureCase),
    each call compared with the fp64 reference of its own inputs."""
    generic.calls_independent(FeatureCase.of(case), impl)


def la_deterministic(case: Case, impl: Implementation) -> None:
    """Two calls on the same inputs give bitwise identical outputs."""
    generic.deterministic(FeatureCase.of(case), impl)


def la_unbiased_rounding(case: Case, impl: Implementation) -> None:
    """generic.unbiased_rounding on the feature-mapped inputs (q, k >= 0) the other checks use."""
    generic.unbiased_rounding(FeatureCase.of(case), impl)


def la_autotune_configs_agree(case: Case, impl: Implementation) -> None:
    """generic.autotune_configs_agree on the feature-mapped inputs the other checks use."""
    generic.autotune_configs_agree(FeatureCase.of(case), impl)


def la_tolerance(case, inputs64, expected, p):
    return {"o": rules.linear_attention(inputs64["q"], inputs64["k"], inputs64["v"], expected["o"],
                                            case.params["causal"], case.params["eps"], p)}


register(OpSpec(
    name="linear_attention",
    backend_limits=(BF16_DOT_ON_INTERPRETER,),
    declarations=(BF16_DOT_UPCAST, CHUNK_SIZES),
    signature="linear_attention(q, k, v, causal=False, eps=1e-6) -> o",
    meaning="`q`, `k` `[B, H, N, D]` (feature-mapped, non-negative), `v [B, H, N, Dv]`; bidirectional: "
            "`o_i = (q_i S) / (q_i . z + eps)` with `S = sum_j k_j v_j^T`, `z = sum_j k_j`; causal: the sums run over "
            "`j <= i`",
    scalars=("causal", "eps"),
    dims={"B": ("q", 0), "H": ("q", 1), "N": ("q", 2), "D": ("q", 3), "Dv": ("v", 3)},
    choices={"causal": (False, True)},
    arguments=("q", "k", "v", "causal", "eps"),
    outputs=("o",),
    # fla and most chunked kernels take [B, T, H, D]: fn.layout = "bnhd" passes and returns that
    layouts={"bhnd": {}, "bnhd": {"q": (0, 2, 1, 3), "k": (0, 2, 1, 3), "v": (0, 2, 1, 3), "o": (0, 2, 1, 3)}},
    kernel="tritoncheck.kernels.linear_attention:linear_attention",
    controls=("tritoncheck.controls.linear_attention:torch_linear_attention",),
    baseline=control_baseline("tritoncheck.controls.linear_attention:torch_linear_attention"),
    large_problem=LargeProblem(heads(4096, 64, positive=True, v_dim=64), "heads", ("q", "k", "v")),
    bad_input=BadInput(
        lambda dims, device: {"q": randn((dims["b"], dims["h"], dims["n"], dims["d"]), device).abs(),
                              "k": randn((dims["b"], dims["h"], dims["n"], dims["d"]), device).abs(),
                              "v": randn((dims["b"], dims["h"], dims["n"], dims["d"] + 1), device),
                              "causal": False, "eps": 1e-6},
        tensor_spoilers("q", fixed_rank=True) + tensor_spoilers("k", fixed_rank=True)
        + tensor_spoilers("v", fixed_rank=True)
        + (Spoiler("k", "a head dim other than q's", lambda a: widen_last(a["k"])),
           Spoiler("v", "another length than q", lambda a: torch.cat([a["v"], a["v"][:, :, :1]], dim=2)))
        + scalar_spoilers("eps", (-1e-6, math.nan, "tiny")) + scalar_spoilers("causal", ("yes",))),
    reference=ref.linear_attention,
    torch_reference=ref.linear_attention_torch,
    cases=linear_attention_cases,
    tolerance=la_tolerance,
    checks=(
        Check("matches_reference", la_matches_reference),
        Check("inputs_unchanged", la_inputs_unchanged),
        Check("calls_independent", la_calls_independent),
        Check("deterministic", la_deterministic),
        Check("chunk_size_invariant", chunk_size_invariant, requires=_chunk_sizes),
        Check("causal_mask_respected", causal_mask_respected),
        Check("last_causal_equals_bidirectional", last_causal_equals_bidirectional, requires=_needs_both_masks,
              needs_arguments=("causal",)),
        Check("unbiased_rounding", la_unbiased_rounding, cases=rounding_bias.narrowing_cases,
              false_alarm=rounding_bias.FALSE_ALARM),
        Check("autotune_configs_agree", la_autotune_configs_agree, requires=generic.declares_autotuned),
    ),
))
