"""gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None)
-> (o, final_state): strategy, tolerance bindings and properties.

Domain (the contract): ||k_t||_2 <= 1 (l2-normalised keys, as fla's
``use_qk_l2norm_in_kernel`` and Qwen3-Next give them, or shorter), beta_t in [0, 1] and
g_t <= 0 finite, so that every exp(g_t) (I - beta_t k_t k_t^T) is a contraction; q, v and
the initial state any finite values whose outputs stay finite. Keys are drawn as values of
any family and normalised in fp64 (times ``key_norm`` 1, 1/2 or 1/16; a zero row stays
zero), then rounded (a rounded unit row may be longer than 1 by a few u; beta ||k||^2
stays far below 2). beta is drawn as sigmoid(x) or min(|x|, 1) (exact 0s and 1s), g as
-|x| or log(sigmoid(x)) over scales from 1e-3 to 1e3 (a decay to nothing within a token).
The maps are recorded in the case's params, so a case rebuilt from its JSON replays.
Out of the contract: beta in (1, 2] (fla's ``allow_neg_eigval``), a contraction only
while beta ||k||^2 <= 2, which a rounded unit key can break; beta ||k||^2 > 2 makes the
state grow geometrically, for which no tolerance can be stated.

Magnitudes: with P = max over columns of ||h0[:, e]|| + sum_t beta_t |v_t[e]| ||k_t|| (a
bound on every state column), v and the initial state are scaled by a power of two until
P and every |v| are at most the dtype's largest value / 16 (fp32's for bf16), then q
until scale max_t ||q_t|| P is (the linear-attention family's rule). Under the Triton
interpreter bf16 inputs below the smallest normal are flushed to 0 (its bf16 subnormal
conversion is wrong; the GPU draws them).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck import backend, generic
from tritoncheck.backend import BF16_DOT_ON_INTERPRETER
from tritoncheck.bad_input import OTHER_DEVICE, BadInput, Spoiler, randn, scalar_spoilers, tensor_spoilers
from tritoncheck.config import CONFIG
from tritoncheck.declarations import BF16_DOT_UPCAST, CHUNK_SIZES
from tritoncheck.large_problem import LargeProblem, rows_past_int32
from tritoncheck.limits import NO_LIMITS, Limits, OutsideLimits
from tritoncheck.oracle import assert_close
from tritoncheck.parity import control_baseline
from tritoncheck.properties import chunked_scan
from tritoncheck.properties import gated_delta_rule_tolerance as rules
from tritoncheck.properties.chunked_scan import (
    cases_with,
    cut_position,
    declares_chunk_sizes,
    largest,
    packed_lengths,
    scale_into,
    upstream_with,
)
from tritoncheck.references import gated_delta_rule as ref
from tritoncheck.registry import OPS, Check, Implementation, OpSpec, register
from tritoncheck.strategies import Case, layouts, special_values, tensors
from tritoncheck.tolerance import Precision, unit_roundoff

OP = "gated_delta_rule"
ARGS = ("q", "k", "v", "g", "beta", "scale", "initial_state", "cu_seqlens")
CHUNKS = (16, 32, 64)  # generic chunk edges (fla's and this kernel's chunk sizes)
HEAD_DIMS = (16, 32, 8, 64, 5, 128)
SCALES_ARG = (None, 1.0, 0.25)
KEY_NORMS = (1.0, 0.5, 2.0**-4)
BETA_MAPS = ("sigmoid", "clip")
G_MAPS = ("neg_abs", "log_sigmoid")
VALUE_FAMILIES = ("normal", "constant", "outlier", "offset", "tiny", "near_max")
GATE_FAMILIES = ("normal", "constant", "outlier", "tiny")
DOMAIN_DIVISOR = 16.0
LAYOUT = chunked_scan.ScanLayout(tokens={"q": 1, "k": 1, "v": 1, "g": 1, "beta": 1, "o": 1},
                                 state_in="initial_state", state_out="final_state", offsets="cu_seqlens",
                                 outputs=("o", "final_state"))


class DeltaCase(Case):
    """A gated_delta_rule case whose keys, betas and gates are mapped into the domain and
    whose magnitudes are scaled (module docstring) when materialised."""

    @classmethod
    def of(cls, case: Case) -> DeltaCase:
        if isinstance(case, DeltaCase):
            return case
        return cls(case.op, case.dtype, case.args, case.tensors, dict(case.params), dict(case.kwargs))

    def replace(self, **changes) -> DeltaCase:
        return DeltaCase.of(super().replace(**changes))

    def materialise(self, device="cpu"):
        values = super().materialise(device)
        q, k, v, g, beta = (values[n] for n in ("q", "k", "v", "g", "beta"))
        k64 = k.to(torch.float64)
        norms = k64.norm(dim=-1, keepdim=True)
        unit = torch.where(norms > 0, k64 / norms.clamp(min=1e-300), 0.0) * self.params.get("key_norm", 1.0)
        k.copy_(unit.to(k.dtype))
        b64 = beta.to(torch.float64)
        beta.copy_((torch.sigmoid(b64) if self.params.get("beta_map") == "sigmoid" else b64.abs().clamp(max=1.0))
                   .to(beta.dtype))
        g64 = g.to(torch.float64)
        g.copy_((torch.nn.functional.logsigmoid(g64) if self.params.get("g_map") == "log_sigmoid" else -g64.abs())
                .to(g.dtype))
        dtype = q.dtype
        limit = min(float(torch.finfo(dtype).max), float(torch.finfo(torch.float32).max)) / DOMAIN_DIVISOR
        h0 = values.get("initial_state")
        weights = beta.to(torch.float64) * k.to(torch.float64).norm(dim=-1)  # [B, T, H]

        def state_bound() -> float:  # P: every column of every state is at most this long
            writes = torch.einsum("bth,bthv->bhv", weights, v.to(torch.float64).abs())
            start = h0.to(torch.float64).norm(dim=-2).amax(dim=0) if h0 is not None and h0.numel() else 0.0
            return largest(writes + start) if writes.numel() else 0.0

        state = [v] + ([h0] if h0 is not None else [])
        scale_into(state, max(state_bound(), largest(v), largest(h0)), limit)
        p_bound = state_bound()
        scale = ref.resolved_scale(values["scale"], q.shape[-1])
        q_norm = largest(q.to(torch.float64).norm(dim=-1)) if q.numel() else 0.0
        scale_into([q], max(scale * q_norm * p_bound, largest(q)), limit)
        if dtype == torch.bfloat16 and backend.current() == "interpret":
            tiny = float(torch.finfo(dtype).tiny)
            for t in (q, k, v, g, beta):
                if t.dtype == torch.bfloat16:
                    t.masked_fill_(t.abs() < tiny, 0.0)
        return values


def _head_dim(draw, limits: Limits, dim: str, cap: int) -> int:
    return draw(limits.specialised_pick(OP, dim, [n for n in HEAD_DIMS if n <= cap]))


@st.composite
def gated_delta_rule_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS, varlen: bool | None = None,
                           initial: bool | None = None, max_t: int | None = None, min_t: int = 1) -> Case:
    """q, k [B, T, H, K], v [B, T, H, V], g, beta [B, T, H], an initial state [N, H, K, V]
    float32 half the time, packed sequences (B = 1, cu_seqlens int32 or int64) a third of
    the time. ``varlen``, ``initial``: force either; ``max_t``, ``min_t`` bound T."""
    if limits.held("cu_seqlens"):
        varlen = False
    if limits.held("initial_state"):
        initial = False
    one_row = limits.min_size.get("B", 1) <= 1 and 1 in limits.sizes.get("B", (1,))
    if limits.bounds("T") or not one_row:  # packed: B = 1 and T the sum of free lengths
        if varlen:
            raise OutsideLimits("packed sequences need B = 1 and T free; the declared limits bound "
                                f"{'T' if limits.bounds('T') else 'B'}")
        varlen = False
    varlen = draw(st.integers(0, 2)) == 0 if varlen is None else varlen
    initial = draw(st.booleans()) if initial is None else initial
    kd = _head_dim(draw, limits, "K", CONFIG.pick(32, 128))
    vd = _head_dim(draw, limits, "V", CONFIG.pick(32, 128))
    t_max = min(max_t or 10**9, CONFIG.pick(70, 1024))
    # the rules carry a [V, K, K] variance per head a token: bound B H T V K^2
    t_max = max(min_t, min(t_max, CONFIG.pick(2**23, 2**33) // (vd * kd * kd * 2)))
    h = draw(limits.specialised(OP, "H", 1, CONFIG.pick(2, 4), span=(1, 4)))
    if varlen:
        lengths = draw(packed_lengths(max(min_t, t_max // h), CHUNKS))
        b, n_tokens = 1, sum(lengths)
        assume(n_tokens >= min_t)
    else:
        b = draw(limits.specialised(OP, "B", 1, 2, span=(1, 2)))
        # T past the default chunk (64) as often with two rows as with one
        n_tokens = draw(limits.size("T", min_t, max(min_t, t_max // max(1, b * h // 2)), blocks=CHUNKS))
    n_seq = len(lengths) if varlen else b
    gate_dtype = draw(st.sampled_from((dtype, torch.float32)))
    specs = {}
    for name, last, fams in (("q", kd, VALUE_FAMILIES), ("k", kd, VALUE_FAMILIES), ("v", vd, VALUE_FAMILIES)):
        spec = draw(tensors((b, n_tokens, h, last), dtype, families=fams,
                            specials=special_values(dtype) if name != "k" else (), layout=False))
        specs[name] = dataclasses.replace(spec, layout=draw(layouts(4)))
    for name in ("g", "beta"):
        spec = draw(tensors((b, n_tokens, h), gate_dtype, families=GATE_FAMILIES,
                            scales=(1.0, 1e-3, 0.1, 10.0, 1e3), layout=False))
        specs[name] = dataclasses.replace(spec, layout=draw(layouts(3)))
    params = {"scale": draw(limits.choice("scale", SCALES_ARG)), "key_norm": draw(st.sampled_from(KEY_NORMS)),
              "beta_map": draw(st.sampled_from(BETA_MAPS)), "g_map": draw(st.sampled_from(G_MAPS))}
    if initial:
        specs["initial_state"] = draw(tensors((n_seq, h, kd, vd), torch.float32, families=("normal", "constant",
                                                                                           "outlier"),
                                              scales=(1.0, 0.1, 10.0)))
    else:
        params["initial_state"] = None
    if varlen:
        specs["cu_seqlens"] = chunked_scan.offsets_spec(lengths, draw(st.sampled_from(("int32", "int64"))))
    else:
        params["cu_seqlens"] = None
    return DeltaCase(OP, str(dtype).replace("torch.", ""), ARGS, specs, params)


def _state_shape(case: Case) -> tuple[int, ...]:
    """[N, H, K, V]: one state per sequence."""
    b, _, h, kd = case.tensors["q"].shape
    n = case.tensors["cu_seqlens"].shape[0] - 1 if "cu_seqlens" in case.tensors else b
    return (n, h, kd, case.tensors["v"].shape[-1])


# ------------------------------------------------------------------------- tolerance


def gdr_tolerance(case, inputs64, expected, p):
    o, f = rules.gated_delta_rule(*(inputs64[n] for n in ("q", "k", "v", "g", "beta")), inputs64["scale"],
                                  inputs64["initial_state"], inputs64["cu_seqlens"], expected["o"],
                                  expected["final_state"], p)
    return {"o": o, "final_state": f}


def _store(dtype_name: str, p: Precision) -> float:
    dtype = getattr(torch, dtype_name)
    u = unit_roundoff(dtype)
    return 2 * u if dtype == torch.bfloat16 and p.backend == "interpret" else u


def gdr_grad_tolerance(case, inputs64, outputs64, grads64, p):
    stores = {n: _store(case.tensors[n].dtype, p) for n in ("g", "beta")}
    return rules.gated_delta_rule_grad(*(inputs64[n] for n in ("q", "k", "v", "g", "beta")), inputs64["scale"],
                                       inputs64["initial_state"], inputs64["cu_seqlens"], inputs64["do"],
                                       inputs64["dfinal_state"], grads64, p, stores=stores)


def _allowed(case: Case, values, impl: Implementation) -> dict[str, np.ndarray]:
    """The rule's allowance for the whole call on ``values`` (from the fp64 reference)."""
    expected, inputs64 = OPS[OP].expected(case, values)
    return gdr_tolerance(case, inputs64, expected, generic.precision(impl, case))


