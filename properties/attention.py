"""attention(q, k, v, causal=False, sm_scale=None) -> (o, lse): strategy, tolerance
binding and properties.

The domain (what the contract can mean for finite inputs of the dtype):

* every score must be finite where a plain PyTorch user forms it: ``q @ k^T`` and
  ``(q @ k^T) * sm_scale`` in the input dtype, and ``s * log2(e)`` in fp32 inside an
  exp2-based kernel. The strategy caps every element of q and k at
  ``sqrt(max / (8 D max(1, sm_scale)))`` (``max`` = the dtype's largest finite value),
  so ``|s| <= max / 8``: the ``near_max`` family then drives the scores to an eighth
  of the dtype's range (fp16: |s| up to 8e3; fp32 and bf16: 4e37).
* the unnormalised FlashAttention accumulator ``sum_j exp(s_j - m) v_j`` can reach
  ``Nk max|v|``; it is fp32, so |v| is capped at ``max(fp32) / (4 Nk)`` (and the
  dtype's max).
* gradients: cases whose exact dq, dk, dv, dP = dO V^T or dS = P (dP - delta) exceed
  ``max / 8`` of the dtype are outside the domain (the input dtype cannot hold the
  gradient, and FlashAttention kernels round dS to the input dtype); they are not
  drawn (``assume``).
* -inf, inf and NaN inputs are not in the contract (it defines no masking by -inf
  inputs), so they are not injected; 0, -0, 1, the cap, and tiny and subnormal values
  are.

Tolerances: ``rules.attention`` and ``rules.attention_grad`` (derivations there).
The lse rule admits scores rounded to the input dtype: plain PyTorch attention in fp16
or bf16 forms ``q @ k^T * sm_scale`` in that dtype, and its logsumexp inherits the
rounding (controls.attention.naive_torch's fp16 lse is 0.017 off for scores around 50,
87 times an fp32-score bound); the kernel, with fp32 scores, uses 4% of it in fp16.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from properties import attention_tolerance as rules
from properties import backend, tolerance
from properties.config import CONFIG
from properties.generic import generic_checks, precision, require_grad_fn, run, with_upstream
from properties.generic import gradients_match_reference as _generic_gradients_match_reference
from properties.limits import NO_LIMITS, Limits
from properties.oracle import assert_close, assert_identical, to_numpy
from properties.registry import OPS, Check, Implementation, OpSpec, register
from properties.strategies import Case, Layout, TensorSpec, layouts, special_values, tensors
from references import attention as ref

# The interpreter's blocks (16 x 16) and the GPU's (32 and 64): sizes around them.
BLOCKS = (16, 32, 64)
# Small profile: 16 and 32 first (cheapest under the interpreter), odd head dims the
# kernel pads with masks (24, 80, 5), and the other compiled buckets.
HEAD_DIMS_SMALL = (16, 32, 16, 32, 24, 64, 80, 128, 5)
HEAD_DIMS_LARGE = (64, 128, 16, 32, 24, 80, 5, 1)
SM_SCALES = (None, 0.5, 2.0, 1e-3)
QKV_FAMILIES = ("normal", "near_max", "tiny", "constant", "outlier", "offset")
_BNHD = Layout(order=(0, 2, 1, 3))  # [B, N, H, D] storage seen as [B, H, N, D]
_CONTIGUOUS = Layout(order=(0, 1, 2, 3))
# Work limits per case: under the interpreter the cost is about 10 ms per
# (batch*head, query block, key block) triple; on the GPU the limit is the fp64 NumPy
# reference and tolerance (a few [B, H, Nq, Nk] float64 arrays).
_TILE_BUDGET = 36  # small: B*H * cdiv(Nq, 16) * cdiv(Nk, 16)
_SCORE_BUDGET = 2**21  # large: B*H * Nq * Nk


def _fmax(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def _resolved_scale(sm_scale, d: int) -> float:
    return 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)


def qk_cap(dtype: torch.dtype, d: int, scale: float) -> float:
    """Largest |q| and |k| element of the domain: |q . k| * max(1, scale) <= max / 8."""
    return math.sqrt(_fmax(dtype) / (8 * d * max(1.0, scale)))


def v_cap(dtype: torch.dtype, n_k: int) -> float:
    """Largest |v| element of the domain: the fp32 accumulator of Nk terms stays finite."""
    return min(_fmax(dtype), _fmax(torch.float32) / (4 * n_k))


@st.composite
def _qkv(draw, shape, dtype, cap) -> TensorSpec:
    spec = draw(tensors(shape, dtype, families=QKV_FAMILIES, max_magnitude=cap,
                        specials=special_values(dtype, max_magnitude=cap), layout=False))
    lay = draw(st.one_of(st.just(_CONTIGUOUS), st.just(_BNHD), layouts(4)))
    return dataclasses.replace(spec, layout=lay)


@st.composite
def _late_max(draw, k: TensorSpec, cap: float) -> TensorSpec:
    """An increasing ramp of key norms at the end of each row: keys in the last block
    get one coordinate set to 2, 4, 8, 16 times k's scale (same sign), so the running
    max of the rows whose query has that sign changes late, possibly several times."""
    b, h, n_k, d = k.shape
    count = draw(st.integers(1, 4))
    coord = draw(st.integers(0, d - 1))
    sign = draw(st.sampled_from((1.0, -1.0)))
    step = max(1, min(5, (n_k - 1) // count))
    base = k.scale if k.family not in ("near_max", "tiny") else 1.0
    extra = []
    for slab in range(b * h):
        for t in range(count):
            j = n_k - 1 - (count - 1 - t) * step
            value = sign * min(base * 2.0 ** (t + 1), cap)
            extra.append(((slab * n_k + j) * d + coord, value))
    return dataclasses.replace(k, injections=k.injections + tuple(extra))


@st.composite
def attention_cases(draw, dtype: torch.dtype, causal: bool | None = None, min_n: int = 1,
                    min_bh: int = 1, limits: Limits = NO_LIMITS) -> Case:
    """q [B, H, Nq, D], k and v [B, H, Nk, D]; causal forces Nq == Nk.

    ``causal`` None draws it; ``min_n`` and ``min_bh`` are for properties that need
    two keys (or rows) or two (batch, head) slices."""
    causal = draw(limits.choice("causal", (False, True) if causal is None else (causal,)))
    n_max = CONFIG.pick(70, 2048)
    n_q = draw((limits.joined("Nq", "Nk") if causal else limits).size("Nq", min_n, n_max, blocks=BLOCKS))
    n_k = n_q if causal else draw(limits.size("Nk", min_n, n_max, blocks=BLOCKS))
    d = draw(limits.specialised_pick("attention", dtype, "D", CONFIG.pick(HEAD_DIMS_SMALL, HEAD_DIMS_LARGE)))
    work = CONFIG.pick(math.ceil(n_q / 16) * math.ceil(n_k / 16), n_q * n_k)
    max_bh = max(min_bh, CONFIG.pick(_TILE_BUDGET, _SCORE_BUDGET) // work)
    b = draw(limits.specialised("attention", dtype, "B", 1, min(3, max_bh), span=(1, 3)))
    h_lo = max(1, math.ceil(min_bh / b))
    h = draw(limits.specialised("attention", dtype, "H", h_lo, max(min(3, max_bh // b), h_lo), span=(1, 3)))
    sm_scale = draw(limits.choice("sm_scale", SM_SCALES))
    scale = _resolved_scale(sm_scale, d)
    cap = qk_cap(dtype, d, scale)
    q = draw(_qkv((b, h, n_q, d), dtype, cap))
    k = draw(_qkv((b, h, n_k, d), dtype, cap))
    if n_k > 16 and draw(st.booleans()):
        k = draw(_late_max(k, cap))
    v = draw(_qkv((b, h, n_k, d), dtype, v_cap(dtype, n_k)))
    return Case("attention", str(dtype).replace("torch.", ""), ("q", "k", "v", "causal", "sm_scale"),
                {"q": q, "k": k, "v": v}, {"causal": bool(causal), "sm_scale": sm_scale})


def _cases(**fixed):
    """A ``Check.cases`` function drawing attention cases with some structure fixed."""
    return lambda op, dtype: op.cases(dtype, **fixed)


def _upstream(**fixed):
    """``with_upstream`` on attention cases with some structure fixed."""
    def make(op, dtype):
        return with_upstream(dataclasses.replace(op, cases=lambda dt: op.cases(dt, **fixed)), dtype)
    return make


# ------------------------------------------------------------------------- tolerance

def _scale_of(case: Case) -> float:
    return _resolved_scale(case.params["sm_scale"], case.tensors["q"].shape[-1])


def attention_tolerance(case, inputs64, expected, p):
    o, lse = rules.attention(inputs64["q"], inputs64["k"], inputs64["v"], expected["o"],
                                 expected["lse"], case.params["causal"], _scale_of(case), p)
    return {"o": o, "lse": lse}


def attention_grad_tolerance(case, inputs64, outputs64, grads64, p):
    return rules.attention_grad(inputs64["q"], inputs64["k"], inputs64["v"], inputs64["do"],
                                    outputs64["o"], outputs64["lse"], grads64["q"], grads64["k"],
                                    grads64["v"], case.params["causal"], _scale_of(case), p)


def _allowed(case: Case, impl: Implementation, values) -> tuple[dict, np.ndarray, np.ndarray]:
    """fp64 reference outputs on ``values`` and their allowed errors (o, lse)."""
    q, k, v = (to_numpy(values[n]) for n in ("q", "k", "v"))
    causal, scale = case.params["causal"], _scale_of(case)
    o, lse = ref.attention(q, k, v, causal, case.params["sm_scale"])
    a_o, a_lse = rules.attention(q, k, v, o, lse, causal, scale, precision(impl, case))
    return {"o": o, "lse": lse}, a_o, a_lse


# ------------------------------------------------------------------------ properties

def _backward_sums_in_domain(case: Case, q, k, v, do, o) -> None:
    """Reject (``assume``) a case whose backward sums pass through magnitudes beyond
    max / 8 of the dtype (|dO| |V|^T, max(1, scale) |dS| |K|, max(1, scale) |dS|^T |Q|,
    P^T |dO|, in fp32 or the input dtype): the gradient, or a partial sum of it, cannot
    be held. Arguments are fp64 torch tensors; ``o`` is the fp64 reference output."""
    scale = _scale_of(case)
    s = (q @ k.transpose(-1, -2)) * scale
    if case.params["causal"]:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    pr = torch.softmax(s, dim=-1)
    dp = do @ v.transpose(-1, -2)
    ds = (pr * (dp - (do * o).sum(-1, keepdim=True))).abs()
    big_scale = max(1.0, scale)  # the kernel multiplies by the scale after the sum
    sums = (do.abs() @ v.abs().transpose(-1, -2), big_scale * (ds @ k.abs()),
            big_scale * (ds.transpose(-1, -2) @ q.abs()), pr.transpose(-1, -2) @ do.abs())
    big = max(float(t.max()) for t in sums)
    assume(math.isfinite(big) and big <= _fmax(getattr(torch, case.dtype)) / 8)


def _gradient_domain(case: Case, values) -> None:
    """:func:`_backward_sums_in_domain` on materialised ``values`` (q, k, v, do)."""
    q, k, v, do = (values[n].detach().to("cpu", torch.float64) for n in ("q", "k", "v", "do"))
    o, _ = ref.attention_torch(q, k, v, case.params["causal"], case.params["sm_scale"])
    _backward_sums_in_domain(case, q, k, v, do, o)


def _in_gradient_domain(case: Case, inputs64, outputs64, grads64) -> None:
    """:func:`_backward_sums_in_domain` for the generic gradient check (NumPy arrays)."""
    q, k, v, do = (torch.from_numpy(inputs64[n]) for n in ("q", "k", "v", "do"))
    _backward_sums_in_domain(case, q, k, v, do, torch.from_numpy(outputs64["o"]))


def gradients_match_reference(case: Case, impl: Implementation) -> None:
    """Gradients dq, dk, dv match fp64 PyTorch autograd (references.attention.attention_torch)
    on the same rounded inputs and upstream gradient, within the derived tolerance; cases
    outside the gradient domain are not drawn: backward sums beyond max / 8 of the dtype
    (:func:`_backward_sums_in_domain`), or a derived allowance beyond max / 8. Past that
    the rule admits any value, and a legitimate rounding error can overflow (e.g. dS_ij,
    exactly 0, computed as a rounding error of 1e28 times a key element of 1e18)."""
    fmax = _fmax(getattr(torch, case.dtype))
    _generic_gradients_match_reference(case, impl, in_domain=_in_gradient_domain, max_allowed=fmax / 8)


def _row_of(case: Case, n: int) -> int:
    """The query row a causal property looks at: in [0, n - 2], from k's seed."""
    return case.tensors["k"].seed % max(n - 1, 1)


