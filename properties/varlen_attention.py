"""varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None,
window=(-1, -1), softcap=0.0) -> (o, lse): strategy, tolerance binding and properties.

What serving sends (the strategy): packed batches of many short sequences and a few long
ones, lengths at and around the edges of the blocks and pages kernels tile with (generic
edges of 16, 32 and 64, not this kernel's block), sequences of zero queries or zero keys,
Nq != Nk per sequence (prefill against a cache: Nk > Nq; decode: Nq = 1), GQA, windows and
softcaps. The offsets are int32 tensors, drawn as TensorSpecs whose every element is an
injection (an integer spec of scale 1 materialises zeros; the injections write the
offsets), so a failing case prints, shrinks and replays them like any tensor.

The domain is the dense op's (``properties/attention.py``), per sequence: q and k capped
by ``qk_cap``, v by ``v_cap`` of the longest sequence's keys (the fp32 accumulator), and the
gradient cases whose backward sums pass max / 8 of the dtype not drawn.

Tolerances: the packed op is B independent dense problems (the contract), so each
sequence's rows get ``rules.attention`` / ``rules.attention_grad`` of that sequence
(imported from properties/attention_tolerance.py, not restated): a row that sees no key,
and a key that no query reads, are exact (allowance 0).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import strategies as st

from tritoncheck import backend
from tritoncheck.backend import BF16_DOT_ON_INTERPRETER
from tritoncheck.bad_input import OTHER_DEVICE, BadInput, Spoiler, randn, scalar_spoilers, tensor_spoilers
from tritoncheck.config import CONFIG
from tritoncheck.declarations import BF16_DOT_UPCAST
from tritoncheck.generic import generic_checks, precision, require_grad_fn, run
from tritoncheck.generic import gradients_match_reference as _generic_gradients_match_reference
from tritoncheck.large_problem import LargeProblem, packed_sequences
from tritoncheck.limits import NO_LIMITS, Limits, OutsideLimits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.properties import attention_tolerance as rules
from tritoncheck.properties.attention import SM_SCALES, SOFTCAPS, WINDOWS, _qkv, qk_cap, v_cap
from tritoncheck.properties.attention_arguments import NO_WINDOW, _backward_sums_in_domain, _fmax, _resolved_scale
from tritoncheck.references import varlen_attention as ref
from tritoncheck.registry import OPS, Check, Implementation, OpSpec, register
from tritoncheck.strategies import Case, TensorSpec, block_edges, layouts, tensors

# Generic tile and page edges (a serving kernel's blocks and KV pages are 16 .. 64 tokens):
# lengths one short of, at and one past them, whatever this kernel tiles with.
EDGES = (16, 32, 64)
SHORT_MAX = 5  # a "short" sequence: decode steps and tiny prompts
HEAD_DIMS = (16, 8, 32, 5, 24, 64)  # small first: the interpreter's cost grows with D
# Work per case under the interpreter: sum over sequences of cdiv(Nq, 16) cdiv(Nk, 16),
# times heads, at about 10 ms per tile (the dense op's _TILE_BUDGET is 36).
_TILE_BUDGET = 24
_TOKENS_SMALL, _TOKENS_LARGE = 80, 4096
EXTRA = ("causal", "sm_scale", "window", "softcap")
ARGS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k") + EXTRA


def offsets_spec(lengths: list[int]) -> TensorSpec:
    """cu_seqlens [B + 1] int32 of ``lengths`` as a TensorSpec: zeros (an integer spec of
    scale 1) with every offset injected."""
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    return TensorSpec((len(cu),), "int32", family="indices", scale=1.0,
                      injections=tuple((i, float(c)) for i, c in enumerate(cu)))


def lengths_of(case: Case, name: str) -> list[int]:
    """The sequence lengths a case's offsets spec holds."""
    cu = case.tensors[name].materialise("cpu").tolist()
    return [b - a for a, b in zip(cu, cu[1:])]