# ------------------------------------------------------------------------- checks


def _values(case: Case) -> tuple[DeltaCase, dict]:
    case = DeltaCase.of(case)
    return case, case.materialise(backend.device())


def gdr_matches_reference(case: Case, impl: Implementation) -> None:
    """o and the final state match the fp64 recurrence, run on the same rounded inputs,
    within the derived tolerance (properties/gated_delta_rule_tolerance.py)."""
    generic.matches_reference(DeltaCase.of(case), impl)


def _gradients_in_domain(case: Case, inputs64, outputs64, grads64) -> None:
    """The gradients, like the outputs, must be finite in the dtype: a case whose fp64
    gradients pass the dtype's largest value / 16 (an upstream gradient of 1e3 on a state
    near the range's end) is discarded, not compared with an overflow."""
    limit = min(float(torch.finfo(getattr(torch, case.dtype)).max), float(torch.finfo(torch.float32).max))
    assume(all(np.all(np.abs(g) <= limit / DOMAIN_DIVISOR) for g in grads64.values()))


def gdr_gradients_match_reference(case: Case, impl: Implementation) -> None:
    """dq, dk, dv, dg, dbeta and d initial_state match fp64 autograd of the recurrence on the
    same rounded inputs and upstream gradients, within the derived tolerance."""
    generic.gradients_match_reference(DeltaCase.of(case), impl, in_domain=_gradients_in_domain)