def _fresh(spec: TensorSpec, device) -> torch.Tensor:
    """Other values for a tensor: the same spec with another seed and no injections,
    in the same layout."""
    return dataclasses.replace(spec, seed=(spec.seed + 1) % 2**32, injections=()).materialise(device)


def _relayout(spec: TensorSpec, values: torch.Tensor) -> torch.Tensor:
    """``values`` (any layout) in ``spec``'s layout."""
    return (spec.layout or _CONTIGUOUS).apply(values.contiguous())


def causal_mask_respected(case: Case, impl: Implementation) -> None:
    """Causal: giving keys and values j > i fresh values leaves rows 0..i of o and lse
    bitwise unchanged (a query never sees a future key)."""
    values, outs = run(case, impl)
    n = values["q"].shape[-2]
    i = _row_of(case, n)
    changed = dict(values)
    for name in ("k", "v"):
        new = values[name].detach().clone()
        new[..., i + 1:, :] = _fresh(case.tensors[name], new.device)[..., i + 1:, :]
        changed[name] = _relayout(case.tensors[name], new)
    _, outs2 = run(case, impl, changed)
    what = f"changing keys/values j > {i} changed causal output rows <= {i}"
    assert_identical("o", outs["o"][..., :i + 1, :], outs2["o"][..., :i + 1, :], what)
    assert_identical("lse", outs["lse"][..., :i + 1], outs2["lse"][..., :i + 1], what)