@st.composite
def _length(draw, hi: int, long: bool) -> int:
    """One sequence length: short (0 .. SHORT_MAX, zero included) or, for the few long
    ones, at and around the generic edges, or any length up to ``hi``."""
    if not long or hi <= SHORT_MAX:
        return draw(st.integers(0, min(SHORT_MAX, hi)))
    edges = block_edges(SHORT_MAX + 1, hi, EDGES)
    pools = [st.integers(SHORT_MAX + 1, hi)] + ([st.sampled_from(edges)] if edges else [])
    return draw(st.one_of(*pools))


@st.composite
def _lengths(draw, shape: str | None, zero: bool, max_sequences: int) -> tuple[list[int], list[int]]:
    """(Nq_b, Nk_b) per sequence: many short, a few long, within the work budget.
    ``shape`` "wide" gives some sequence Nk > Nq >= 1; ``zero`` True forces a sequence of
    zero queries and one of zero keys (with queries)."""
    budget = CONFIG.pick(_TILE_BUDGET, 2**20)
    hi = CONFIG.pick(_TOKENS_SMALL, _TOKENS_LARGE) // 2
    count = draw(st.integers(1, max_sequences))
    n_long = draw(st.integers(0, min(2, count)))
    lq, lk = [], []
    for i in range(count):
        long = i < n_long
        n_q = draw(_length(hi, long))
        # keys: as many as queries (self-attention prefill), more (a cached prefix; decode's
        # Nq = 1 against a long cache), or any
        kind = draw(st.sampled_from(("same", "more", "any")))
        n_k = n_q if kind == "same" else (n_q + draw(_length(hi, long)) if kind == "more" else draw(_length(hi, long)))
        lq.append(n_q)
        lk.append(min(n_k, hi))
    if zero:
        lq += [0, draw(st.integers(1, 3))]
        lk += [draw(st.integers(0, 3)), 0]
    if shape == "wide" and not any(k > q >= 1 for q, k in zip(lq, lk)):
        n_q = draw(st.integers(1, 4))
        lq.append(n_q)
        lk.append(n_q + draw(st.integers(1, 20)))
    order = draw(st.permutations(range(len(lq))))
    lq, lk = [lq[i] for i in order], [lk[i] for i in order]
    # over the work budget: the longest sequence is halved until it fits (not drawn again:
    # rejecting would discard most draws with two long sequences)
    while sum(math.ceil(q / 16) * max(1, math.ceil(k / 16)) for q, k in zip(lq, lk)) > budget:
        i = max(range(len(lq)), key=lambda j: lq[j] + lk[j])
        lq[i], lk[i] = lq[i] // 2, lk[i] // 2
    if sum(lq) == 0:  # at least one query row and one key: a call without any is no attention
        lq[0] = 1
    if sum(lk) == 0:
        lk[0] = 1
    return lq, lk


@st.composite
def varlen_attention_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS, causal: bool | None = None,
                           shape: str | None = None, zero: bool = False, gqa: bool | None = None,
                           windows: tuple | None = None, max_sequences: int = 6) -> Case:
    """q [Tq, H, D], k and v [Tk, Hkv, D], offsets [B + 1] (module docstring). ``causal``
    None draws it; ``shape`` "wide" makes some sequence Nk > Nq; ``zero`` adds sequences of
    zero queries and zero keys; ``gqa`` True draws Hkv < H; ``windows`` the bands to draw
    (None: the dense op's WINDOWS)."""
    # --shape-classes: every free variant on or every one off (Limits.variant)
    on = draw(st.booleans()) if CONFIG.shape_classes is not None else True
    causal = draw(limits.variant("causal", (False, True) if causal is None else (causal,), off=False, on=on))
    window = draw(limits.variant("window", WINDOWS if windows is None else windows, off=NO_WINDOW, on=on))
    lq, lk = draw(_lengths(shape, zero, max_sequences))
    d = draw(limits.specialised_pick("varlen_attention", "D", HEAD_DIMS))  # a BLOCK_D class per run with --shape-classes
    h = draw(limits.size("H", 2 if gqa else 1, 4 if gqa or CONFIG.size == "large" else 3))
    divisors = [n for n in range(h, 0, -1) if h % n == 0 and n in limits.sizes.get("Hkv", (n,))
                and n <= limits.max_size.get("Hkv", n) and n >= limits.min_size.get("Hkv", 1)]
    if gqa:
        divisors = [n for n in divisors if n < h]
    if not divisors:
        raise OutsideLimits(f"no KV head count divides H = {h} inside the declared Hkv limits")
    h_kv = draw(st.sampled_from(divisors))
    sm_scale = draw(limits.choice("sm_scale", SM_SCALES))
    softcap = draw(limits.variant("softcap", SOFTCAPS, off=0.0, on=on))
    cap = qk_cap(dtype, d, _resolved_scale(sm_scale, d))
    specs = {"q": draw(_packed((sum(lq), h, d), dtype, cap)),
             "k": draw(_packed((sum(lk), h_kv, d), dtype, cap)),
             "v": draw(_packed((sum(lk), h_kv, d), dtype, v_cap(dtype, max(1, max(lk))))),
             "cu_seqlens_q": offsets_spec(lq), "cu_seqlens_k": offsets_spec(lk)}
    params = {"causal": bool(causal), "sm_scale": sm_scale, "window": tuple(window), "softcap": softcap}
    return Case("varlen_attention", str(dtype).replace("torch.", ""), ARGS, specs, params)