def gdr_inputs_unchanged(case: Case, impl: Implementation) -> None:
    """The call leaves every input's storage bit for bit as it was (the initial state too:
    an in-place state update belongs to a decoding cache, not to this contract)."""
    generic.inputs_unchanged(DeltaCase.of(case), impl)


def gdr_calls_independent(case: Case, impl: Implementation) -> None:
    """calls_independent (tritoncheck/generic.py) on inputs mapped into the domain."""
    generic.calls_independent(DeltaCase.of(case), impl)


def gdr_deterministic(case: Case, impl: Implementation) -> None:
    """Two calls on the same inputs give bitwise identical outputs and gradients."""
    generic.deterministic(DeltaCase.of(case), impl)


def gdr_backward_repeatable(case: Case, impl: Implementation) -> None:
    """A second backward through the same graph gives the first one's gradients bit for bit."""
    generic.backward_repeatable(DeltaCase.of(case), impl)


def chunk_size_invariant(case: Case, impl: Implementation) -> None:
    """Every chunk size the implementation declares gives the same o and final state,
    within twice the derived tolerance."""
    case, values = _values(case)
    chunked_scan.chunk_size_invariant(impl, values, case.args, _allowed(case, values, impl))


def split_in_two_carries_state(case: Case, impl: Implementation) -> None:
    """The sequence cut in two, the second call started from the first one's final state,
    gives the one call's o and final state (within twice the derived tolerance)."""
    case, values = _values(case)
    assume(values["q"].shape[1] >= 2)
    cut = cut_position(values["q"].shape[1], case.tensors["v"].seed, CHUNKS)
    chunked_scan.pieces_equal_one_call(impl, values, case.args, LAYOUT, [cut],
                                       _allowed(case, values, impl), "two calls, the state carried")