def causal_gradient_respected(case: Case, impl: Implementation) -> None:
    """Causal: with the upstream gradient zero except on row i of o, the gradients of
    keys and values j > i are exactly zero, and so is dq outside row i."""
    values = case.materialise(backend.device())
    n = values["q"].shape[-2]
    i = _row_of(case, n)
    do = values["do"].detach().clone()
    keep = torch.zeros_like(do)
    keep[..., i, :] = do[..., i, :]
    _gradient_domain(case, {**values, "do": keep})
    for name in ("q", "k", "v"):
        values[name] = values[name].detach().requires_grad_(True)
    _, outs = run(case, impl, values)
    require_grad_fn(OPS["attention"], impl, outs)
    dq, dk, dv = torch.autograd.grad(outs["o"], (values["q"], values["k"], values["v"]), keep)
    what = f"with the upstream gradient only on row {i}"
    for name, g, rows in (("dk", dk, slice(i + 1, None)), ("dv", dv, slice(i + 1, None))):
        part = g[..., rows, :]
        assert_identical(name, torch.zeros_like(part), part, f"{what}, {name} of keys j > {i} is not zero")
    others = torch.ones(n, dtype=torch.bool, device=dq.device)
    others[i] = False
    part = dq[..., others, :]
    assert_identical("dq", torch.zeros_like(part), part, f"{what}, dq of the other rows is not zero")