@st.composite
def _packed(draw, shape, dtype, cap) -> TensorSpec:
    """A packed [T, H, D] tensor: the dense op's value families, any layout."""
    spec = draw(_qkv((1, *shape), dtype, cap))  # the dense op's families, specials and caps
    return dataclasses.replace(spec, shape=tuple(shape), layout=draw(layouts(3)))


def _cases(**fixed):
    return lambda op, dtype: op.cases(dtype, **fixed)


def _with_upstream(**fixed):
    """The op's cases with some structure fixed, plus an upstream gradient do."""
    def make(op, dtype):
        def add(case):
            return tensors(case.tensors["q"].shape, dtype, families=("normal", "outlier", "constant"),
                           scales=(1.0, 1e-3, 1e3)).map(lambda do: case.replace(tensors={"do": do}))
        return op.cases(dtype, **fixed).flatmap(add)
    return make


# ------------------------------------------------------------------------- tolerance

def _scale_of(case: Case) -> float:
    return _resolved_scale(case.params["sm_scale"], case.tensors["q"].shape[-1])


def _pieces(case: Case, values):
    """Per sequence that has rows and keys: (query rows, key rows)."""
    return [(r, k) for r, k in ref.sequences(values["cu_seqlens_q"], values["cu_seqlens_k"])
            if r.stop > r.start and k.stop > k.start]


def varlen_attention_tolerance(case, inputs64, expected, p):
    """Each sequence's rows by rules.attention on that sequence (module docstring)."""
    a_o, a_lse = np.zeros_like(expected["o"]), np.zeros_like(expected["lse"])
    q, k, v = inputs64["q"], inputs64["k"], inputs64["v"]
    for rows, keys in _pieces(case, inputs64):
        o_b, lse_b = rules.attention(ref.as_dense(q, rows), ref.as_dense(k, keys), ref.as_dense(v, keys),
                                     ref.as_dense(expected["o"], rows), expected["lse"][None, :, rows],
                                     case.params["causal"], _scale_of(case), p, tuple(case.params["window"]),
                                     softcap=case.params["softcap"])
        a_o[rows] = np.swapaxes(o_b[0], 0, 1)
        a_lse[:, rows] = lse_b[0]
    return {"o": a_o, "lse": a_lse}


def varlen_attention_grad_tolerance(case, inputs64, outputs64, grads64, p):
    """Each sequence's dq, dk, dv by rules.attention_grad on that sequence; the rows of a
    sequence without keys and the keys of one without queries have exact zero gradients."""
    out = {f"d{n}": np.zeros_like(grads64[n]) for n in ("q", "k", "v")}
    q, k, v, do = (inputs64[n] for n in ("q", "k", "v", "do"))
    for rows, keys in _pieces(case, inputs64):
        part = rules.attention_grad(ref.as_dense(q, rows), ref.as_dense(k, keys), ref.as_dense(v, keys),
                                    ref.as_dense(do, rows), ref.as_dense(outputs64["o"], rows),
                                    outputs64["lse"][None, :, rows], ref.as_dense(grads64["q"], rows),
                                    ref.as_dense(grads64["k"], keys), ref.as_dense(grads64["v"], keys),
                                    case.params["causal"], _scale_of(case), p, tuple(case.params["window"]),
                                    softcap=case.params["softcap"])
        out["dq"][rows] = np.swapaxes(part["dq"][0], 0, 1)
        out["dk"][keys] = np.swapaxes(part["dk"][0], 0, 1)
        out["dv"][keys] = np.swapaxes(part["dv"][0], 0, 1)
    return out