def token_by_token_equals_chunked(case: Case, impl: Implementation) -> None:
    """Decoding: one call a token, each started from the previous call's final state,
    gives the one (chunked) call's o and final state, within twice the derived tolerance."""
    case, values = _values(case)
    n = values["q"].shape[1]
    chunked_scan.pieces_equal_one_call(impl, values, case.args, LAYOUT, list(range(1, n)),
                                       _allowed(case, values, impl), "one call a token, the state carried")


def packed_equals_separate_calls(case: Case, impl: Implementation) -> None:
    """Packed sequences (cu_seqlens, B = 1, an initial state per sequence) give each
    sequence's call on it alone, within twice the derived tolerance."""
    case, values = _values(case)
    chunked_scan.packed_equal_separate_calls(impl, values, case.args, LAYOUT, _allowed(case, values, impl))


def beta_zero_decays_initial_state(case: Case, impl: Implementation) -> None:
    """beta = 0 writes nothing: o_t = scale exp(G_t) h0^T q_t and the final state is
    exp(G_T) h0 (G_t the cumulative log decay of the sequence up to t), within the derived
    tolerance of that closed form."""
    case, values = _values(case)
    values["beta"].zero_()
    q, g, h0 = (values[n].detach().to(torch.float64) for n in ("q", "g", "initial_state"))
    scale = ref.resolved_scale(values["scale"], q.shape[-1])
    B, T, H, _ = q.shape
    o = torch.zeros(B, T, H, values["v"].shape[-1], dtype=torch.float64, device=q.device)
    final = torch.zeros_like(h0)
    for n, (b, s, e) in enumerate(ref.sequences(B, T, values["cu_seqlens"])):
        decay = torch.exp(torch.cumsum(g[b, s:e], dim=0))  # [T_n, H]
        o[b, s:e] = scale * decay[..., None] * torch.einsum("thk,hkv->thv", q[b, s:e], h0[n])
        final[n] = (decay[-1][:, None, None] if e > s else 1.0) * h0[n]
    _, outs = generic.run(case, impl, values)
    _, inputs64 = OPS[OP].expected(case, values)
    allowed = gdr_tolerance(case, inputs64, {"o": o.cpu().numpy(), "final_state": final.cpu().numpy()},
                            generic.precision(impl, case))
    for name, want in (("o", o), ("final_state", final)):
        assert_close(name, outs[name], want.cpu().numpy(), allowed[name],
                                    what="beta = 0: the initial state, decayed", dtype=outs[name].dtype)