@st.composite
def _key_blocks(draw, op: OpSpec, dtype: torch.dtype, causal: bool | None = None) -> Case:
    """Attention cases with >= 2 keys and 1-2 cut points splitting the keys into blocks
    (``params["key_cuts"]``, not an argument of the op)."""
    case = draw(op.cases(dtype, causal=causal, min_n=2))  # op.cases: inside the declared limits
    n_k = case.tensors["k"].shape[-2]
    # one or two cuts: two to three blocks (each block is one more kernel call, two when causal)
    cuts = draw(st.lists(st.integers(1, n_k - 1), min_size=1, max_size=2, unique=True))
    return dataclasses.replace(case, params={**case.params, "key_cuts": tuple(sorted(cuts))})


def _key_block_cases(causal: bool | None = None):
    return lambda op, dtype: _key_blocks(op, dtype, causal)


def _sliced(values: dict, name: str, rows: slice) -> torch.Tensor:
    return values[name][..., rows, :].contiguous()


def _block_call(case: Case, impl: Implementation, values: dict, q_rows: slice, keys: slice, causal: bool):
    """impl on q[q_rows] against keys and values[keys]: o, lse and their allowances
    (the derived rule for that call), fp64 NumPy."""
    part = {**values, "causal": causal, "q": _sliced(values, "q", q_rows),
            "k": _sliced(values, "k", keys), "v": _sliced(values, "v", keys)}
    _, outs = run(case, impl, part)
    q, k, v = (to_numpy(part[n]) for n in ("q", "k", "v"))
    o, lse = ref.attention(q, k, v, causal, case.params["sm_scale"])
    a_o, a_lse = rules.attention(q, k, v, o, lse, causal, _scale_of(case), precision(impl, case))
    return to_numpy(outs["o"]), to_numpy(outs["lse"]), a_o, a_lse