def _in_gradient_domain(case: Case, inputs64, outputs64, grads64) -> None:
    """The dense op's gradient domain (_backward_sums_in_domain), sequence by sequence."""
    dev = backend.device()
    as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
    for rows, keys in _pieces(case, inputs64):
        _backward_sums_in_domain(case, *(as_t(ref.as_dense(inputs64[n], keys if n in "kv" else rows))
                                         for n in ("q", "k", "v", "do")),
                                 as_t(ref.as_dense(outputs64["o"], rows)))


def gradients_match_reference(case: Case, impl: Implementation) -> None:
    """Gradients dq, dk, dv match fp64 PyTorch autograd (the dense reference per sequence)
    within each sequence's derived allowance; cases outside the dense op's gradient domain,
    or with an allowance past max / 8, are drawn again (properties/attention.py says why)."""
    _generic_gradients_match_reference(case, impl, in_domain=_in_gradient_domain,
                                       max_allowed=_fmax(getattr(torch, case.dtype)) / 8)


def _allowed(case: Case, impl: Implementation, values) -> tuple[dict, dict]:
    """fp64 reference outputs on ``values`` and their allowances."""
    expected, inputs64 = OPS["varlen_attention"].expected(case, values)
    return expected, varlen_attention_tolerance(case, inputs64, expected, precision(impl, case))


# ------------------------------------------------------------------------ properties

def _fresh(spec: TensorSpec, device) -> torch.Tensor:
    """Other values for a packed tensor: another seed, no injections, the same layout."""
    return dataclasses.replace(spec, seed=(spec.seed + 1) % 2**32, injections=()).materialise(device)


def _relayout(spec: TensorSpec, values: torch.Tensor) -> torch.Tensor:
    return spec.layout.apply(values.contiguous()) if spec.layout is not None else values.clone()


def neighbours_ignored(case: Case, impl: Implementation) -> None:
    """A sequence's rows of o and lse are bitwise unchanged when every other sequence's
    queries, keys and values change (same lengths, same launch): no query reads another
    sequence's keys, and nothing of a neighbour reaches its rows."""
    values, outs = run(case, impl)
    pieces = ref.sequences(values["cu_seqlens_q"], values["cu_seqlens_k"])
    with_rows = [i for i, (r, _) in enumerate(pieces) if r.stop > r.start]  # never empty: Tq >= 1
    b = with_rows[case.tensors["q"].seed % len(with_rows)]
    rows, keys = pieces[b]
    changed = dict(values)
    for name, own in (("q", rows), ("k", keys), ("v", keys)):
        new = _fresh(case.tensors[name], values[name].device).clone()
        new[own] = values[name][own]
        changed[name] = _relayout(case.tensors[name], new)
    _, outs2 = run(case, impl, changed)
    what = f"sequence {b} of {len(pieces)} changed when the other sequences' tokens changed"
    assert_identical("o", outs["o"][rows], outs2["o"][rows], what)
    assert_identical("lse", outs["lse"][:, rows], outs2["lse"][:, rows], what)


def _alone(case: Case, values: dict, rows: slice, keys: slice) -> dict:
    """The call of one sequence alone: its tokens, offsets [0, Nq_b] and [0, Nk_b]."""
    device = values["q"].device
    return {**values, "q": values["q"][rows].contiguous(), "k": values["k"][keys].contiguous(),
            "v": values["v"][keys].contiguous(),
            "cu_seqlens_q": torch.tensor([0, rows.stop - rows.start], dtype=torch.int32, device=device),
            "cu_seqlens_k": torch.tensor([0, keys.stop - keys.start], dtype=torch.int32, device=device)}