def g_zero_is_ungated(case: Case, impl: Implementation) -> None:
    """g = 0 (no decay): o and the final state are the ungated delta rule's, the fp64
    recurrence with exp(0) = 1 at every step, within the derived tolerance."""
    case, values = _values(case)
    values["g"].zero_()
    before = generic.snapshot(values)
    _, outs = generic.run(case, impl, values)
    generic.assert_matches_reference(OPS[OP], case, impl, before, outs)


# ------------------------------------------------------------------------- side checks


def _large(dtype: torch.dtype, device) -> dict:
    """q, k, v [B, 4099, 4, 32] past 2**31 elements each (B = 4098 rows), keys
    l2-normalised, beta in (0, 1), g in (-1, 0), an initial state per row: each row is
    one sequence of 4099 tokens (65 chunks of 64, the last one token long)."""
    n, h, d = 4099, 4, 32
    rows = rows_past_int32(n * h * d)  # when built: PAST_INT32 as it is then

    def rand(*shape):  # seeded by the check (torch.manual_seed)
        return torch.rand(shape, device=device, dtype=torch.float32)

    k = torch.nn.functional.normalize(torch.randn((rows, n, h, d), device=device), dim=-1)
    return {"q": torch.randn((rows, n, h, d), device=device).to(dtype), "k": k.to(dtype),
            "v": torch.randn((rows, n, h, d), device=device).to(dtype),
            "g": (-rand(rows, n, h)).to(dtype), "beta": rand(rows, n, h).to(dtype),
            "initial_state": torch.randn((rows, h, d, d), device=device)}


def _valid(dims, device) -> dict:
    b, n, h, d = dims["b"], dims["n"], dims["h"], dims["d"]
    return {"q": randn((b, n, h, d), device), "k": torch.nn.functional.normalize(randn((b, n, h, d), device), dim=-1),
            "v": randn((b, n, h, d + 1), device), "g": -randn((b, n, h), device).abs(),
            "beta": randn((b, n, h), device).sigmoid(), "scale": None,
            "initial_state": randn((b, h, d, d + 1), device), "cu_seqlens": None}


def _state_spoilers() -> tuple[Spoiler, ...]:
    s = "initial_state"
    return (Spoiler(s, "a list instead of a tensor", lambda a: a[s].tolist()),
            Spoiler(s, "float16", lambda a: a[s].half()),
            Spoiler(s, "one sequence more", lambda a: torch.cat([a[s], a[s][:1]])),
            Spoiler(s, "a value dim more", lambda a: torch.cat([a[s], a[s][..., :1]], dim=-1)),
            Spoiler(s, "on another device", lambda a: torch.empty_like(a[s], device=OTHER_DEVICE)))


def _offset_spoilers() -> tuple[Spoiler, ...]:
    c = "cu_seqlens"

    def ending(a, shift):
        return torch.tensor([0, a["q"].shape[1] + shift], dtype=torch.int32, device=a["q"].device)
    return (Spoiler(c, "ending past T", lambda a: ending(a, 1)),
            Spoiler(c, "float offsets", lambda a: ending(a, 0).float()),
            Spoiler(c, "a list", lambda a: ending(a, 0).tolist()),
            Spoiler(c, "decreasing", lambda a: torch.tensor([0, 2, 1, a["q"].shape[1]], dtype=torch.int64,
                                                            device=a["q"].device)))