def _key_block_parts(case: Case, impl: Implementation, values: dict) -> list[tuple]:
    """For each block of keys [a, b) (cut at ``key_cuts``), every query row's (o_j, lse_j,
    allowance of o_j, allowance of lse_j) over that block alone, as the implementation
    computes it. Causal (Nq == Nk): rows a..b-1 see a causal diagonal block (a causal
    call on q, k, v[a:b]), rows >= b all of it (a non-causal call), rows < a none of it
    (lse_j = -inf, weight 0): the block decomposition a causal FlashAttention runs."""
    n_q, n_k = values["q"].shape[-2], values["k"].shape[-2]
    causal = case.params["causal"]
    edges = (0,) + tuple(case.params["key_cuts"]) + (n_k,)
    lead = values["q"].shape[:-2]
    parts = []
    for a, b in zip(edges[:-1], edges[1:]):
        o = np.zeros(lead + (n_q, values["v"].shape[-1]))
        lse = np.full(lead + (n_q,), -np.inf)
        a_o, a_lse = np.zeros_like(o), np.zeros_like(lse)
        calls = [(slice(a, b), True), (slice(b, n_q), False)] if causal else [(slice(0, n_q), False)]
        for rows, block_causal in calls:
            if rows.stop > rows.start:
                o[..., rows, :], lse[..., rows], a_o[..., rows, :], a_lse[..., rows] = _block_call(
                    case, impl, values, rows, slice(a, b), block_causal)
        parts.append((o, lse, a_o, a_lse))
    return parts


def _online_merge(lses: list[np.ndarray]) -> np.ndarray:
    """The online logsumexp recurrence over blocks, in fp64: m <- max(m, lse_j),
    s <- s e^{m_old - m} + e^{lse_j - m}; lse = m + log s. A block a row does not see
    (lse_j = -inf) adds nothing."""
    m = np.full(lses[0].shape, -np.inf)
    s = np.zeros(lses[0].shape)
    with np.errstate(invalid="ignore"):
        for lse_j in lses:
            m_new = np.maximum(m, lse_j)
            ref_m = np.where(np.isneginf(m_new), 0.0, m_new)
            s = s * np.exp(m - ref_m) + np.exp(lse_j - ref_m)
            m = m_new
        return m + np.log(s)