def packed_equals_single_calls(case: Case, impl: Implementation) -> None:
    """The packed call equals the dense op on each sequence: the implementation called on
    each sequence alone (a batch of one) gives that sequence's rows, within both calls'
    allowances (each is within its allowance of the same exact value; not bitwise: a
    kernel may tile a batch of one otherwise)."""
    values, outs = run(case, impl)
    _, allowed = _allowed(case, impl, values)
    dtype = getattr(torch, case.dtype)
    for b, (rows, keys) in enumerate(ref.sequences(values["cu_seqlens_q"], values["cu_seqlens_k"])):
        if rows.stop == rows.start:
            continue
        alone = _alone(case, values, rows, keys)
        _, single = run(case, impl, alone)
        what = f"sequence {b} called alone != its rows of the packed call"
        a_o, a_lse = allowed["o"][rows], allowed["lse"][:, rows]
        assert_close("o", outs["o"][rows], to_numpy(single["o"]), 2 * a_o, dtype=dtype, record=False, what=what)
        assert_close("lse", outs["lse"][:, rows], to_numpy(single["lse"]), 2 * a_lse, dtype=torch.float32,
                     record=False, what=what)


def zero_length_sequences(case: Case, impl: Implementation) -> None:
    """Sequences of zero keys and of zero queries: a row of a sequence without keys is
    exactly o = 0, lse = -inf with dq = 0, and the keys of a sequence without queries get
    dk = dv = 0 exactly (for an implementation with a backward); the other sequences' rows
    are checked by matches_reference."""
    values = case.materialise(backend.device())
    grads = getattr(impl, "supports_backward", True)
    for name in ("q", "k", "v"):
        values[name] = values[name].detach().requires_grad_(grads)
    _, outs = run(case, impl, values)
    o, lse = outs["o"].detach(), outs["lse"].detach()
    pieces = ref.sequences(values["cu_seqlens_q"], values["cu_seqlens_k"])
    keyless = [rows for rows, keys in pieces if keys.stop == keys.start and rows.stop > rows.start]
    queryless = [keys for rows, keys in pieces if rows.stop == rows.start and keys.stop > keys.start]
    for rows in keyless:
        assert_identical("o", torch.zeros_like(o[rows]), o[rows], f"rows {rows.start}..{rows.stop - 1} of a "
                         "sequence without keys are not o = 0")
        assert_identical("lse", torch.full_like(lse[:, rows], float("-inf")), lse[:, rows],
                         f"rows {rows.start}..{rows.stop - 1} of a sequence without keys are not lse = -inf")
    if not grads:
        return
    require_grad_fn(OPS["varlen_attention"], impl, outs)
    do = case.tensors["do"].materialise(o.device) if "do" in case.tensors else torch.ones_like(o)
    dq, dk, dv = torch.autograd.grad(outs["o"], (values["q"], values["k"], values["v"]), do)
    for rows in keyless:
        assert_identical("dq", torch.zeros_like(dq[rows]), dq[rows], "dq of a sequence without keys is not zero")
    for keys in queryless:
        for name, g in (("dk", dk), ("dv", dv)):
            assert_identical(name, torch.zeros_like(g[keys]), g[keys], f"{name} of a sequence without queries "
                             "is not zero")


def _front_padded(values: dict, extra: list[int]) -> dict:
    """``values`` with ``extra[b]`` query rows of zeros put before each sequence b's queries
    (their values do not matter: causal rows do not read other query rows)."""
    q = values["q"]
    parts, offsets = [], [0]
    for b, (rows, _) in enumerate(ref.sequences(values["cu_seqlens_q"], values["cu_seqlens_k"])):
        parts += [q.new_zeros((extra[b], *q.shape[1:])), q[rows]]
        offsets.append(offsets[-1] + extra[b] + rows.stop - rows.start)
    return {**values, "q": torch.cat(parts).contiguous(),
            "cu_seqlens_q": torch.tensor(offsets, dtype=torch.int32, device=q.device)}