register(OpSpec(
    name=OP,
    signature="gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None) -> (o, final_state)",
    meaning="fla's layout and convention: `q`, `k` `[B, T, H, K]`, `v [B, T, H, V]`, `g` (log decay), `beta` "
            "`[B, T, H]` (any float dtype); the state `h [K, V]` per head is fla's (`S^T` of `S_t = S_{t-1} exp(g_t) "
            "(I - beta_t k_t k_t^T) + beta_t v_t k_t^T`): per token `h'_t = exp(g_t) h_{t-1}`, "
            "`h_t = h'_t + k_t beta_t (v_t - h'_t^T k_t)^T`, `o_t = scale h_t^T q_t` (`scale` None: `K ** -0.5`); "
            "no normalisation inside (q and k are used as given). `initial_state`, `final_state` `[N, H, K, V]` "
            "float32 (None: zeros); N = B, or with `cu_seqlens` (int32/int64 `[N + 1]`, from 0, non-decreasing, "
            "ending at T; B = 1) the N packed sequences, each its own recurrence. Domain: `||k_t|| <= 1`, "
            "`beta_t` in [0, 1], `g_t <= 0` (every step a contraction); `beta` in (1, 2] (negative eigenvalues) "
            "is out of it. Gradients to q, k, v, g, beta and initial_state.",
    arguments=ARGS,
    outputs=("o", "final_state"),
    scalars=("scale",),
    dims={"B": ("q", 0), "T": ("q", 1), "H": ("q", 2), "K": ("q", 3), "V": ("v", 3)},
    choices={"scale": SCALES_ARG},
    output_dtypes={"final_state": torch.float32},
    kernel="tritoncheck.kernels.gated_delta_rule:gated_delta_rule",
    controls=("tritoncheck.controls.gated_delta_rule:torch_gated_delta_rule_recurrent",
              "tritoncheck.controls.gated_delta_rule:torch_gated_delta_rule_chunked"),
    baseline=control_baseline("tritoncheck.controls.gated_delta_rule:torch_gated_delta_rule_recurrent"),
    large_problem=LargeProblem(_large, "rows", ("q", "k", "v", "g", "beta", "initial_state")),
    bad_input=BadInput(
        _valid,
        tensor_spoilers("q", fixed_rank=True) + tensor_spoilers("k", fixed_rank=True)
        + tensor_spoilers("v", fixed_rank=True) + tensor_spoilers("g", fixed_rank=True)
        + tensor_spoilers("beta", fixed_rank=True) + _state_spoilers() + _offset_spoilers()
        + scalar_spoilers("scale", (-1.0, math.nan, math.inf, "tiny"))),
    reference=ref.gated_delta_rule,
    torch_reference=ref.gated_delta_rule_torch,
    cases=gated_delta_rule_cases,
    tolerance=gdr_tolerance,
    grad_tolerance=gdr_grad_tolerance,
    grad_inputs=("q", "k", "v", "g", "beta", "initial_state"),
    grad_outputs=("o", "final_state"),
    output_shapes=lambda case: {"o": case.tensors["v"].shape, "final_state": _state_shape(case)},
    # no bf16 tl.dot on the interpreter: bfloat16 runs there only for kernels that upcast first
    backend_limits=(BF16_DOT_ON_INTERPRETER,),
    declarations=(BF16_DOT_UPCAST, CHUNK_SIZES),
    checks=(
        Check("matches_reference", gdr_matches_reference),
        Check("gradients_match_reference", gdr_gradients_match_reference,
              cases=upstream_with(initial=True, max_t=CONFIG.pick(40, 512)), requires=generic._needs_backward),
        Check("inputs_unchanged", gdr_inputs_unchanged),
        Check("calls_independent", gdr_calls_independent),
        Check("deterministic", gdr_deterministic, cases=upstream_with(initial=True, max_t=CONFIG.pick(40, 512))),
        Check("backward_repeatable", gdr_backward_repeatable, cases=upstream_with(initial=True, max_t=CONFIG.pick(40, 512)),
              requires=generic._needs_backward),
        Check("chunk_size_invariant", chunk_size_invariant, requires=declares_chunk_sizes),
        Check("split_in_two_carries_state", split_in_two_carries_state, cases=cases_with(varlen=False, min_t=2),
              needs_arguments=("initial_state",)),
        Check("token_by_token_equals_chunked", token_by_token_equals_chunked,
              cases=cases_with(varlen=False, max_t=CONFIG.pick(12, 128)), needs_arguments=("initial_state",)),
        Check("packed_equals_separate_calls", packed_equals_separate_calls, cases=cases_with(varlen=True),
              needs_arguments=("cu_seqlens", "initial_state")),
        Check("beta_zero_decays_initial_state", beta_zero_decays_initial_state, cases=cases_with(initial=True),
              needs_arguments=("initial_state",)),
        Check("g_zero_is_ungated", g_zero_is_ungated),
    ),
))