def online_lse_matches_full(case: Case, impl: Implementation) -> None:
    """The lse over all keys equals the online merge (the logsumexp recurrence, in fp64)
    of the implementation's own lse over blocks of the keys (drawn cut points; causal
    rows see causal diagonal blocks and whole earlier blocks). Allowance: the full call's
    derived lse allowance, plus each block's carried through the merge (d lse / d lse_j
    = w_j = e^{lse_j - lse}), plus the fp64 merge's rounding."""
    values, outs = run(case, impl)
    if outs["lse"].dtype != torch.float32:
        raise AssertionError(f"lse has dtype {outs['lse'].dtype}, the contract says float32")
    parts = _key_block_parts(case, impl, values)
    merged = _online_merge([lse_j for _, lse_j, _, _ in parts])
    with np.errstate(invalid="ignore", over="ignore"):
        carried = sum(np.where(np.isneginf(lse_j), 0.0, np.exp(lse_j - merged)) * a_j for _, lse_j, _, a_j in parts)
        merge_rounding = 4 * len(parts) * tolerance.unit_roundoff(torch.float64) * np.abs(merged)
    _, _, a_lse = _allowed(case, impl, values)
    cuts = list(case.params["key_cuts"])
    assert_close("lse", outs["lse"], merged, a_lse + carried + merge_rounding, dtype=torch.float32, record=False,
                 what=f"lse over all keys != online merge of the lse over key blocks cut at {cuts}")


def split_kv_merge(case: Case, impl: Implementation) -> None:
    """Non-causal: o over all keys equals the merge of o over blocks of the keys (drawn
    cut points), each weighted by its share of the normaliser, w_j = e^{lse_j - lse},
    lse = logsumexp_j lse_j (flash-decoding's split-KV reduction, in fp64 from the
    implementation's own block results). The blocks are contiguous copies (the property
    is about the math, not about views). Allowance: the full call's derived o allowance,
    each block's o allowance times w_j, and the weights' movement by the blocks' lse
    errors, d w_j = w_j (d lse_j - d lse), times |o_j - o|."""
    values, outs = run(case, impl)
    parts = _key_block_parts(case, impl, values)
    lse = _online_merge([lse_j for _, lse_j, _, _ in parts])
    weights = [np.exp(lse_j - lse)[..., None] for _, lse_j, _, _ in parts]
    merged = sum(w * o_j for w, (o_j, _, _, _) in zip(weights, parts))
    lse_err = sum(w * a_lse_j[..., None] for w, (_, _, _, a_lse_j) in zip(weights, parts))
    carried = sum(w * (a_o_j + np.abs(o_j - merged) * (a_lse_j[..., None] + lse_err))
                  for w, (o_j, _, a_o_j, a_lse_j) in zip(weights, parts))
    _, a_o, _ = _allowed(case, impl, values)
    assert_close("o", outs["o"], merged, a_o + carried, dtype=getattr(torch, case.dtype), record=False,
                 what=f"attention over all keys != merge of key blocks cut at {list(case.params['key_cuts'])}")


def key_permutation_invariant(case: Case, impl: Implementation) -> None:
    """Non-causal: permuting the keys and values together (one permutation, rows of k
    and v) leaves o and lse unchanged, within twice the derived tolerance (both sides
    are within it of the same, permutation-invariant, reference)."""
    values, outs = run(case, impl)
    n_k = values["k"].shape[-2]
    perm = torch.from_numpy(np.random.default_rng(case.tensors["v"].seed).permutation(n_k))
    moved = dict(values)
    for name in ("k", "v"):
        moved[name] = _relayout(case.tensors[name], values[name][..., perm.to(values[name].device), :])
    _, outs2 = run(case, impl, moved)
    _, a_o, a_lse = _allowed(case, impl, values)
    assert_close("o", outs2["o"], to_numpy(outs["o"]), 2 * a_o, dtype=getattr(torch, case.dtype),
                 record=False, what="permuting keys and values changed o")
    assert_close("lse", outs2["lse"], to_numpy(outs["lse"]), 2 * a_lse, dtype=torch.float32,
                 record=False, what="permuting keys and values changed lse")