def bottom_right_causal_is_last_rows(case: Case, impl: Implementation) -> None:
    """Causal masks align to each sequence's own bottom right: with Nk_b - Nq_b query rows
    put before each sequence's queries (so that every sequence is square), the original
    rows' o and lse equal the square call's last rows, within both calls' allowances."""
    values, outs = run(case, impl)
    pieces = ref.sequences(values["cu_seqlens_q"], values["cu_seqlens_k"])
    extra = [max(0, (k.stop - k.start) - (r.stop - r.start)) for r, k in pieces]
    square = _front_padded(values, extra)
    _, outs2 = run(case, impl, square)
    _, allowed = _allowed(case, impl, values)
    dtype = getattr(torch, case.dtype)
    start2 = 0
    for b, (rows, _) in enumerate(pieces):
        n = rows.stop - rows.start
        last = slice(start2 + extra[b], start2 + extra[b] + n)
        start2 = last.stop
        if n == 0:
            continue
        what = f"sequence {b} (Nq {n}, {extra[b]} fewer than its keys): causal rows != the square call's last rows"
        assert_close("o", outs["o"][rows], to_numpy(outs2["o"][last]), 2 * allowed["o"][rows], dtype=dtype,
                     record=False, what=what)
        assert_close("lse", outs["lse"][:, rows], to_numpy(outs2["lse"][:, last]), 2 * allowed["lse"][:, rows],
                     dtype=torch.float32, record=False, what=what)


# ------------------------------------------------------------------ the record's side pieces

def _baseline(case, values, outs):
    """The dense plain-PyTorch attention (tritoncheck.controls.attention.naive_torch) per
    sequence, in the input dtype."""
    from tritoncheck.controls.varlen_attention import naive_torch_per_sequence
    args = [values[a] for a in case.args]
    o, lse = naive_torch_per_sequence(*args)
    return o, lse


def _valid_call(dims, device):
    b, h, n, m, d = (dims[k] for k in ("b", "h", "n", "m", "d"))
    lq = [n - (i % 2) for i in range(b)]  # Nq != Nk, and two lengths per batch
    lk = [m + i for i in range(b)]
    return {"q": randn((sum(lq), h, d), device), "k": randn((sum(lk), h, d), device),
            "v": randn((sum(lk), h, d), device),
            "cu_seqlens_q": torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32, device=device),
            "cu_seqlens_k": torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32, device=device),
            "causal": True, "sm_scale": None, "window": (-1, -1), "softcap": 0.0}


def _shifted_end(cu: torch.Tensor, by: int) -> torch.Tensor:
    out = cu.clone()
    out[-1] += by
    return out


def _not_monotone(cu: torch.Tensor) -> torch.Tensor:
    """Offsets that decrease once: the first inner offset one past the packed total (one
    inserted when there is none), the end kept."""
    if cu.numel() == 2:
        return torch.cat([cu[:1], cu[-1:] + 1, cu[-1:]])
    out = cu.clone()
    out[1] = cu[-1] + 1
    return out


_OFFSET_SPOILERS = tuple(
    s for name in ("cu_seqlens_q", "cu_seqlens_k") for s in (
        tensor_spoilers(name, fixed_rank=True, integer=True)
        + (Spoiler(name, "not monotone", lambda a, name=name: _not_monotone(a[name])),
           Spoiler(name, "ending past the packed token count", lambda a, name=name: _shifted_end(a[name], 1)),
           Spoiler(name, "ending before the packed token count", lambda a, name=name: _shifted_end(a[name], -1)),
           Spoiler(name, "starting at 1", lambda a, name=name: a[name] + 1),
           Spoiler(name, "float16", lambda a, name=name: a[name].half()),
           Spoiler(name, "a single offset (no sequence)", lambda a, name=name: a[name][:1]))))

