"""ssd_scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0,
dt_max=inf, initial_state=None, cu_seqlens=None) -> (y, final_state): strategy, tolerance
bindings and properties.

Domain (the contract): A <= 0 finite (every step a contraction exp(d A) <= 1), the step d =
clamp(softplus?(dt + dt_bias), dt_min, dt_max) >= 0 (dt_min >= 0), everything else any
finite values whose outputs stay finite. A is drawn as -|a| over scales 1e-3 to 10; dt as
drawn (negatives clamp to 0 without softplus: a token that writes nothing and keeps the
state) or as |dt| (``dt_map``), over scales 1e-3 to 1e3, with dt_bias drawn shifted by 0
or -4 (``bias_shift``: Mamba-2's initialisation puts softplus(dt_bias) in [1e-3, 0.1], so
dt + dt_bias around -7 to -2). The maps are recorded in the case's params, so a case
rebuilt from its JSON replays.

Magnitudes: with P_bound the largest |h_0| + sum_t d_t |x_t[p]| |B_t[n]| (a bound on every
state element), x and the initial state are scaled by a power of two until P_bound and
every max(d, 1) |x| are at most the dtype's largest value / 16 (fp32's for bf16), B until
every max(d, 1) |B| is (B itself is a dot operand: C B^T), C until ||C_t||_1 max(P_bound,
max(d, 1) |B|) is (the chunk's C B^T and scores C B^T R d, and the state read: a chunked
form's intermediates are finite too), D until |D| max |x| is, z until max(|z|, 1) times the
output bound is.
Under the Triton interpreter bf16 inputs below the smallest normal are flushed to 0 (its
bf16 subnormal conversion is wrong; the GPU draws them).
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
from tritoncheck.properties import ssd_scan_tolerance as rules
from tritoncheck.properties.chunked_scan import (
    cases_with,
    cut_position,
    declares_chunk_sizes,
    largest,
    packed_lengths,
    scale_into,
    upstream_with,
)
from tritoncheck.references import ssd_scan as ref
from tritoncheck.registry import OPS, Check, Implementation, OpSpec, register
from tritoncheck.strategies import Case, layouts, special_values, tensors
from tritoncheck.tolerance import Precision, unit_roundoff

OP = "ssd_scan"
ARGS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus", "dt_min", "dt_max", "initial_state",
        "cu_seqlens")
PER_HEAD = ("A", "D", "dt_bias")
CHUNKS = (16, 32, 64)  # generic chunk edges (this kernel's chunk sizes; mamba_ssm's 256 is past the CPU's T)
HEAD_DIMS = (16, 32, 8, 64, 5, 128)  # P
STATE_DIMS = (16, 32, 8, 64, 5, 128)  # N
SOFTPLUS = (False, True)
DT_MINS = (0.0, 1e-3)
DT_MAXES = (math.inf, 0.1)
DT_MAPS = ("raw", "abs")
BIAS_SHIFTS = (0.0, -4.0)
VALUE_FAMILIES = ("normal", "constant", "outlier", "offset", "tiny", "near_max")
STEP_FAMILIES = ("normal", "constant", "outlier", "tiny")
DOMAIN_DIVISOR = 16.0
LAYOUT = chunked_scan.ScanLayout(tokens={"x": 1, "dt": 1, "B": 1, "C": 1, "z": 1, "y": 1},
                                 state_in="initial_state", state_out="final_state", offsets="cu_seqlens",
                                 outputs=("y", "final_state"))


def _step(values) -> torch.Tensor:
    """The effective step d in fp64, [batch, T, H]."""
    bias = values.get("dt_bias")
    return ref.effective_dt(values["dt"].detach(), None if bias is None else bias.detach(), values["dt_softplus"],
                            values["dt_min"], values["dt_max"])


class SSDCase(Case):
    """An ssd_scan case whose A, steps and magnitudes are mapped into the domain (module
    docstring) when materialised."""

    @classmethod
    def of(cls, case: Case) -> SSDCase:
        if isinstance(case, SSDCase):
            return case
        return cls(case.op, case.dtype, case.args, case.tensors, dict(case.params), dict(case.kwargs))

    def replace(self, **changes) -> SSDCase:
        return SSDCase.of(super().replace(**changes))

    def materialise(self, device="cpu"):
        values = super().materialise(device)
        x, dt, A, B, C = (values[n] for n in ("x", "dt", "A", "B", "C"))
        A.copy_(-A.to(torch.float64).abs().to(A.dtype))
        if self.params.get("dt_map") == "abs":
            dt.copy_(dt.abs())
        if values.get("dt_bias") is not None:
            values["dt_bias"].add_(self.params.get("bias_shift", 0.0))
        dtype = x.dtype
        limit = min(float(torch.finfo(dtype).max), float(torch.finfo(torch.float32).max)) / DOMAIN_DIVISOR
        h0, D, z = values.get("initial_state"), values.get("D"), values.get("z")
        d = _step(values)
        heads = torch.as_tensor(ref.group_of_heads(x.shape[2], B.shape[2]), device=x.device)
        d_max = float(d.max()) if d.numel() else 0.0

        def state_bound() -> float:  # every state element is at most this large
            if not x.numel():
                return largest(h0)
            writes = torch.einsum("bth,bthp,bthn->bhpn", d, x.to(torch.float64).abs(),
                                  B.to(torch.float64)[:, :, heads].abs()).amax(0)
            return largest(writes + (h0.to(torch.float64).abs().amax(0) if h0 is not None and h0.numel() else 0.0))

        # B as every other dot operand at most the limit, not only d |B|: a kernel's C B^T reads B
        # itself, and a declared tf32 dot rounds a value within 2**-11 of fp32's largest to inf
        scale_into([B], max(d_max, 1.0) * largest(B), limit)
        scale_into([x] + ([h0] if h0 is not None else []),
                   max(state_bound(), max(d_max, 1.0) * largest(x), largest(h0)), limit)
        bound = state_bound()
        c_l1 = largest(C.to(torch.float64).abs().sum(-1)) if C.numel() else 0.0
        scale_into([C], max(c_l1 * max(bound, max(d_max, 1.0) * largest(B)), largest(C)), limit)
        if D is not None:
            scale_into([D], largest(D) * largest(x), limit)
        if z is not None:
            out = (largest(C.to(torch.float64).abs().sum(-1)) if C.numel() else 0.0) * state_bound() \
                + largest(D) * largest(x)
            scale_into([z], max(largest(z), 1.0) * out, limit)
        if dtype == torch.bfloat16 and backend.current() == "interpret":
            tiny = float(torch.finfo(dtype).tiny)
            for name in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias"):
                t = values.get(name)
                if t is not None and t.dtype == torch.bfloat16:
                    t.masked_fill_(t.abs() < tiny, 0.0)
        return values


def _divisors(n: int) -> list[int]:
    return [g for g in range(1, n + 1) if n % g == 0]


@st.composite
def ssd_scan_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS, varlen: bool | None = None,
                   initial: bool | None = None, max_t: int | None = None, min_t: int = 1,
                   zero_step: bool = False, grads: bool = False) -> Case:
    """x, z [batch, T, H, P], B, C [batch, T, G, N] (G dividing H), dt [batch, T, H], A, D,
    dt_bias [H] (each float32 or the case's dtype), D, z and dt_bias each present half the
    time, an initial state float32 half the time, packed sequences (batch 1, cu_seqlens
    int32 or int64) a third of the time. ``varlen``, ``initial``: force either; ``max_t``,
    ``min_t`` bound T; ``zero_step``: cases that can take dt = 0 to a step of 0 (no softplus,
    dt_min 0); ``grads``: every differentiable argument present (the engine's gradient checks
    differentiate every one of them)."""
    if grads:
        held = [n for n in ("D", "z", "dt_bias", "initial_state") if limits.held(n)]
        if held:
            raise OutsideLimits(f"the gradient checks differentiate every input; the signature takes no {held}")
        initial = True
    if limits.held("cu_seqlens"):
        varlen = False
    if limits.held("initial_state"):
        initial = False
    one_row = limits.min_size.get("batch", 1) <= 1 and 1 in limits.sizes.get("batch", (1,))
    if limits.bounds("T") or not one_row:  # packed: batch 1 and T the sum of free lengths
        if varlen:
            raise OutsideLimits("packed sequences need batch = 1 and T free; the declared limits bound "
                                f"{'T' if limits.bounds('T') else 'batch'}")
        varlen = False
    varlen = draw(st.integers(0, 2)) == 0 if varlen is None else varlen
    initial = draw(st.booleans()) if initial is None else initial
    p_dim = draw(limits.specialised_pick(OP, "P", [n for n in HEAD_DIMS if n <= CONFIG.pick(32, 128)]))
    n_dim = draw(limits.specialised_pick(OP, "N", [n for n in STATE_DIMS if n <= CONFIG.pick(32, 128)]))
    h = draw(limits.specialised(OP, "H", 1, CONFIG.pick(4, 8), span=(1, 8)))
    g = draw(limits.pick("G", [n for n in _divisors(h) if n <= 4]))
    if h % g:
        raise OutsideLimits(f"the declared limits allow G = {g}, which does not divide H = {h}")
    t_max = min(max_t or 10**9, CONFIG.pick(70, 1024))
    # the rules hold a [T, T] matrix and a [P, N] state per head: bound batch H T (T + P N)
    t_max = max(min_t, min(t_max, CONFIG.pick(2**22, 2**30) // (2 * h * (t_max + p_dim * n_dim))))
    if varlen:
        lengths = draw(packed_lengths(max(min_t, t_max), CHUNKS))
        batch, n_tokens = 1, sum(lengths)
        assume(n_tokens >= min_t)
    else:
        batch = draw(limits.specialised(OP, "batch", 1, 2, span=(1, 2)))
        n_tokens = draw(limits.size("T", min_t, max(min_t, t_max // batch), blocks=CHUNKS))
    n_seq = len(lengths) if varlen else batch
    specs, params = {}, {}
    for name, shape in (("x", (batch, n_tokens, h, p_dim)), ("B", (batch, n_tokens, g, n_dim)),
                        ("C", (batch, n_tokens, g, n_dim)), ("z", (batch, n_tokens, h, p_dim))):
        if name == "z" and not grads and (limits.held("z") or draw(st.booleans())):
            params["z"] = None
            continue
        spec = draw(tensors(shape, dtype, families=VALUE_FAMILIES, specials=special_values(dtype), layout=False))
        specs[name] = dataclasses.replace(spec, layout=draw(layouts(4)))
    step_dtype = draw(st.sampled_from((dtype, torch.float32)))
    spec = draw(tensors((batch, n_tokens, h), step_dtype, families=STEP_FAMILIES,
                        scales=(1.0, 1e-3, 0.1, 10.0, 1e3), layout=False))
    specs["dt"] = dataclasses.replace(spec, layout=draw(layouts(3)))
    for name in PER_HEAD:
        if name != "A" and not grads and (limits.held(name) or draw(st.booleans())):
            params[name] = None
            continue
        scales = (1.0, 1e-3, 0.1, 10.0) if name == "A" else (1.0, 0.1, 4.0)
        specs[name] = draw(tensors((h,), draw(st.sampled_from((dtype, torch.float32))), families=STEP_FAMILIES,
                                   scales=scales))
    params["dt_softplus"] = draw(limits.choice("dt_softplus", (False,) if zero_step else SOFTPLUS))
    params["dt_min"] = draw(limits.choice("dt_min", (0.0,) if zero_step else DT_MINS))
    params["dt_max"] = draw(limits.choice("dt_max", DT_MAXES))
    params.update(dt_map=draw(st.sampled_from(DT_MAPS)), bias_shift=draw(st.sampled_from(BIAS_SHIFTS)))
    if initial:
        specs["initial_state"] = draw(tensors((n_seq, h, p_dim, n_dim), torch.float32,
                                              families=("normal", "constant", "outlier"), scales=(1.0, 0.1, 10.0)))
    else:
        params["initial_state"] = None
    if varlen:
        specs["cu_seqlens"] = chunked_scan.offsets_spec(lengths, draw(st.sampled_from(("int32", "int64"))))
    else:
        params["cu_seqlens"] = None
    return SSDCase(OP, str(dtype).replace("torch.", ""), ARGS, specs, params)


def _state_shape(case: Case) -> tuple[int, ...]:
    """[S, H, P, N]: one state per sequence."""
    b, _, h, p_dim = case.tensors["x"].shape
    n = case.tensors["cu_seqlens"].shape[0] - 1 if "cu_seqlens" in case.tensors else b
    return (n, h, p_dim, case.tensors["B"].shape[-1])


# ------------------------------------------------------------------------- tolerance


def _rule_inputs(inputs64) -> list:
    return [inputs64[a] for a in ARGS]


def ssd_tolerance(case, inputs64, expected, p):
    y, f = rules.ssd_scan(*_rule_inputs(inputs64), expected["y"], expected["final_state"], p)
    return {"y": y, "final_state": f}


def _store(dtype_name: str, p: Precision) -> float:
    dtype = getattr(torch, dtype_name)
    u = unit_roundoff(dtype)
    return 2 * u if dtype == torch.bfloat16 and p.backend == "interpret" else u


def ssd_grad_tolerance(case, inputs64, outputs64, grads64, p):
    stores = {n: _store(case.tensors[n].dtype, p) for n in ("dt", *PER_HEAD) if n in case.tensors}
    return rules.ssd_scan_grad(*_rule_inputs(inputs64), inputs64["dy"], inputs64["dfinal_state"], outputs64,
                               grads64, p, stores=stores)


def _allowed(case: Case, values, impl: Implementation) -> dict[str, np.ndarray]:
    """The rule's allowance for the whole call on ``values`` (from the fp64 reference)."""
    expected, inputs64 = OPS[OP].expected(case, values)
    return ssd_tolerance(case, inputs64, expected, generic.precision(impl, case))


# ------------------------------------------------------------------------- checks


def _values(case: Case) -> tuple[SSDCase, dict]:
    case = SSDCase.of(case)
    return case, case.materialise(backend.device())


def ssd_matches_reference(case: Case, impl: Implementation) -> None:
    """y and the final state match the fp64 recurrence, run on the same rounded inputs,
    within the derived tolerance (properties/ssd_scan_tolerance.py)."""
    generic.matches_reference(SSDCase.of(case), impl)


def _gradients_in_domain(case: Case, inputs64, outputs64, grads64) -> None:
    """The gradients, like the outputs, must be finite in their dtypes: a case whose fp64
    gradients pass the dtype's largest value / 16 is discarded, not compared with an overflow;
    so is one whose gradient of the effective step does (held in fp32 before the clamp's
    chain rule zeroes it: B near fp32's largest value times an upstream gradient of 1e3)."""
    limit = min(float(torch.finfo(getattr(torch, case.dtype)).max), float(torch.finfo(torch.float32).max))
    assume(all(np.all(np.abs(g) <= limit / DOMAIN_DIVISOR) for g in grads64.values() if g is not None))
    step = rules.step_gradient(*_rule_inputs(inputs64), inputs64["dy"], inputs64["dfinal_state"])
    assume(float(step.abs().max()) <= limit / DOMAIN_DIVISOR if step.numel() else True)


def ssd_gradients_match_reference(case: Case, impl: Implementation) -> None:
    """dx, ddt, dA, dB, dC, dD, dz, ddt_bias and d initial_state match fp64 autograd of the
    recurrence on the same rounded inputs and upstream gradients, within the derived tolerance."""
    generic.gradients_match_reference(SSDCase.of(case), impl, in_domain=_gradients_in_domain)


def ssd_inputs_unchanged(case: Case, impl: Implementation) -> None:
    """The call leaves every input's storage bit for bit as it was (the initial state too:
    an in-place state update belongs to a decoding cache, not to this contract)."""
    generic.inputs_unchanged(SSDCase.of(case), impl)


def ssd_calls_independent(case: Case, impl: Implementation) -> None:
    """calls_independent (tritoncheck/generic.py) on inputs mapped into the domain."""
    generic.calls_independent(SSDCase.of(case), impl)


def ssd_deterministic(case: Case, impl: Implementation) -> None:
    """Two calls on the same inputs give bitwise identical outputs and gradients."""
    generic.deterministic(SSDCase.of(case), impl)


def ssd_backward_repeatable(case: Case, impl: Implementation) -> None:
    """A second backward through the same graph gives the first one's gradients bit for bit."""
    generic.backward_repeatable(SSDCase.of(case), impl)


def chunk_size_invariant(case: Case, impl: Implementation) -> None:
    """Every chunk size the implementation declares gives the same y and final state,
    within twice the derived tolerance."""
    case, values = _values(case)
    chunked_scan.chunk_size_invariant(impl, values, case.args, _allowed(case, values, impl))


def split_in_two_carries_state(case: Case, impl: Implementation) -> None:
    """The sequence cut in two, the second call started from the first one's final state,
    gives the one call's y and final state (within twice the derived tolerance)."""
    case, values = _values(case)
    assume(values["x"].shape[1] >= 2)
    cut = cut_position(values["x"].shape[1], case.tensors["x"].seed, CHUNKS)
    chunked_scan.pieces_equal_one_call(impl, values, case.args, LAYOUT, [cut], _allowed(case, values, impl),
                                       "two calls, the state carried")


def token_by_token_equals_chunked(case: Case, impl: Implementation) -> None:
    """Decoding: one call a token, each started from the previous call's final state,
    gives the one (chunked) call's y and final state, within twice the derived tolerance."""
    case, values = _values(case)
    n = values["x"].shape[1]
    chunked_scan.pieces_equal_one_call(impl, values, case.args, LAYOUT, list(range(1, n)),
                                       _allowed(case, values, impl), "one call a token, the state carried")


def packed_equals_separate_calls(case: Case, impl: Implementation) -> None:
    """Packed sequences (cu_seqlens, batch 1, an initial state per sequence) give each
    sequence's call on it alone, within twice the derived tolerance."""
    case, values = _values(case)
    chunked_scan.packed_equal_separate_calls(impl, values, case.args, LAYOUT, _allowed(case, values, impl))


def _closed_form(case: Case, impl: Implementation, values, y, final, what: str) -> None:
    """The implementation on ``values`` against the closed form (y, final) [fp64 tensors],
    within the derived tolerance of that closed form."""
    _, outs = generic.run(case, impl, values)
    _, inputs64 = OPS[OP].expected(case, values)
    allowed = ssd_tolerance(case, inputs64, {"y": y.cpu().numpy(), "final_state": final.cpu().numpy()},
                            generic.precision(impl, case))
    for name, want in (("y", y), ("final_state", final)):
        assert_close(name, outs[name], want.cpu().numpy(), allowed[name], what=what, dtype=outs[name].dtype)


def _gated(values, y: torch.Tensor) -> torch.Tensor:
    D, z = values.get("D"), values.get("z")
    if D is not None:
        y = y + D.detach().to(torch.float64)[:, None] * values["x"].detach().to(torch.float64)
    return y if z is None else y * ref.silu(z.detach().to(torch.float64))


def _initial_read(values, decay: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """y_t = decay_t h_0 C_t (per sequence, decay [batch, T, H]) and the final states
    decay_T h_0 ([S, H, P, N]), fp64, ungated."""
    x, C, h0 = values["x"], values["C"].detach().to(torch.float64), values["initial_state"]
    n_batch, n_tok, H, P = x.shape
    Ch = C[:, :, torch.as_tensor(ref.group_of_heads(H, C.shape[2]), device=C.device)]
    y = torch.zeros(n_batch, n_tok, H, P, dtype=torch.float64, device=x.device)
    h0 = h0.detach().to(torch.float64) if h0 is not None else \
        torch.zeros(len(ref.sequences(n_batch, n_tok, values["cu_seqlens"])), H, P, C.shape[-1],
                    dtype=torch.float64, device=x.device)
    final = h0.clone()
    for n, (b, s, e) in enumerate(ref.sequences(n_batch, n_tok, values["cu_seqlens"])):
        dec = decay[b, s:e]  # [T_n, H]
        y[b, s:e] = dec[..., None] * torch.einsum("thn,hpn->thp", Ch[b, s:e], h0[n])
        final[n] = (dec[-1][:, None, None] if e > s else 1.0) * h0[n]
    return y, final


def zero_input_decays_initial_state(case: Case, impl: Implementation) -> None:
    """x = 0 writes nothing: y_t = exp(G_t) h_0 C_t silu(z_t) and the final state is
    exp(G_T) h_0 (G_t the cumulative d A of the sequence up to t), within the derived
    tolerance of that closed form: the initial state's contribution decays as exp(sum d A)."""
    case, values = _values(case)
    values["x"].zero_()
    d = _step(values)
    A = values["A"].detach().to(torch.float64)
    decay = torch.zeros_like(d)
    for b, s, e in ref.sequences(d.shape[0], d.shape[1], values["cu_seqlens"]):
        decay[b, s:e] = torch.exp(torch.cumsum(d[b, s:e] * A, dim=0))
    y, final = _initial_read(values, decay)
    _closed_form(case, impl, values, _gated(values, y), final, "x = 0: the initial state, decayed")


def zero_step_holds_state(case: Case, impl: Implementation) -> None:
    """dt = 0 and no dt_bias (no softplus, dt_min 0: the step is 0): nothing is written and
    nothing decays, y_t = (h_0 C_t + D x_t) silu(z_t) (y = D x silu(z) without an initial
    state) and the final state is h_0."""
    case, values = _values(case)
    values["dt"].zero_()
    if values.get("dt_bias") is not None:
        values["dt_bias"].zero_()
    y, final = _initial_read(values, torch.ones_like(_step(values)))
    _closed_form(case, impl, values, _gated(values, y), final, "dt = 0: the state held, y = h_0 C + D x")


# ------------------------------------------------------------------------- side checks


def _large(dtype: torch.dtype, device) -> dict:
    """x [rows, 4099, 4, 32] past 2**31 elements (rows = 4098), B, C [rows, 4099, 1, 32],
    dt in (0, 1) through softplus with a bias, A in (-1, 0), D, an initial state per row:
    each row is one sequence of 4099 tokens (65 chunks of 64, the last one token long)."""
    n, h, p_dim, n_dim = 4099, 4, 32, 32
    rows = rows_past_int32(n * h * p_dim)  # when built: PAST_INT32 as it is then

    def normal(*shape):  # seeded by the check (torch.manual_seed)
        return torch.randn(shape, device=device, dtype=torch.float32)
    return {"x": normal(rows, n, h, p_dim).to(dtype), "dt": normal(rows, n, h).to(dtype),
            "A": -torch.rand(h, device=device), "B": normal(rows, n, 1, n_dim).to(dtype),
            "C": normal(rows, n, 1, n_dim).to(dtype), "D": normal(h), "z": None, "dt_bias": normal(h) - 3.0,
            "dt_softplus": True, "initial_state": normal(rows, h, p_dim, n_dim)}


def _valid(dims, device) -> dict:
    b, n, h, d = dims["b"], dims["n"], dims["h"], dims["d"]
    return {"x": randn((b, n, h, d), device), "dt": randn((b, n, h), device), "A": -randn((h,), device).abs(),
            "B": randn((b, n, 1, d + 1), device), "C": randn((b, n, 1, d + 1), device), "D": randn((h,), device),
            "z": randn((b, n, h, d), device), "dt_bias": randn((h,), device), "dt_softplus": True, "dt_min": 0.0,
            "dt_max": math.inf, "initial_state": randn((b, h, d, d + 1), device), "cu_seqlens": None}


def _optional(name: str) -> tuple[Spoiler, ...]:
    """An optional tensor's spoilers: None is valid for it."""
    return tuple(s for s in tensor_spoilers(name, fixed_rank=True) if s.how != "None")


def _shape_spoilers() -> tuple[Spoiler, ...]:
    return (Spoiler("B", "groups not dividing the heads", lambda a: torch.cat([a["B"]] * (a["x"].shape[2] + 1), 2)),
            Spoiler("C", "another state dim than B", lambda a: torch.cat([a["C"], a["C"][..., :1]], -1)),
            Spoiler("dt", "one head more", lambda a: torch.cat([a["dt"], a["dt"][..., :1]], -1)),
            Spoiler("A", "one head more", lambda a: torch.cat([a["A"], a["A"][:1]])),
            Spoiler("z", "float64", lambda a: a["z"].double()),
            Spoiler("B", "float64", lambda a: a["B"].double()))


def _state_spoilers() -> tuple[Spoiler, ...]:
    s = "initial_state"
    return (Spoiler(s, "a list instead of a tensor", lambda a: a[s].tolist()),
            Spoiler(s, "float16", lambda a: a[s].half()),
            Spoiler(s, "one sequence more", lambda a: torch.cat([a[s], a[s][:1]])),
            Spoiler(s, "a state dim more", lambda a: torch.cat([a[s], a[s][..., :1]], dim=-1)),
            Spoiler(s, "on another device", lambda a: torch.empty_like(a[s], device=OTHER_DEVICE)))


def _offset_spoilers() -> tuple[Spoiler, ...]:
    c = "cu_seqlens"

    def ending(a, shift):
        return torch.tensor([0, a["x"].shape[1] + shift], dtype=torch.int32, device=a["x"].device)
    return (Spoiler(c, "ending past T", lambda a: ending(a, 1)),
            Spoiler(c, "float offsets", lambda a: ending(a, 0).float()),
            Spoiler(c, "a list", lambda a: ending(a, 0).tolist()),
            Spoiler(c, "decreasing", lambda a: torch.tensor([0, 2, 1, a["x"].shape[1]], dtype=torch.int64,
                                                            device=a["x"].device)))


register(OpSpec(
    name=OP,
    signature="ssd_scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0, dt_max=inf, "
              "initial_state=None, cu_seqlens=None) -> (y, final_state)",
    meaning="Mamba-2's SSD in mamba_ssm's layout and `mamba_chunk_scan_combined` convention: `x`, `z` "
            "`[B, T, H, P]`, `B`, `C` `[B, T, G, N]` (head h reads group h // (H / G)), `dt [B, T, H]`, `A`, `D`, "
            "`dt_bias` `[H]` (x, z, B, C one dtype; the others any float dtype). The step "
            "`d_t = clamp(softplus?(dt_t + dt_bias), dt_min, dt_max)` (softplus when `dt_softplus`; the clamp "
            "always, as mamba_ssm's `dt_limit=(dt_min, dt_max)`: with the default (0, inf) a negative step is 0); "
            "per head `h_t = exp(d_t A) h_{t-1} + d_t x_t B_t^T` (`[P, N]`), `y_t = (h_t C_t + D x_t) silu(z_t)` "
            "(no `z`: no gate; no `D`: no skip). `initial_state`, `final_state` `[S, H, P, N]` float32 (None: "
            "zeros); S = B, or with `cu_seqlens` (int32/int64 `[S + 1]`, from 0, non-decreasing, ending at T; "
            "B = 1) the S packed sequences, each its own recurrence and initial state (mamba_ssm's `seq_idx`, with "
            "an initial state per sequence). Domain: `A <= 0`, `dt_min >= 0`; D is `[H]` only (mamba_ssm also "
            "takes `[H, P]`). Gradients to x, dt, A, B, C, D, z, dt_bias and initial_state (the clamp's "
            "subgradient 1 on the closed interval).",
    arguments=ARGS,
    outputs=("y", "final_state"),
    scalars=("dt_softplus", "dt_min", "dt_max"),
    dims={"batch": ("x", 0), "T": ("x", 1), "H": ("x", 2), "P": ("x", 3), "G": ("B", 2), "N": ("B", 3)},
    choices={"dt_softplus": SOFTPLUS, "dt_min": DT_MINS, "dt_max": DT_MAXES},
    output_dtypes={"final_state": torch.float32},
    kernel="tritoncheck.kernels.ssd_scan:ssd_scan",
    controls=("tritoncheck.controls.ssd_scan:torch_ssd_scan_recurrent",
              "tritoncheck.controls.ssd_scan:torch_ssd_scan_chunked"),
    baseline=control_baseline("tritoncheck.controls.ssd_scan:torch_ssd_scan_recurrent"),
    # A, D and dt_bias are per head: their gradients sum over every row, run but not compared per slice
    large_problem=LargeProblem(_large, "rows", ("x", "dt", "B", "C", "initial_state"),
                               whole_sum_grads=("A", "D", "dt_bias")),
    bad_input=BadInput(
        _valid,
        tensor_spoilers("x", fixed_rank=True) + tensor_spoilers("dt", fixed_rank=True)
        + tensor_spoilers("A", fixed_rank=True) + tensor_spoilers("B", fixed_rank=True)
        + tensor_spoilers("C", fixed_rank=True) + _optional("D") + _optional("z") + _optional("dt_bias")
        + _shape_spoilers() + _state_spoilers() + _offset_spoilers()
        + scalar_spoilers("dt_min", (-1.0, math.nan, math.inf)) + scalar_spoilers("dt_max", (0.0, -1.0, math.nan))
        + scalar_spoilers("dt_softplus", ("yes", 1))),
    reference=ref.ssd_scan,
    torch_reference=ref.ssd_scan_torch,
    cases=ssd_scan_cases,
    tolerance=ssd_tolerance,
    grad_tolerance=ssd_grad_tolerance,
    grad_inputs=("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state"),
    grad_outputs=("y", "final_state"),
    output_shapes=lambda case: {"y": case.tensors["x"].shape, "final_state": _state_shape(case)},
    # no bf16 tl.dot on the interpreter: bfloat16 runs there only for kernels that upcast first
    backend_limits=(BF16_DOT_ON_INTERPRETER,),
    declarations=(BF16_DOT_UPCAST, CHUNK_SIZES),
    checks=(
        Check("matches_reference", ssd_matches_reference),
        Check("gradients_match_reference", ssd_gradients_match_reference,
              cases=upstream_with(grads=True, max_t=CONFIG.pick(40, 512)), requires=generic._needs_backward),
        Check("inputs_unchanged", ssd_inputs_unchanged),
        Check("calls_independent", ssd_calls_independent),
        Check("deterministic", ssd_deterministic, cases=upstream_with(grads=True, max_t=CONFIG.pick(40, 512))),
        Check("backward_repeatable", ssd_backward_repeatable, cases=upstream_with(grads=True, max_t=CONFIG.pick(40, 512)),
              requires=generic._needs_backward),
        Check("chunk_size_invariant", chunk_size_invariant, requires=declares_chunk_sizes),
        Check("split_in_two_carries_state", split_in_two_carries_state, cases=cases_with(varlen=False, min_t=2),
              needs_arguments=("initial_state",)),
        Check("token_by_token_equals_chunked", token_by_token_equals_chunked,
              cases=cases_with(varlen=False, max_t=CONFIG.pick(12, 128)), needs_arguments=("initial_state",)),
        Check("packed_equals_separate_calls", packed_equals_separate_calls, cases=cases_with(varlen=True),
              needs_arguments=("cu_seqlens", "initial_state")),
        Check("zero_input_decays_initial_state", zero_input_decays_initial_state, cases=cases_with(initial=True),
              needs_arguments=("initial_state",)),
        Check("zero_step_holds_state", zero_step_holds_state, cases=cases_with(zero_step=True)),
    ),
))