def batch_heads_independent(case: Case, impl: Implementation) -> None:
    """The outputs of one (batch, head) slice are bitwise unchanged when q, k, v of
    every other slice change."""
    values, outs = run(case, impl)
    b_n, h_n = values["q"].shape[:2]
    pick = case.tensors["q"].seed % (b_n * h_n)
    b, h = divmod(pick, h_n)
    changed = dict(values)
    for name in ("q", "k", "v"):
        new = _fresh(case.tensors[name], values[name].device).clone()
        new[b, h] = values[name][b, h]
        changed[name] = _relayout(case.tensors[name], new)
    _, outs2 = run(case, impl, changed)
    what = f"slice (batch {b}, head {h}) changed when the other slices' inputs changed"
    assert_identical("o", outs["o"][b, h], outs2["o"][b, h], what)
    assert_identical("lse", outs["lse"][b, h], outs2["lse"][b, h], what)


def uniform_values_preserved(case: Case, impl: Implementation) -> None:
    """With v all ones, o is all ones (each row of P sums to one), within the derived
    tolerance for that v."""
    values = case.materialise(backend.device())
    values["v"] = _relayout(case.tensors["v"], torch.ones(case.tensors["v"].shape, dtype=values["v"].dtype,
                                                         device=values["v"].device))
    _, outs = run(case, impl, values)
    _, a_o, _ = _allowed(case, impl, values)
    assert_close("o", outs["o"], np.ones(outs["o"].shape), a_o, dtype=getattr(torch, case.dtype),
                 record=False, what="v all ones did not give o all ones")


def _output_shapes(case: Case) -> dict:
    b, h, n_q, d = case.tensors["q"].shape
    return {"o": (b, h, n_q, d), "lse": (b, h, n_q)}


_checks = tuple(dataclasses.replace(c, run=gradients_match_reference) if c.name == "gradients_match_reference"
                else c for c in generic_checks(grad=True))

register(OpSpec(
    name="attention",
    signature="attention(q, k, v, causal=False, sm_scale=None) -> (o, lse)",
    meaning="`q [B, H, Nq, D]`, `k`, `v` `[B, H, Nk, D]`; `sm_scale` defaults to `1/sqrt(D)`; "
            "`o = softmax(q k^T * sm_scale [+ causal mask]) v`; `lse [B, H, Nq]` float32 is the natural-log "
            "logsumexp of the scaled, masked scores of each row. Causal requires `Nq == Nk` and masks key `j > i`.",
    scalars=("causal", "sm_scale"),
    dims={"B": ("q", 0), "H": ("q", 1), "Nq": ("q", 2), "Nk": ("k", 2), "D": ("q", 3)},
    choices={"causal": (False, True), "sm_scale": SM_SCALES},
    arguments=("q", "k", "v", "causal", "sm_scale"),
    outputs=("o", "lse"),
    kernel="kernels.attention:attention",
    reference=ref.attention,
    torch_reference=ref.attention_torch,
    cases=attention_cases,
    tolerance=attention_tolerance,
    grad_tolerance=attention_grad_tolerance,
    grad_inputs=("q", "k", "v"),
    grad_outputs=("o",),
    output_shapes=_output_shapes,
    output_dtypes={"lse": torch.float32},
    checks=_checks + (
        Check("causal_mask_respected", causal_mask_respected, cases=_cases(causal=True, min_n=2)),
        Check("causal_gradient_respected", causal_gradient_respected, cases=_upstream(causal=True, min_n=2),
              needs_backward=True, requires=lambda impl: None if impl.supports_backward
              else f"{impl.name} declares supports_backward = False"),
        Check("online_lse_matches_full", online_lse_matches_full, cases=_key_block_cases()),
        Check("split_kv_merge", split_kv_merge, cases=_key_block_cases(causal=False)),
        Check("key_permutation_invariant", key_permutation_invariant, cases=_cases(causal=False, min_n=2)),
        Check("batch_heads_independent", batch_heads_independent, cases=_cases(min_bh=2)),
        Check("uniform_values_preserved", uniform_values_preserved),
    ),
))
