"""attention(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None,
softcap=0.0, dropout_p=0.0, seed=0, return_keep=False) -> (o, lse): strategy, tolerance
binding and properties (the dropout checks are in properties/attention_dropout.py).

The strategy draws every variant and their combinations: GQA (Hkv | H), Nq != Nk with
bottom-right causal (rows without a key when Nq > Nk), windows, ALiBi slopes ([H] or
[B, H]) and softcaps; the arguments after sm_scale are passed only up to the last one a
case uses (:func:`case_args`). The key-split checks draw no ALiBi (a block call measures
the ALiBi distance from its own diagonal). Only the dropout checks draw ``dropout_p > 0``
(with every other variant); the others compare with the reference without a mask and
keep ``dropout_p = 0``, ``seed = 0``, which are then not passed.

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
rounding (tritoncheck.controls.attention.naive_torch's fp16 lse is 0.017 off for scores around 50,
87 times an fp32-score bound); the kernel, with fp32 scores, uses 4% of it in fp16.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption

from tritoncheck import backend, tolerance
from tritoncheck.backend import BF16_DOT_ON_INTERPRETER
from tritoncheck.bad_input import OTHER_DEVICE, BadInput, Spoiler, randn, scalar_spoilers, tensor_spoilers, widen_last
from tritoncheck.config import CONFIG
from tritoncheck.declarations import BF16_DOT_UPCAST
from tritoncheck.generic import generic_checks, precision, require_grad_fn, run, with_upstream
from tritoncheck.generic import gradients_match_reference as _generic_gradients_match_reference
from tritoncheck.large_problem import LargeProblem, heads
from tritoncheck.limits import NO_LIMITS, Limits, OutsideLimits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.properties import attention_dropout as _dropout
from tritoncheck.properties import attention_tolerance as rules
from tritoncheck.properties.attention_arguments import (
    ARGS,
    NO_WINDOW,
    _backward_sums_in_domain,
    _complete,
    _fmax,
    _resolved_scale,
    _scale_of,
    _values_for,
    _without_alibi,
    case_args,
    mods,
    window_of,
    with_params,
)
from tritoncheck.references import attention as ref
from tritoncheck.registry import OPS, Check, Implementation, OpSpec, register
from tritoncheck.strategies import LONG_FROM, Case, Layout, TensorSpec, layouts, special_values, tensors

# The interpreter's blocks (16 x 16) and the GPU's (32 and 64): sizes around them.
BLOCKS = (16, 32, 64)
# Small profile: 16 and 32 first (cheapest under the interpreter), odd head dims the
# kernel pads with masks (24, 80, 5), and the other compiled buckets.
HEAD_DIMS_SMALL = (16, 32, 16, 32, 24, 64, 80, 128, 5)
HEAD_DIMS_LARGE = (64, 128, 16, 32, 24, 80, 5, 1)
SM_SCALES = (None, 0.5, 2.0, 1e-3)
# (left, right) bands, -1 unbounded: none first (shrinks to it), a band of the diagonal key
# alone, one-sided bands, and bands wider than the interpreter's blocks (16)
WINDOWS = (NO_WINDOW, (0, 0), (3, -1), (-1, 2), (4, 1), (1, 4), (16, 0), (0, 17), (33, 7))
# softcap 0 = off first; caps that saturate typical scores (0.25), Gemma's 30 and 50, one far above
SOFTCAPS = (0.0, 30.0, 4.0, 0.25, 50.0, 1e4)
ALIBI_SCALES = (0.5, 0.0625, 1e-3)  # slopes ~ N(0, scale^2): ALiBi's are 2^-1 .. 2^-8
QKV_FAMILIES = ("normal", "near_max", "tiny", "constant", "outlier", "offset")
_BNHD = Layout(order=(0, 2, 1, 3))  # [B, N, H, D] storage seen as [B, H, N, D]
_CONTIGUOUS = Layout(order=(0, 1, 2, 3))
# Work limits per case: under the interpreter the cost is about 10 ms per
# (batch*head, query block, key block) triple; on the GPU the limit is the fp64 NumPy
# reference and tolerance (a few [B, H, Nq, Nk] float64 arrays).
_TILE_BUDGET = 36  # small: B*H * cdiv(Nq, 16) * cdiv(Nk, 16)
_SCORE_BUDGET = 2**21  # large: B*H * Nq * Nk
# Long sequences, large profile only: a KV cache of up to 16k keys read by up to 2048
# queries (decode, chunked prefill), or a square up to 8k, in LONG_PERCENT of the draws,
# with B = H = 1 once the scores alone pass the budget. The fp64 reference and rules
# run on the GPU in blocks of rows; a 16k square would hold about 16 GB per worker in the
# fp64 autograd reference of the gradient checks (2 GB per N x N array), so squares stop
# at 8k (4 GB).
LONG_KEYS, LONG_QUERIES, LONG_SQUARE = 16384, 2048, 8192
LONG_BLOCKS = (4096, 8192)  # their edges: 4095, 4096, 4097, 8193, 8191, 8192, 16385 (if inside)
LONG_PERCENT = 5


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


# dropout probabilities of the dropout checks: 0 (only dropout_zero_is_plain draws it), small,
# even, large (most keys dropped: short rows lose every key)
DROPOUT_PS = (0.0, 0.1, 0.5, 0.9, 0.25)


@st.composite
def attention_cases(draw, dtype: torch.dtype, causal: bool | None = None, min_n: int = 1,
                    min_bh: int = 1, limits: Limits = NO_LIMITS, gqa: bool | None = None,
                    shape: str | None = None, windows: tuple | None = None, alibi: bool | None = None,
                    softcaps: tuple | None = None, max_d: int = 128, sm_scales: tuple | None = None,
                    max_n: int | None = None, dropouts: tuple | None = None, min_h: int = 1,
                    return_keep: bool = False, max_tiles: int = _TILE_BUDGET,
                    score_cap: float | None = None) -> Case:
    """q [B, H, Nq, D], k and v [B, Hkv, Nk, D] with Hkv | H.

    ``causal`` None draws it; ``min_n`` and ``min_bh`` are for properties that need
    two keys (or rows) or two (batch, head) slices. ``gqa`` True draws H = 4 and Hkv < H
    (2 or 1: two KV heads shared by two query heads each trigger a wrong head map), False
    Hkv = H, None any divisor of H. ``shape`` "wide" draws Nq < Nk, "tall" Nq > Nk,
    "square" Nq == Nk, None either (Nq == Nk half the time when causal). ``windows``, ``softcaps``: the values to draw from (None:
    WINDOWS, SOFTCAPS); ``alibi`` True or False forces ALiBi slopes ([H] or [B, H], float32)
    on or off, None draws it; ``max_d`` caps the head dim, ``max_n`` Nq and Nk (a check
    that runs several forward and backward calls on four heads keeps its CPU cost down).
    ``dropouts``: the dropout probabilities to draw from (None: no dropout, dropout_p = 0 and
    seed = 0, not passed), with a seed then; ``min_h`` the fewest query heads (two heads'
    masks compared); ``return_keep`` True asks for the keep mask (the call returns three
    outputs: the dropout checks unpack them); ``max_tiles`` the interpreter's work budget
    (B H cdiv(Nq, 16) cdiv(Nk, 16), default _TILE_BUDGET); ``score_cap`` bounds |s_ij| =
    |q_i . k_j| scale by bounding |q| and |k| (default: the dtype's range, ``qk_cap``)."""
    # --shape-classes: every free variant on or every one off (Limits.variant), not each drawn alone
    on = draw(st.booleans()) if CONFIG.shape_classes is not None else True
    causal = draw(limits.variant("causal", (False, True) if causal is None else (causal,), off=False, on=on))
    window = draw(limits.variant("window", WINDOWS if windows is None else windows, off=NO_WINDOW, on=on))
    # GQA's check runs two forward and backward calls on four heads: shorter sequences
    n_max = min(CONFIG.pick(70, 2048), max_n or 2048, CONFIG.pick(33, 512) if gqa else 2048)
    long = CONFIG.size == "large" and not gqa and max_n is None and shape != "tall" \
        and min(limits.max_size.get("Nq", LONG_FROM), limits.max_size.get("Nk", LONG_FROM)) >= LONG_FROM \
        and 1 <= draw(st.integers(0, 999)) <= 10 * LONG_PERCENT  # not [0, 99]: see strategies.lengths
    square = shape == "square" or (shape is None and (long or causal) and draw(st.booleans()))
    if long and square:
        n_q = n_k = draw(limits.joined("Nq", "Nk").size("Nq", LONG_FROM, LONG_SQUARE, blocks=LONG_BLOCKS))
    elif long:
        # the lengths models cache (powers of two and their neighbours) as often as any
        n_k = draw(st.one_of(limits.size("Nk", LONG_FROM, LONG_KEYS, blocks=LONG_BLOCKS),
                             limits.size("Nk", LONG_FROM, LONG_KEYS)))
        n_q = draw(limits.size("Nq", min_n, min(LONG_QUERIES, n_k - 1), blocks=BLOCKS))
    else:
        n_q = draw((limits.joined("Nq", "Nk") if square else limits).size("Nq", min_n + (shape == "tall"),
                                                                           n_max, blocks=BLOCKS))
        if square:
            n_k = n_q
        elif shape == "wide":
            n_k = draw(limits.size("Nk", n_q + 1, n_max + 1, blocks=BLOCKS))
        elif shape == "tall":
            n_k = draw(limits.size("Nk", min_n, n_q - 1, blocks=BLOCKS))
        else:
            n_k = draw(limits.size("Nk", min_n, n_max, blocks=BLOCKS))
    d = draw(limits.specialised_pick("attention", "D", [n for n in CONFIG.pick(HEAD_DIMS_SMALL, HEAD_DIMS_LARGE)
                                                               if n <= max_d]))
    work = CONFIG.pick(math.ceil(n_q / 16) * math.ceil(n_k / 16), n_q * n_k)
    if gqa:
        min_bh = max(min_bh, 4)
    max_bh = max(min_bh, CONFIG.pick(max_tiles, _SCORE_BUDGET) // work)
    # GQA's check: one batch (its cost is four heads, twice, with gradients) unless declared otherwise
    # (min_h heads take min_h of the budget's slices: the batch gets the rest)
    b = draw(limits.specialised("attention", "B", 1, 1 if gqa else max(1, min(3, max_bh // min_h)), span=(1, 3)))
    h_lo = max(1, math.ceil(min_bh / b))
    if gqa:
        h = draw(limits.pick("H", (4,)))  # declared head counts replace 4
        grouped = [n for n in range(h - 1, 0, -1) if h % n == 0 and n in limits.sizes.get("Hkv", (n,))]
        if not grouped:
            raise OutsideLimits(f"GQA needs H >= 2 with a proper divisor inside the declared Hkv limits; H = {h}")
        h_kv = draw(limits.pick("Hkv", grouped))
    else:
        h_lo = max(h_lo, min_h)
        h = draw(limits.specialised("attention", "H", h_lo, max(min(4, max_bh // b), h_lo), span=(1, 4)))
        # Hkv = H first (plain multi-head attention is what a failure shrinks to); declared
        # Hkv limits keep the divisors of H inside them
        h_kv = h if gqa is False else draw(limits.pick("Hkv", [n for n in range(h, 0, -1) if h % n == 0
                                                               and n in limits.sizes.get("Hkv", (n,))]))
    sm_scale = draw(limits.choice("sm_scale", SM_SCALES if sm_scales is None else sm_scales))
    # the checks without dropout need dropout_p = 0: a kernel declaring other values only is outside them
    dropout_p, seed = draw(limits.choice("dropout_p", (0.0,) if dropouts is None else dropouts)), 0
    if dropouts is not None:
        # --shape-classes: 64-bit seeds only. A seed past 2**31 is an i64 argument, a
        # compilation of every kernel apart from the i32 one; dropout_seed_reproducible
        # flips bit 40 of every seed, so the i64 kernels are compiled in any case
        seed = draw(st.integers(2**31, 2**63 - 1) if CONFIG.shape_classes is not None else
                    st.one_of(st.integers(0, 2**16), st.integers(0, 2**63 - 1)))
    scale = _resolved_scale(sm_scale, d)
    cap = qk_cap(dtype, d, scale)
    if score_cap is not None:  # |q . k| scale <= d cap^2 scale <= score_cap
        cap = min(cap, math.sqrt(score_cap / (d * scale)))
    q = draw(_qkv((b, h, n_q, d), dtype, cap))
    k = draw(_qkv((b, h_kv, n_k, d), dtype, cap))
    if n_k > 16 and draw(st.booleans()):
        k = draw(_late_max(k, cap))
    # dropout scales the kept weights by 1 / (1 - p): |o| <= max|v| / (1 - p) must stay finite,
    # with room for its rounding (half the range)
    v = draw(_qkv((b, h_kv, n_k, d), dtype, v_cap(dtype, n_k) * ((1.0 - dropout_p) / 2 if dropout_p else 1.0)))
    softcap = draw(limits.variant("softcap", SOFTCAPS if softcaps is None else softcaps, off=0.0, on=on))
    specs = {"q": q, "k": k, "v": v}
    if limits.held("alibi_slopes"):  # a signature without alibi_slopes: plain cases only
        if alibi:
            raise limits.not_taken("alibi_slopes", "ALiBi slopes")
        alibi = False
    if (on if CONFIG.shape_classes is not None else draw(st.booleans())) if alibi is None else alibi:
        shape_ab = (b, h) if draw(st.booleans()) else (h,)
        specs["alibi_slopes"] = draw(tensors(shape_ab, torch.float32, scales=ALIBI_SCALES, layout=False))
    # every scalar in params (what limits and properties read), passed only as far as args go
    params = {"causal": bool(causal), "sm_scale": sm_scale, "window": tuple(window), "softcap": softcap,
              "dropout_p": dropout_p, "seed": seed}
    if return_keep:
        params["return_keep"] = True
    args = case_args(params, specs)
    return Case("attention", str(dtype).replace("torch.", ""), args, specs, _complete(params, args, specs))


def _cases(**fixed):
    """A ``Check.cases`` function drawing attention cases with some structure fixed."""
    return lambda op, dtype: op.cases(dtype, **fixed)


def _upstream(**fixed):
    """``with_upstream`` on attention cases with some structure fixed."""
    def make(op, dtype):
        return with_upstream(dataclasses.replace(op, cases=lambda dt: op.cases(dt, **fixed)), dtype)
    return make


# ------------------------------------------------------------------------- tolerance


def attention_tolerance(case, inputs64, expected, p):
    o, lse = rules.attention(inputs64["q"], inputs64["k"], inputs64["v"], expected["o"],
                             expected["lse"], case.params["causal"], _scale_of(case), p, window_of(case),
                             **mods(case, inputs64))
    return {"o": o, "lse": lse}


def attention_grad_tolerance(case, inputs64, outputs64, grads64, p):
    return rules.attention_grad(inputs64["q"], inputs64["k"], inputs64["v"], inputs64["do"],
                                outputs64["o"], outputs64["lse"], grads64["q"], grads64["k"],
                                grads64["v"], case.params["causal"], _scale_of(case), p, window_of(case),
                                **mods(case, inputs64))


def _reference(case: Case, q, k, v, causal: bool, window, extra: dict):
    """fp64 (o, lse) of q, k, v (tensors as drawn) and the fp64 inputs, for the rules: the
    torch reference on the GPU the tensors are on (no N x N work waits on the host), the
    NumPy reference on the host. o and lse come back as NumPy arrays, the inputs as they
    were computed (rules.attention takes either)."""
    if q.is_cuda:
        q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
        with torch.no_grad():
            o, lse = ref.attention_torch(q, k, v, causal, case.params["sm_scale"], window, **extra)
        return (q, k, v), to_numpy(o), to_numpy(lse)
    q, k, v = (to_numpy(t) for t in (q, k, v))
    o, lse = ref.attention(q, k, v, causal, case.params["sm_scale"], window, **extra)
    return (q, k, v), o, lse


def _allowed(case: Case, impl: Implementation, values) -> tuple[dict, np.ndarray, np.ndarray]:
    """fp64 reference outputs on ``values`` and their allowed errors (o, lse)."""
    causal, scale, window = values.get("causal", case.params["causal"]), _scale_of(case), \
        tuple(values.get("window", window_of(case)))
    extra = mods(case, values)
    qkv, o, lse = _reference(case, values["q"], values["k"], values["v"], causal, window, extra)
    a_o, a_lse = rules.attention(*qkv, o, lse, causal, scale, precision(impl, case), window, **extra)
    return {"o": o, "lse": lse}, a_o, a_lse


# ------------------------------------------------------------------------ properties


def _gradient_domain(case: Case, values) -> None:
    """:func:`_backward_sums_in_domain` on materialised ``values`` (q, k, v, do), on their device."""
    q, k, v, do = (values[n].detach().to(torch.float64) for n in ("q", "k", "v", "do"))
    o, _ = ref.attention_torch(q, k, v, case.params["causal"], case.params["sm_scale"], window_of(case),
                               **mods(case, values))
    _backward_sums_in_domain(case, q, k, v, do, o)


def _in_gradient_domain(case: Case, inputs64, outputs64, grads64) -> None:
    """:func:`_backward_sums_in_domain` for the generic gradient check (NumPy arrays)."""
    q, k, v, do, o = (torch.from_numpy(a).to(backend.device())
                      for a in (*(inputs64[n] for n in ("q", "k", "v", "do")), outputs64["o"]))
    _backward_sums_in_domain(case, q, k, v, do, o)


def gradients_match_reference(case: Case, impl: Implementation) -> None:
    """Gradients dq, dk, dv match fp64 PyTorch autograd (tritoncheck.references.attention.attention_torch)
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


def _diag(values: dict) -> int:
    """Nk - Nq: query row i's diagonal key is i + diag (bottom-right alignment)."""
    return values["k"].shape[-2] - values["q"].shape[-2]


def _fresh(spec: TensorSpec, device) -> torch.Tensor:
    """Other values for a tensor: the same spec with another seed and no injections,
    in the same layout."""
    return dataclasses.replace(spec, seed=(spec.seed + 1) % 2**32, injections=()).materialise(device)


def _relayout(spec: TensorSpec, values: torch.Tensor) -> torch.Tensor:
    """``values`` (any layout) in ``spec``'s layout."""
    return (spec.layout or _CONTIGUOUS).apply(values.contiguous())


def _lse_returned(impl: Implementation) -> bool:
    """Whether ``impl`` returns lse: an o-only implementation (``fn.returns = ("o",)``) is
    checked on o by the checks that compare both, and not by those that need lse."""
    return "lse" in impl.returns


def causal_mask_respected(case: Case, impl: Implementation) -> None:
    """Causal: giving keys and values j > i + Nk - Nq fresh values leaves rows 0..i of o
    and lse bitwise unchanged (a query never sees a key past its bottom-right diagonal)."""
    values, outs = run(case, impl)
    n = values["q"].shape[-2]
    i = _row_of(case, n)
    first = max(0, i + _diag(values) + 1)  # the first key row i must not see
    changed = dict(values)
    for name in ("k", "v"):
        new = values[name].detach().clone()
        new[..., first:, :] = _fresh(case.tensors[name], new.device)[..., first:, :]
        changed[name] = _relayout(case.tensors[name], new)
    _, outs2 = run(case, impl, changed)
    what = f"changing keys/values j >= {first} changed causal output rows <= {i}"
    assert_identical("o", outs["o"][..., :i + 1, :], outs2["o"][..., :i + 1, :], what)
    if _lse_returned(impl):
        assert_identical("lse", outs["lse"][..., :i + 1], outs2["lse"][..., :i + 1], what)


def causal_gradient_respected(case: Case, impl: Implementation) -> None:
    """Causal: with the upstream gradient zero except on row i of o, the gradients of
    keys and values j > i + Nk - Nq are exactly zero, and so is dq outside row i."""
    values = case.materialise(backend.device())
    n = values["q"].shape[-2]
    i = _row_of(case, n)
    first = max(0, i + _diag(values) + 1)  # the first key row i does not see
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
    for name, g in (("dk", dk), ("dv", dv)):
        part = g[..., first:, :]
        assert_identical(name, torch.zeros_like(part), part, f"{what}, {name} of keys j >= {first} is not zero")
    others = torch.ones(n, dtype=torch.bool, device=dq.device)
    others[i] = False
    part = dq[..., others, :]
    assert_identical("dq", torch.zeros_like(part), part, f"{what}, dq of the other rows is not zero")


@st.composite
def _key_blocks(draw, op: OpSpec, dtype: torch.dtype, causal: bool | None = None) -> Case:
    """Attention cases with >= 2 keys and 1-2 cut points splitting the keys into blocks
    (``params["key_cuts"]``, not an argument of the op)."""
    # ALiBi's distance is to the call's own diagonal: a call on keys [a, b) measures it
    # from Nk - b keys earlier than the full call, and the dropout mask's counter depends on
    # Nq and Nk: neither split is a call of the same function, so these checks draw no
    # ALiBi and no dropout (dropout_p stays 0)
    case = draw(op.cases(dtype, causal=causal, min_n=2, alibi=False))  # op.cases: inside the declared limits
    n_k = case.tensors["k"].shape[-2]
    # one or two cuts: two to three blocks (each block is one more kernel call, two when causal)
    cuts = draw(st.lists(st.integers(1, n_k - 1), min_size=1, max_size=2, unique=True))
    return dataclasses.replace(case, params={**case.params, "key_cuts": tuple(sorted(cuts))})


def _key_block_cases(causal: bool | None = None):
    return lambda op, dtype: _key_blocks(op, dtype, causal)


def _sliced(values: dict, name: str, rows: slice) -> torch.Tensor:
    return values[name][..., rows, :].contiguous()


def _block_call(case: Case, impl: Implementation, values: dict, q_rows: slice, keys: slice, causal: bool,
                window: tuple[int, int]):
    """impl on q[q_rows] against keys and values[keys], with the given mask: o, lse and
    their allowances (the derived rule for that call), fp64 NumPy."""
    sub = with_params(case, causal=causal, window=window)
    part = {**values, "causal": causal, "window": window, "q": _sliced(values, "q", q_rows),
            "k": _sliced(values, "k", keys), "v": _sliced(values, "v", keys)}
    _, outs = run(sub, impl, _values_for(sub, part))
    extra = mods(case, values)
    qkv, o, lse = _reference(case, part["q"], part["k"], part["v"], causal, window, extra)
    a_o, a_lse = rules.attention(*qkv, o, lse, causal, _scale_of(case), precision(impl, case), window, **extra)
    return to_numpy(outs["o"]), to_numpy(outs["lse"]), a_o, a_lse


def _block_calls(n_q: int, n_k: int, a: int, b: int, causal: bool, window: tuple[int, int]) -> list[tuple]:
    """The calls (query rows, causal, window) that give every query row its part of the
    attention over keys [a, b) alone; rows in none of them see no key of the block.

    Row i sees keys i + diag - left .. i + diag + right (diag = Nk - Nq, causal: right <= 0).
    Without a window: causal rows a - diag .. b - diag - 1 see a bottom-right causal
    block (a causal call of those rows on keys [a, b): the call's own diagonal Nk' - Nq'
    lands on the same keys, also when the rows are clipped at 0), later rows all of it (a
    plain call), earlier rows none. With a window: one call of rows [0, c1) on keys [a, b)
    with the band moved to the call's own diagonal, diag' = (b - a) - c1:
    left' = left + b - c1 - diag, right' = right - b + c1 + diag; c1 = min(Nq, b - diag +
    left) keeps both >= 0, and rows past c1 see no key of the block (i + diag - left >= b)."""
    diag = n_k - n_q
    if tuple(window) == NO_WINDOW:
        if not causal:
            return [(slice(0, n_q), False, NO_WINDOW)]
        edge, full = max(0, a - diag), max(0, b - diag)
        return [(slice(edge, full), True, NO_WINDOW), (slice(full, n_q), False, NO_WINDOW)]
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    c1 = n_q if left < 0 else min(n_q, b - diag + left)
    if c1 <= 0:
        return []
    moved = (-1 if left < 0 else left + b - c1 - diag, -1 if right < 0 else right - b + c1 + diag)
    return [(slice(0, c1), False, moved)]


def _key_block_parts(case: Case, impl: Implementation, values: dict) -> list[tuple]:
    """For each block of keys [a, b) (cut at ``key_cuts``), every query row's (o_j, lse_j,
    allowance of o_j, allowance of lse_j) over that block alone, as the implementation
    computes it (:func:`_block_calls`: the block decomposition a FlashAttention with a
    bottom-right causal mask or a window runs). A row that sees no key of a block has
    lse_j = -inf, weight 0."""
    n_q, n_k = values["q"].shape[-2], values["k"].shape[-2]
    edges = (0,) + tuple(case.params["key_cuts"]) + (n_k,)
    lead = values["q"].shape[:-2]
    parts = []
    for a, b in zip(edges[:-1], edges[1:]):
        o = np.zeros(lead + (n_q, values["v"].shape[-1]))
        lse = np.full(lead + (n_q,), -np.inf)
        a_o, a_lse = np.zeros_like(o), np.zeros_like(lse)
        for rows, block_causal, block_window in _block_calls(n_q, n_k, a, b, case.params["causal"],
                                                            window_of(case)):
            if rows.stop > rows.start:
                o[..., rows, :], lse[..., rows], a_o[..., rows, :], a_lse[..., rows] = _block_call(
                    case, impl, values, rows, slice(a, b), block_causal, block_window)
        parts.append((o, lse, a_o, a_lse))
    return parts


def _online_merge(lses: list[np.ndarray]) -> np.ndarray:
    """The online logsumexp recurrence over blocks, in fp64: m <- max(m, lse_j),
    s <- s e^{m_old - m} + e^{lse_j - m}; lse = m + log s. A block a row does not see
    (lse_j = -inf) adds nothing."""
    m = np.full(lses[0].shape, -np.inf)
    s = np.zeros(lses[0].shape)
    with np.errstate(invalid="ignore", divide="ignore"):  # a row that sees no key: log(0) = -inf
        for lse_j in lses:
            m_new = np.maximum(m, lse_j)
            ref_m = np.where(np.isneginf(m_new), 0.0, m_new)
            s = s * np.exp(m - ref_m) + np.exp(lse_j - ref_m)
            m = m_new
        return m + np.log(s)


def _lse_errors(parts: list[tuple]) -> list[np.ndarray]:
    """Each block's bound on |lse_j - exact lse_j|: its derived allowance plus the rounding
    of the returned float32 lse_j, u |lse_j| (u = 2^-24). The rounding is absolute in lse:
    with scores near 1e18 one ulp of lse is about 1e11, and lse_j = s + log n_j rounds to s
    whatever n_j, so no merge of correctly rounded lse values can weigh the blocks right
    (a correct plain attention failed split_kv_merge by 3.3e5 x an allowance without it).
    0 for a block the row does not see (weight 0)."""
    u = tolerance.unit_roundoff(torch.float32)  # lse is float32 by the contract
    with np.errstate(invalid="ignore"):
        return [np.where(np.isneginf(lse_j), 0.0, a_lse_j + u * np.abs(lse_j)) for _, lse_j, _, a_lse_j in parts]


def online_lse_matches_full(case: Case, impl: Implementation) -> None:
    """The lse over all keys equals the online merge (the logsumexp recurrence, in fp64)
    of the implementation's own lse over blocks of the keys (drawn cut points; causal
    rows see causal diagonal blocks and whole earlier blocks). Allowance: the full call's
    derived lse allowance, plus each block's error bound (:func:`_lse_errors`: its allowance
    and its float32 rounding) carried through the merge (d lse / d lse_j = w_j =
    e^{lse_j - lse}), plus the fp64 merge's rounding."""
    values, outs = run(case, impl)
    if outs["lse"].dtype != torch.float32:
        raise AssertionError(f"lse has dtype {outs['lse'].dtype}, the contract says float32")
    parts = _key_block_parts(case, impl, values)
    merged = _online_merge([lse_j for _, lse_j, _, _ in parts])
    with np.errstate(invalid="ignore", over="ignore"):
        carried = sum(np.where(np.isneginf(lse_j), 0.0, np.exp(lse_j - merged)) * e_j
                      for (_, lse_j, _, _), e_j in zip(parts, _lse_errors(parts)))
        merge_rounding = 4 * len(parts) * tolerance.unit_roundoff(torch.float64) * np.abs(merged)
    _, _, a_lse = _allowed(case, impl, values)
    cuts = list(case.params["key_cuts"])
    assert_close("lse", outs["lse"], merged, a_lse + carried + merge_rounding, dtype=torch.float32, record=False,
                 what=f"lse over all keys != online merge of the lse over key blocks cut at {cuts}")


def split_kv_merge(case: Case, impl: Implementation) -> None:
    """o over all keys equals the merge of o over blocks of the keys (drawn cut points;
    causal and windowed calls split as :func:`_block_calls` says, bottom-right aligned),
    each weighted by its share of the normaliser, w_j = e^{lse_j - lse},
    lse = logsumexp_j lse_j (flash-decoding's split-KV reduction, in fp64 from the
    implementation's own block results). The blocks are contiguous copies (the property
    is about the math, not about views).

    Allowance. Each lse_j is within e_j of its exact value (:func:`_lse_errors`: its
    derived allowance and its float32 rounding) and the merged lse within E = max_j e_j
    (a weighted mean of the blocks' errors in the exponent), so the exact weight lies in
    [w_j e^{-(e_j + E)}, min(1, w_j e^{e_j + E})]: exactly, not to first order (e_j reaches
    1e12 for scores near 1e18), and in log space (a weight that is 0 in fp64, e^{-7e9},
    may be the exact weight of a block: 0 times e^{1e12} must not read 0). The weights sum
    to 1 both ways, so their movement moves the merge by sum_j |dw_j| |o*_j - merged| with
    o*_j the exact block output, |o*_j - merged| <= |o_j - merged| + a_o_j. In all: the
    full call's derived o allowance + sum_j (w_j a_o_j + |dw_j| (|o_j - merged| + a_o_j)).

    Not applicable (the example is discarded with the reason) where the weights' part
    reaches the output's scale (the largest |o_j| of the row) in more than half of the
    rows that see a key: lse's rounding then leaves the blocks' weights unknown, and any
    mix of the blocks' outputs would pass."""
    values, outs = run(case, impl)
    parts = _key_block_parts(case, impl, values)
    lse = _online_merge([lse_j for _, lse_j, _, _ in parts])
    errors = _lse_errors(parts)
    worst = np.maximum.reduce(errors)
    # a row that sees no key at all (lse = -inf) has weight 0 everywhere: o = 0
    with np.errstate(invalid="ignore", over="ignore"):
        weights, moved = [], []
        for (_, lse_j, _, _), e_j in zip(parts, errors):
            seen, gap = ~np.isneginf(lse_j), lse_j - lse
            w = np.where(seen, np.exp(gap), 0.0)
            up = np.minimum(1.0, np.exp(np.minimum(gap + e_j + worst, 0.0))) - w
            down = -w * np.expm1(-(e_j + worst))
            weights.append(w[..., None])
            moved.append(np.where(seen, np.maximum(up, down), 0.0)[..., None])
    merged = sum(w * o_j for w, (o_j, _, _, _) in zip(weights, parts))
    by_weights = sum(dw * (np.abs(o_j - merged) + a_o_j) for dw, (o_j, _, a_o_j, _) in zip(moved, parts))
    scale = np.maximum.reduce([np.where(w > 0, np.abs(o_j), 0.0) for w, (o_j, _, _, _) in zip(weights, parts)])
    sees = ~np.isneginf(lse)
    unknown = (by_weights >= scale).any(axis=-1) & (scale > 0).any(axis=-1) & sees
    if 2 * int(unknown.sum()) > int(sees.sum()):
        raise UnsatisfiedAssumption(
            f"not applicable: in {int(unknown.sum())} of the {int(sees.sum())} rows that see a key the blocks' lse "
            f"(up to |lse| = {float(np.abs(np.where(sees, lse, 0.0)).max()):.3g}) are known only to within "
            f"{float(worst.max()):.3g} (their derived allowance and float32 rounding), which moves their weights by as much as the "
            "output's scale: no merge of them can be checked")
    carried = sum(w * a_o_j for w, (_, _, a_o_j, _) in zip(weights, parts)) + by_weights
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
    if _lse_returned(impl):
        assert_close("lse", outs2["lse"], to_numpy(outs["lse"]), 2 * a_lse, dtype=torch.float32,
                     record=False, what="permuting keys and values changed lse")


def batch_heads_independent(case: Case, impl: Implementation) -> None:
    """The outputs of one (batch, head) slice are bitwise unchanged when q of every other
    slice and k, v of every other (batch, KV head) slice change."""
    values, outs = run(case, impl)
    b_n, h_n = values["q"].shape[:2]
    pick = case.tensors["q"].seed % (b_n * h_n)
    b, h = divmod(pick, h_n)
    h_kv = h // (h_n // values["k"].shape[1])  # the KV head query head h reads (GQA)
    changed = dict(values)
    for name, head in (("q", h), ("k", h_kv), ("v", h_kv)):
        new = _fresh(case.tensors[name], values[name].device).clone()
        new[b, head] = values[name][b, head]
        changed[name] = _relayout(case.tensors[name], new)
    _, outs2 = run(case, impl, changed)
    what = f"slice (batch {b}, head {h}) changed when the other slices' inputs changed"
    assert_identical("o", outs["o"][b, h], outs2["o"][b, h], what)
    if _lse_returned(impl):
        assert_identical("lse", outs["lse"][b, h], outs2["lse"][b, h], what)


def uniform_values_preserved(case: Case, impl: Implementation) -> None:
    """With v all ones, o is all ones (each row of P sums to one) in every row that sees a
    key, and exactly 0 in a row that sees none, within the derived tolerance for that v."""
    values = case.materialise(backend.device())
    values["v"] = _relayout(case.tensors["v"], torch.ones(case.tensors["v"].shape, dtype=values["v"].dtype,
                                                         device=values["v"].device))
    _, outs = run(case, impl, values)
    _, a_o, _ = _allowed(case, impl, values)
    n_q, n_k = values["q"].shape[-2], values["k"].shape[-2]
    sees = ref.visible_pairs(n_q, n_k, case.params["causal"], window_of(case)).any(axis=-1)
    expected = np.broadcast_to(sees[:, None].astype(np.float64), outs["o"].shape)
    a_o = np.where(sees[:, None], a_o, 0.0)  # an empty row is exactly 0
    assert_close("o", outs["o"], expected, a_o, dtype=getattr(torch, case.dtype), record=False, vacuity=True,
                 what="v all ones did not give o all ones (0 in rows that see no key)")  # exact: no noise


def _with_grads(case: Case, impl: Implementation, values: dict, **changes):
    """impl's outputs and gradients (dq, dk, dv) of o with the upstream values["do"], on
    ``values`` with ``changes`` (fresh leaves: the inputs' values, not their graph)."""
    run_values = {**values, **changes}
    for name in ("q", "k", "v"):
        run_values[name] = run_values[name].detach().requires_grad_(True)
    _, outs = run(case, impl, run_values)
    require_grad_fn(OPS["attention"], impl, outs)
    grads = torch.autograd.grad(outs["o"], (run_values["q"], run_values["k"], run_values["v"]), values["do"])
    return {n: t.detach() for n, t in outs.items()}, dict(zip(("dq", "dk", "dv"), grads))


def _reference_grads(case: Case, q, k, v, do) -> tuple[np.ndarray, np.ndarray, dict]:
    """fp64 autograd reference, on the tensors' device: o, lse and the gradients (NumPy)
    for q, k, v, do given."""
    q, k, v = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
    o, lse = ref.attention_torch(q, k, v, case.params["causal"], case.params["sm_scale"], window_of(case),
                                 **mods(case))
    grads = torch.autograd.grad(o, (q, k, v), do.detach().to(torch.float64))
    return to_numpy(o), to_numpy(lse), {n: to_numpy(g) for n, g in zip(("q", "k", "v"), grads)}


def gqa_equals_repeated_kv(case: Case, impl: Implementation) -> None:
    """GQA (Hkv < H) equals multi-head attention on k, v repeated per group of query heads
    (KV head h // (H / Hkv) at query head h): o and lse, and dq; the dk, dv of a shared KV
    head equal the sum over its group of the repeated heads' dk, dv. Within the sum of
    the two calls' derived allowances (each is within its own of the same exact value;
    the repeated heads' allowances summed over the group)."""
    values = case.materialise(backend.device())
    _gradient_domain(case, values)
    heads, kv_heads = values["q"].shape[1], values["k"].shape[1]
    group = heads // kv_heads
    outs, grads = _with_grads(case, impl, values)
    k_rep, v_rep = (ref.repeat_kv(values[n].detach(), heads) for n in ("k", "v"))
    outs2, grads2 = _with_grads(case, impl, values, k=k_rep, v=v_rep)
    _, a_o, a_lse = _allowed(case, impl, values)
    what = f"GQA with {kv_heads} KV heads for {heads} query heads != multi-head attention on repeated k, v"
    dtype = getattr(torch, case.dtype)
    assert_close("o", outs["o"], to_numpy(outs2["o"]), 2 * a_o, dtype=dtype, record=False, what=what)
    if _lse_returned(impl):
        assert_close("lse", outs["lse"], to_numpy(outs2["lse"]), 2 * a_lse, dtype=torch.float32, record=False, what=what)

    q64, k64, v64, do64 = (values[n].detach().to(torch.float64) for n in ("q", "k", "v", "do"))
    p = precision(impl, case)
    args = (case.params["causal"], _scale_of(case), p, window_of(case), mods(case)["alibi_slopes"],
            mods(case)["softcap"])
    o64, lse64, g64 = _reference_grads(case, values["q"], values["k"], values["v"], values["do"])
    a_gqa = rules.attention_grad(q64, k64, v64, do64, o64, lse64, g64["q"], g64["k"], g64["v"], *args)
    k64r, v64r = ref.repeat_kv(k64, heads), ref.repeat_kv(v64, heads)
    _, _, g64r = _reference_grads(case, values["q"], k_rep, v_rep, values["do"])
    a_rep = rules.attention_grad(q64, k64r, v64r, do64, o64, lse64, g64r["q"], g64r["k"], g64r["v"], *args)
    assert_close("dq", grads["dq"], to_numpy(grads2["dq"]), a_gqa["dq"] + a_rep["dq"], dtype=dtype, record=False,
                 what=what)
    for name in ("dk", "dv"):
        summed = rules._group_sum(to_numpy(grads2[name]), kv_heads)
        # the fp64 sum of the group's rounded gradients: group - 1 additions
        fp64_sum = (group - 1) * tolerance.unit_roundoff(torch.float64) * rules._group_sum(
            np.abs(to_numpy(grads2[name])), kv_heads)
        assert_close(name, grads[name], summed, a_gqa[name] + rules._group_sum(a_rep[name], kv_heads) + fp64_sum,
                     dtype=dtype, record=False, what=f"{what}: {name} of a KV head != sum over its query heads")


def bottom_right_causal_is_last_rows(case: Case, impl: Implementation) -> None:
    """Causal with Nq < Nk (a KV cache: the queries are the last Nq positions) equals the
    last Nq rows of the causal call on Nk queries whose last Nq rows are q (and the first
    Nk - Nq fresh values), the window, if any, the same: o and lse within twice the
    derived allowance (both are within it of the same exact value)."""
    values, outs = run(case, impl)
    n_q, n_k = values["q"].shape[-2], values["k"].shape[-2]
    spec = case.tensors["q"]
    longer = dataclasses.replace(spec, shape=spec.shape[:2] + (n_k,) + spec.shape[3:], seed=(spec.seed + 1) % 2**32,
                                 injections=()).materialise(values["q"].device).clone()
    longer[..., n_k - n_q:, :] = values["q"]
    full_values = {**values, "q": _relayout(spec, longer)}
    _, full = run(case, impl, full_values)
    _, a_o, a_lse = _allowed(case, impl, values)
    what = f"causal on {n_q} queries != the last {n_q} rows of causal on {n_k} queries (bottom-right alignment)"
    assert_close("o", outs["o"], to_numpy(full["o"][..., n_k - n_q:, :]), 2 * a_o, dtype=getattr(torch, case.dtype),
                 record=False, what=what)
    if _lse_returned(impl):
        assert_close("lse", outs["lse"], to_numpy(full["lse"][..., n_k - n_q:]), 2 * a_lse, dtype=torch.float32,
                     record=False, what=what)


def empty_rows_zero(case: Case, impl: Implementation) -> None:
    """Causal with Nq > Nk: rows i < Nq - Nk (and any row a window leaves without a key)
    see no key: o is exactly 0 and lse exactly -inf there, every gradient is finite (no
    NaN from a 0/0 softmax), and dq of those rows is exactly 0."""
    values = case.materialise(backend.device())
    _gradient_domain(case, values)
    n_q, n_k = values["q"].shape[-2], values["k"].shape[-2]
    empty = torch.from_numpy(~ref.visible_pairs(n_q, n_k, True, window_of(case)).any(axis=-1))
    outs, grads = _with_grads(case, impl, values)
    rows = empty.to(outs["o"].device)
    what = f"rows {torch.nonzero(empty).flatten().tolist()[:8]}... see no key"
    part = outs["o"][..., rows, :]
    assert_identical("o", torch.zeros_like(part), part, f"{what}: o is not 0 there")
    if _lse_returned(impl):
        part = outs["lse"][..., rows]
        assert_identical("lse", torch.full_like(part, float("-inf")), part, f"{what}: lse is not -inf there")
    for name, g in grads.items():
        bad = ~torch.isfinite(g)
        if bad.any():
            raise AssertionError(f"{what}: {name} has {int(bad.sum())} non-finite elements of {g.numel()}, "
                                 f"first at {torch.nonzero(bad)[0].tolist()}")
    part = grads["dq"][..., rows, :]
    assert_identical("dq", torch.zeros_like(part), part, f"{what}: their dq is not 0")


def window_outside_keys_ignored(case: Case, impl: Implementation) -> None:
    """With a window: row i's o and lse are bitwise unchanged when every key outside its
    band is changed, its k to NaN, +inf, -inf or fresh values (a masked score is never
    used, whatever the product gave), its v to fresh finite values. Not v to inf or NaN:
    a FlashAttention multiplies a block's P, 0 at the masked keys, by the block's whole V,
    and 0 * inf = NaN; the contract does not promise to mask V."""
    values, outs = run(case, impl)
    n_q, n_k = values["q"].shape[-2], values["k"].shape[-2]
    i = case.tensors["k"].seed % n_q
    outside = torch.from_numpy(~ref.visible_pairs(n_q, n_k, case.params["causal"], window_of(case))[i])
    fill = (float("nan"), float("inf"), float("-inf"), None)[case.tensors["v"].seed % 4]
    changed = dict(values)
    for name in ("k", "v"):
        old = values[name].detach()
        fresh = _fresh(case.tensors[name], old.device)
        if fill is not None and name == "k":
            fresh = torch.full_like(fresh, fill)
        # torch.where, not a boolean-index assignment: under deterministic algorithms (on
        # while a check runs, tritoncheck/poisoning.py) CUDA's index_put_ wrote the fresh
        # rows to the wrong keys on an H100 (torch 2.11), and the check blamed the kernel
        changed[name] = _relayout(case.tensors[name], torch.where(outside.to(old.device)[:, None], fresh, old))
    _, outs2 = run(case, impl, changed)
    what = (f"row {i}: changing the {int(outside.sum())} keys outside its band (window {window_of(case)}, "
            f"k to {'fresh values' if fill is None else fill}) changed its output")
    assert_identical("o", outs["o"][..., i, :], outs2["o"][..., i, :], what)
    if _lse_returned(impl):
        assert_identical("lse", outs["lse"][..., i], outs2["lse"][..., i], what)


def window_equivalences(case: Case, impl: Implementation) -> None:
    """window=(-1, -1) passed explicitly equals the call without a window, and window =
    (Nk, 0) equals causal=True (a band reaching every earlier key, none later): o and lse
    within twice the derived allowance (each is within it of the same exact value)."""
    values, outs = run(case, impl)
    n_k = values["k"].shape[-2]
    explicit = dataclasses.replace(case, args=ARGS + ("window",), params={**case.params, "window": NO_WINDOW})
    _, outs_explicit = run(explicit, impl, {**values, "window": NO_WINDOW})
    causal = with_params(case, causal=True, window=NO_WINDOW)
    _, outs_causal = run(causal, impl, {**values, "causal": True, "window": NO_WINDOW})
    band = with_params(case, causal=False, window=(n_k, 0))
    _, outs_band = run(band, impl, {**values, "causal": False, "window": (n_k, 0)})
    dtype = getattr(torch, case.dtype)
    _, a_o, a_lse = _allowed(case, impl, values)
    assert_close("o", outs_explicit["o"], to_numpy(outs["o"]), 2 * a_o, dtype=dtype, record=False,
                 what="window=(-1, -1) != no window")
    if _lse_returned(impl):
        assert_close("lse", outs_explicit["lse"], to_numpy(outs["lse"]), 2 * a_lse, dtype=torch.float32, record=False,
                     what="window=(-1, -1) != no window")
    _, a_o, a_lse = _allowed(causal, impl, {**values, "causal": True, "window": NO_WINDOW})
    what = f"window=({n_k}, 0) != causal=True"
    assert_close("o", outs_band["o"], to_numpy(outs_causal["o"]), 2 * a_o, dtype=dtype, record=False, what=what)
    if _lse_returned(impl):
        assert_close("lse", outs_band["lse"], to_numpy(outs_causal["lse"]), 2 * a_lse, dtype=torch.float32,
                     record=False, what=what)


def _two_calls_agree(name: str, got, other, a_got, a_other, exact_got, exact_other, dtype, what: str) -> None:
    """Two implementation outputs that compute exact values ``exact_got`` and ``exact_other``
    (fp64) agree within both allowances plus the exact values' own difference."""
    with np.errstate(invalid="ignore"):
        gap = np.where(np.isfinite(exact_got) & np.isfinite(exact_other), np.abs(exact_got - exact_other), 0.0)
    assert_close(name, got, to_numpy(other), a_got + a_other + gap, dtype=dtype, record=False, what=what)


def _power_of_two_slopes(slopes: torch.Tensor) -> torch.Tensor:
    """The drawn slopes moved to signed powers of two in [2^-8, 2^-1] (ALiBi's own are
    2^-8/H .. 2^-8): slope * j and its quotient by a power-of-two scale are then exact in
    every dtype for j < 256 (bf16's 8 bits)."""
    e = torch.clamp(torch.round(torch.log2(slopes.abs().clamp_min(2.0 ** -8))), -8, -1)
    return torch.where(slopes < 0, -1.0, 1.0) * torch.exp2(e)


def alibi_shift_invariant(case: Case, impl: Implementation) -> None:
    """Causal ALiBi adds -slope |i + Nk - Nq - j| = slope j - slope (i + Nk - Nq) to the
    scores of the keys row i sees (j <= i + Nk - Nq): a per-row constant apart, the
    explicit bias slope j, which plain causal attention gets as one more dimension (q_i
    gets 1, k_j gets slope j / sm_scale, v_j gets 0; k, v repeated per query head). Softmax ignores
    the constant: o equals that call's o, lse its lse minus slope (i + Nk - Nq). Slopes
    are moved to powers of two and sm_scale is 0.5 or 2, so the extra column is exact
    for j < 256; within both calls' allowances plus their fp64 references' difference."""
    values = case.materialise(backend.device())
    values["alibi_slopes"] = _power_of_two_slopes(values["alibi_slopes"])
    _, outs = run(case, impl, values)
    q, k, v = values["q"], values["k"], values["v"]
    b, h, n_q, d = q.shape
    n_k, scale = k.shape[-2], _scale_of(case)
    slopes = values["alibi_slopes"].detach().to("cpu", torch.float64).broadcast_to((b, h))  # host: the column and shift
    column = (slopes[..., None] * torch.arange(n_k, dtype=torch.float64) / scale).to(q.dtype).to(q.device)
    aug = {**values,
           "q": torch.cat([q, torch.ones(b, h, n_q, 1, dtype=q.dtype, device=q.device)], dim=-1),
           "k": torch.cat([ref.repeat_kv(k, h), column[..., None]], dim=-1),
           # v padded with a zero column to the same head dim (the kernel's contract): o's extra column is 0
           "v": torch.cat([ref.repeat_kv(v, h), torch.zeros(b, h, n_k, 1, dtype=v.dtype, device=v.device)], dim=-1)}
    plain = _without_alibi(case)
    # sm_scale as given (the extra dimension must not change the default 1 / sqrt(D))
    plain = with_params(plain, sm_scale=scale)
    aug_values = _values_for(plain, aug)
    _, outs2 = run(plain, impl, {**aug_values, "sm_scale": scale})
    exact, a_o, a_lse = _allowed(case, impl, values)
    exact2, a_o2, a_lse2 = _allowed(plain, impl, {**aug_values, "sm_scale": scale})
    shift = (slopes[..., None] * (torch.arange(n_q, dtype=torch.float64) + (n_k - n_q))).numpy()
    dtype = getattr(torch, case.dtype)
    what = "causal ALiBi != plain causal attention with the bias slope * j as an extra dimension"
    _two_calls_agree("o", outs["o"], outs2["o"][..., :d], a_o, a_o2[..., :d], exact["o"], exact2["o"][..., :d], dtype,
                     what)
    if _lse_returned(impl):
        lse2 = to_numpy(outs2["lse"]) - shift
        fp64 = 4 * tolerance.unit_roundoff(torch.float64) * (np.abs(to_numpy(outs2["lse"])) + np.abs(shift))
        _two_calls_agree("lse", outs["lse"], lse2, a_lse, a_lse2 + fp64, exact["lse"], exact2["lse"] - shift,
                         torch.float32, f"{what} (lse less slope (i + Nk - Nq))")


def alibi_zero_slopes_plain(case: Case, impl: Implementation) -> None:
    """ALiBi slopes of 0 equal no ALiBi: o and lse within both calls' allowances (the same
    exact values)."""
    values = case.materialise(backend.device())
    values["alibi_slopes"] = torch.zeros_like(values["alibi_slopes"])
    _, outs = run(case, impl, values)
    plain = _without_alibi(case)
    plain_values = _values_for(plain, values)
    _, outs2 = run(plain, impl, plain_values)
    exact, a_o, a_lse = _allowed(case, impl, values)
    exact2, a_o2, a_lse2 = _allowed(plain, impl, plain_values)
    dtype = getattr(torch, case.dtype)
    _two_calls_agree("o", outs["o"], outs2["o"], a_o, a_o2, exact["o"], exact2["o"], dtype, "ALiBi slopes 0 != no ALiBi")
    if _lse_returned(impl):
        _two_calls_agree("lse", outs["lse"], outs2["lse"], a_lse, a_lse2, exact["lse"], exact2["lse"], torch.float32,
                         "ALiBi slopes 0 != no ALiBi")


def softcap_large_cap_plain(case: Case, impl: Implementation) -> None:
    """A softcap far above every score, c = a power of two >= 64 max |s| (capped at 2^120),
    equals no softcap: c tanh(s / c) = s (1 - (s / c)^2 / 3 + ...) moves a score by
    |s|^3 / (3 c^2) <= |s| / 12288. Within both calls' allowances (the capped one's carries
    tanh's rounding, (2 EXP_ULPS + 7) u c) plus their fp64 references' difference."""
    values = case.materialise(backend.device())
    q, k = values["q"].to(torch.float64), ref.repeat_kv(values["k"].to(torch.float64), values["q"].shape[1])
    top = float((q @ k.transpose(-1, -2)).abs().amax()) * _scale_of(case)
    cap = 2.0 ** min(120, max(0, math.ceil(math.log2(max(64 * top, 1.0)))))
    capped = with_params(case, softcap=cap)
    capped_values = _values_for(capped, {**values, "softcap": cap})
    _, outs = run(capped, impl, capped_values)
    _, outs2 = run(case, impl, values)
    exact, a_o, a_lse = _allowed(capped, impl, capped_values)
    exact2, a_o2, a_lse2 = _allowed(case, impl, values)
    what = f"softcap {cap:g} (>= 64 max |s| = {64 * top:.3g}) != no softcap"
    _two_calls_agree("o", outs["o"], outs2["o"], a_o, a_o2, exact["o"], exact2["o"], getattr(torch, case.dtype), what)
    if _lse_returned(impl):
        _two_calls_agree("lse", outs["lse"], outs2["lse"], a_lse, a_lse2, exact["lse"], exact2["lse"], torch.float32, what)


def _output_shapes(case: Case) -> dict:
    b, h, n_q, d = case.tensors["q"].shape
    return {"o": (b, h, n_q, d), "lse": (b, h, n_q)}


_checks = tuple(dataclasses.replace(c, run=gradients_match_reference) if c.name == "gradients_match_reference"
                else c for c in generic_checks(grad=True))


def _attention_baseline(case, values, outs):
    """Plain attention in the input dtype (tritoncheck.controls.attention's masks: GQA, bottom-right
    causal, window, softcap, ALiBi); lse from the same scores, in the dtype."""
    from tritoncheck.controls.attention import _grouped, _masked_scores, _scale, _visible
    args = {**values, **case.kwargs}
    q, k, v = args["q"], args["k"], args["v"]
    causal, window = args.get("causal", False), tuple(args.get("window", (-1, -1)))
    scale = _scale(args.get("sm_scale"), q.shape[-1])
    keep = _visible(q.shape[-2], k.shape[-2], causal, window, q.device)
    s = _masked_scores(q, k, keep, scale, q.dtype, args.get("softcap", 0.0), args.get("alibi_slopes"))
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)  # a row without a key: o = 0
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    o = p @ _grouped(v, q.shape[1])
    return o, torch.logsumexp(s, dim=-1).float()  # lse is float32 by the contract; computed in the dtype


def _valid_attention_call(dims, device):
    b, h, n, m, d = (dims[k] for k in ("b", "h", "n", "m", "d"))
    return {"q": randn((b, h, n, d), device), "k": randn((b, h, m, d), device), "v": randn((b, h, m, d), device),
            "causal": False, "sm_scale": None, "window": (-1, -1), "alibi_slopes": randn((b, h), device),
            "softcap": 0.0, "dropout_p": 0.25, "seed": 7, "return_keep": False}


_ATTENTION_SPOILERS = (
    tensor_spoilers("q", fixed_rank=True) + tensor_spoilers("k", fixed_rank=True) + tensor_spoilers("v", fixed_rank=True)
    + (Spoiler("k", "a head dim other than q's", lambda a: widen_last(a["k"])),
       Spoiler("v", "another key count than k", lambda a: torch.cat([a["v"], a["v"][:, :, :1]], dim=2)),
       Spoiler("k", "another batch than q", lambda a: torch.cat([a["k"], a["k"]], dim=0)),
       Spoiler("v", "float16 while q is float32", lambda a: a["v"].half()),
       Spoiler("k", "a head count that does not divide q's", lambda a: torch.cat([a["k"], a["k"][:, :1]], dim=1)),
       Spoiler("v", "another head count than k", lambda a: torch.cat([a["v"], a["v"][:, :1]], dim=1)))
    + scalar_spoilers("sm_scale", (0.0, -0.5, math.nan, math.inf, "auto"))
    + scalar_spoilers("causal", ("yes",))
    + scalar_spoilers("window", (4, (2.0, 0), (-2, 0), (1, 2, 3), "wide"))
    + (Spoiler("alibi_slopes", "a list instead of a tensor", lambda a: a["alibi_slopes"].tolist()),
       Spoiler("alibi_slopes", "float16", lambda a: a["alibi_slopes"].half()),
       Spoiler("alibi_slopes", "one head more than q", lambda a: widen_last(a["alibi_slopes"])),
       Spoiler("alibi_slopes", "on another device", lambda a: torch.empty_like(a["alibi_slopes"], device=OTHER_DEVICE)))
    + scalar_spoilers("softcap", (-1.0, math.nan, math.inf, "30"))
    + scalar_spoilers("dropout_p", (-0.1, 1.0, 1.5, math.nan, math.inf, "half", True, None))
    + scalar_spoilers("seed", (1.5, "seven", None, -1, 2**63, True))
    + scalar_spoilers("return_keep", ("yes", 1, None)))


register(OpSpec(
    name="attention",
    backend_limits=(BF16_DOT_ON_INTERPRETER,),
    declarations=(BF16_DOT_UPCAST,),
    signature="attention(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0, "
              "dropout_p=0.0, seed=0, return_keep=False) -> (o, lse)",
    meaning="`q [B, H, Nq, D]`, `k`, `v` `[B, Hkv, Nk, D]` with `H % Hkv == 0`: query head `h` reads KV head "
            "`h // (H / Hkv)` (GQA; MQA is `Hkv = 1`); `sm_scale` defaults to `1/sqrt(D)`; "
            "`o = softmax(q k^T * sm_scale [+ masks]) v`; `lse [B, H, Nq]` float32 is the natural-log "
            "logsumexp of the scaled, masked scores of each row. Masks align to the bottom right "
            "(flash-attention >= 2.1): causal keeps `j <= i + Nk - Nq`; `window = (left, right)` keeps "
            "`i + Nk - Nq - left <= j <= i + Nk - Nq + right`, `-1` unbounded on that side; both may be given. "
            "Scores: `s = sm_scale q_i . k_j`; `softcap > 0`: `s = softcap tanh(s / softcap)`; `alibi_slopes` "
            "(float32 `[H]` or `[B, H]`, not differentiated): `s -= slope |i + Nk - Nq - j|`. "
            "A row that sees no key returns `o = 0`, `lse = -inf` and zero gradients. "
            "`dropout_p` in [0, 1): P's entries are dropped after the softmax by a counter-based RNG seeded by "
            "`seed` (an int in [0, 2**63)), kept ones scaled by `1 / (1 - dropout_p)`: "
            "`o = (P * keep / (1 - dropout_p)) v`; `lse` is dropout-free; the same seed gives the same mask; "
            "`dropout_p = 0` equals no dropout bit for bit; `return_keep=True` also returns the bool keep mask "
            "`[B, H, Nq, Nk]` (`(o, lse, keep)`; entries outside the band are unspecified), and the backward uses "
            "the forward's mask. The arguments after `sm_scale` are passed (by keyword where the signature takes "
            "them) only up to the last one that is not its default; an implementation whose signature takes no "
            "`dropout_p` and `seed` skips the dropout checks (not applicable, with the reason), one without "
            "`window`, `alibi_slopes` or `softcap` the checks of that variant; one without `return_keep` has its "
            "mask read off its training call (q = 0, one-hot v) by the checks that need it.",
    scalars=("causal", "sm_scale", "window", "softcap", "dropout_p", "seed", "return_keep"),
    dims={"B": ("q", 0), "H": ("q", 1), "Hkv": ("k", 1), "Nq": ("q", 2), "Nk": ("k", 2), "D": ("q", 3)},
    choices={"causal": (False, True), "sm_scale": SM_SCALES, "window": WINDOWS, "softcap": SOFTCAPS,
             "dropout_p": DROPOUT_PS},
    arguments=("q", "k", "v", "causal", "sm_scale", "window", "alibi_slopes", "softcap", "dropout_p", "seed",
               "return_keep"),
    outputs=("o", "lse"),
    kernel="tritoncheck.kernels.attention:attention",
    controls=("tritoncheck.controls.attention:sdpa", "tritoncheck.controls.attention:naive_torch"),
    baseline=_attention_baseline,
    large_problem=LargeProblem(heads(2048, 128), "heads", ("q", "k", "v")),
    bad_input=BadInput(_valid_attention_call, _ATTENTION_SPOILERS),
    reference=ref.attention,
    torch_reference=ref.attention_torch,
    cases=attention_cases,
    tolerance=attention_tolerance,
    grad_tolerance=attention_grad_tolerance,
    grad_inputs=("q", "k", "v"),
    grad_outputs=("o",),
    output_shapes=_output_shapes,
    output_dtypes={"lse": torch.float32},
    layouts={"bhnd": {}, "bnhd": {"q": (0, 2, 1, 3), "k": (0, 2, 1, 3), "v": (0, 2, 1, 3), "o": (0, 2, 1, 3)}},
    checks=_checks + (
        Check("causal_mask_respected", causal_mask_respected, cases=_cases(causal=True, min_n=2)),
        Check("causal_gradient_respected", causal_gradient_respected, cases=_upstream(causal=True, min_n=2), requires=lambda impl: None if impl.supports_backward
              else f"{impl.name} declares supports_backward = False"),
        Check("online_lse_matches_full", online_lse_matches_full, cases=_key_block_cases(), needs_outputs=("lse",)),
        Check("split_kv_merge", split_kv_merge, cases=_key_block_cases(), needs_outputs=("lse",)),
        Check("key_permutation_invariant", key_permutation_invariant,
              cases=_cases(causal=False, min_n=2, windows=(NO_WINDOW,), alibi=False)),
        Check("batch_heads_independent", batch_heads_independent, cases=_cases(min_bh=2)),
        Check("uniform_values_preserved", uniform_values_preserved),
        Check("gqa_equals_repeated_kv", gqa_equals_repeated_kv, cases=_upstream(gqa=True),
              requires=lambda impl: None if impl.supports_backward
              else f"{impl.name} declares supports_backward = False"),
        Check("bottom_right_causal_is_last_rows", bottom_right_causal_is_last_rows,
              cases=_cases(causal=True, shape="wide")),
        Check("empty_rows_zero", empty_rows_zero, cases=_upstream(causal=True, shape="tall"),
              requires=lambda impl: None if impl.supports_backward
              else f"{impl.name} declares supports_backward = False"),
        Check("window_outside_keys_ignored", window_outside_keys_ignored, cases=_cases(windows=WINDOWS[1:])),
        Check("alibi_shift_invariant", alibi_shift_invariant,
              cases=_cases(causal=True, alibi=True, softcaps=(0.0,), max_d=80, sm_scales=(0.5, 2.0))),
        Check("alibi_zero_slopes_plain", alibi_zero_slopes_plain, cases=_cases(alibi=True)),
        Check("softcap_large_cap_plain", softcap_large_cap_plain, cases=_cases(softcaps=(0.0,)),
              needs_arguments=("softcap",)),
        Check("window_equivalences", window_equivalences,
              cases=_cases(causal=False, windows=(NO_WINDOW,), alibi=False, softcaps=(0.0,)),
              needs_arguments=("causal", "window")),
    ) + _dropout.CHECKS,
))