_SPOILERS = (
    tensor_spoilers("q", fixed_rank=True) + tensor_spoilers("k", fixed_rank=True) + tensor_spoilers("v", fixed_rank=True)
    + (Spoiler("k", "a head dim other than q's", lambda a: torch.cat([a["k"], a["k"][..., :1]], dim=-1)),
       Spoiler("v", "one token more than k", lambda a: torch.cat([a["v"], a["v"][:1]])),
       Spoiler("v", "float16 while q is float32", lambda a: a["v"].half()),
       Spoiler("k", "a head count that does not divide q's", lambda a: torch.cat([a["k"], a["k"][:, :1]], dim=1)),
       Spoiler("cu_seqlens_k", "one sequence more than cu_seqlens_q",
               lambda a: torch.cat([a["cu_seqlens_k"], a["cu_seqlens_k"][-1:]])),
       Spoiler("cu_seqlens_q", "on another device",
               lambda a: torch.empty_like(a["cu_seqlens_q"], device=OTHER_DEVICE)))
    + _OFFSET_SPOILERS
    + scalar_spoilers("sm_scale", (0.0, -0.5, math.nan, math.inf, "auto"))
    + scalar_spoilers("causal", ("yes", 1))
    + scalar_spoilers("window", (4, (2.0, 0), (-2, 0), (1, 2, 3)))
    + scalar_spoilers("softcap", (-1.0, math.nan, math.inf, "30")))


def _output_shapes(case: Case) -> dict:
    t, h, d = case.tensors["q"].shape
    return {"o": (t, h, d), "lse": (h, t)}


_checks = tuple(dataclasses.replace(c, run=gradients_match_reference) if c.name == "gradients_match_reference"
                else c for c in generic_checks(grad=True))

register(OpSpec(
    name="varlen_attention",
    backend_limits=(BF16_DOT_ON_INTERPRETER,),
    declarations=(BF16_DOT_UPCAST,),
    signature="varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None, "
              "window=(-1, -1), softcap=0.0) -> (o, lse)",
    meaning="packed variable-length attention: `q [Tq, H, D]`, `k`, `v` `[Tk, Hkv, D]` hold the tokens of B "
            "sequences one after another; `cu_seqlens_q`, `cu_seqlens_k` (int32 or int64 `[B + 1]`, from 0, "
            "non-decreasing, ending at Tq and Tk) delimit them. Each sequence is `attention` on its own tokens "
            "(GQA, masks aligned to its own bottom right `Nk_b - Nq_b`, windows, softcap as there); "
            "`o [Tq, H, D]`, `lse [H, Tq]` float32. A sequence may have zero queries or zero keys; a row that "
            "sees no key returns `o = 0`, `lse = -inf` and zero gradients, a key no query reads gets zero "
            "gradients.",
    scalars=EXTRA,
    dims={"H": ("q", 1), "Hkv": ("k", 1), "D": ("q", 2)},
    choices={"causal": (False, True), "sm_scale": SM_SCALES, "window": WINDOWS, "softcap": SOFTCAPS},
    arguments=ARGS,
    outputs=("o", "lse"),
    kernel="tritoncheck.kernels.varlen_attention:varlen_attention",
    controls=("tritoncheck.controls.varlen_attention:naive_torch_per_sequence",),
    baseline=_baseline,
    large_problem=LargeProblem(packed_sequences(2048, 128), "sequences", ("q", "k", "v"),
                               offsets={"q": "cu_seqlens_q", "k": "cu_seqlens_k", "v": "cu_seqlens_k"}),
    bad_input=BadInput(_valid_call, _SPOILERS),
    reference=ref.varlen_attention,
    torch_reference=ref.varlen_attention_torch,
    cases=varlen_attention_cases,
    tolerance=varlen_attention_tolerance,
    grad_tolerance=varlen_attention_grad_tolerance,
    grad_inputs=("q", "k", "v"),
    grad_outputs=("o",),
    output_shapes=_output_shapes,
    output_dtypes={"lse": torch.float32},
    checks=_checks + (
        Check("neighbours_ignored", neighbours_ignored, cases=_cases(max_sequences=4)),
        Check("packed_equals_single_calls", packed_equals_single_calls, cases=_cases(max_sequences=3)),
        Check("zero_length_sequences", zero_length_sequences, cases=_with_upstream(zero=True, max_sequences=3)),
        Check("bottom_right_causal_is_last_rows", bottom_right_causal_is_last_rows,
              cases=_cases(causal=True, shape="wide", windows=(NO_WINDOW,), max_sequences=3)),
    ),
))
