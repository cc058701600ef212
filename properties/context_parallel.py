"""cp_attention: attention with the sequence split across the ranks of a process group, checked
against the single-device fp64 reference.

Contract (``kernels/context_parallel.py`` is the project's implementation):

    cp_attention(q_local, k_local, v_local, causal=False, sm_scale=None, group=None) -> (o_local, lse_local)

Each of the W ranks of ``group`` (None: the default group) holds one contiguous chunk of
the sequence, chunks in rank order: rank r has rows [start_r, start_r + n_r) of q, k and
v, each ``[B, H, n_r, D]``, n_r >= 1 (chunks may differ in length). It returns rank r's
rows of ``attention(q, k, v, causal, sm_scale)`` over the whole sequence: o
``[B, H, n_r, D]`` in the input dtype and lse ``[B, H, n_r]`` in float32. Causal masks
by global position (key start_s + j is visible to query start_r + i iff
start_s + j <= start_r + i).

The check launches W processes (``tritoncheck/rank_pool.py``: gloo on CPU, NCCL on GPUs,
rank r on GPU r), draws cases (attention's strategy with Nq == Nk, causal or not, the
sequence split evenly or at drawn cut points), hands each rank its chunks, runs the
implementation on every rank, gathers o and lse, and compares them with
``tritoncheck.references.attention.attention`` on the whole sequence (``matches_reference``), and that
causal rows do not change, bit for bit, when later keys and values do
(``causal_rows_unchanged``).

Tolerance: an implementation computes each rank's rows either in one pass over all keys
(all-gather, then one attention call: within ``rules.attention`` of the whole problem)
or as blocks of its queries against each rank's keys merged by log-sum-exp (ring
attention: within :func:`merged_allowance`, which carries each block's
``rules.attention`` allowance through the merge); either is correct, so the allowance
is the larger of the two, element by element.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import strategies as st

from tritoncheck import backend, generic, parity, rank_pool
from tritoncheck.backend import BF16_DOT_ON_INTERPRETER
from tritoncheck.config import CONFIG
from tritoncheck.declarations import BF16_DOT_UPCAST
from tritoncheck.generic import rule_name
from tritoncheck.oracle import assert_identical
from tritoncheck.phases import timed
from tritoncheck.properties import attention_tolerance as rules
from tritoncheck.properties.attention import NO_WINDOW, attention_cases
from tritoncheck.references import attention as ref
from tritoncheck.registry import OPS, Check, Implementation, NotApplicable, OpSpec, register
from tritoncheck.strategies import FLOAT_DTYPES, Case
from tritoncheck.tolerance import EXP_ULPS, SAFETY, U32, Precision

OP = "cp_attention"
KERNEL = "tritoncheck.kernels.context_parallel:cp_attention"
DTYPES = FLOAT_DTYPES  # attention's
CONTROLS = ("tritoncheck.controls.context_parallel:all_gather_torch",)
# ------------------------------------------------------------------------------- cases

def even_chunks(n: int, world: int) -> tuple[int, ...]:
    """n rows over ``world`` ranks as evenly as possible (the first n % world get one more)."""
    return tuple(n // world + (r < n % world) for r in range(world))


# The contract's arguments, less group (left at its default: the rank pool's group). A
# case's q_local, k_local, v_local are the whole sequence, each rank's chunk cut from it.
ARGS = ("q_local", "k_local", "v_local", "causal", "sm_scale")


@st.composite
def cp_cases(draw, dtype: torch.dtype, world: int, causal: bool | None = None, min_n: int = 1) -> Case:
    """An attention case with Nq == Nk >= max(world, min_n) (one sequence, q, k and v split
    alike), causal or not (None: drawn), and the rows per rank (``params["chunks"]``): the
    even split (first, so failures shrink to it) or cut at drawn points (each rank at least
    one row)."""
    # the contract's plain attention (one sequence, H = Hkv, no window, ALiBi or softcap):
    # cp_attention takes none of attention's variants
    # Scores up to 1 / (8 u(dtype)): the rules allow a plain implementation its scores in the
    # input dtype (attention_tolerance.attention_score_error: 2 u(dtype) |s| of exponent),
    # so at |s| ~ 1 / u the blocks' merge weights e^{lse_j - lse} are unconstrained and the
    # comparison is vacuous (on an H100, 14 of 50 bfloat16 examples with |k| ~ 1000, past
    # the quarter a test may have). The ring's bugs (block order, rescale, masks in global
    # positions) show at any score scale; large scores stay attention's own to check.
    case = draw(attention_cases(dtype, causal=True, min_n=max(world, min_n), gqa=False, shape="square",
                                windows=(NO_WINDOW,), alibi=False, softcaps=(0.0,),
                                score_cap=1.0 / (8 * torch.finfo(dtype).eps / 2)))
    causal = draw(st.booleans()) if causal is None else causal
    n = case.tensors["q"].shape[2]
    chunks = even_chunks(n, world)
    if world > 1:
        cuts = st.lists(st.integers(1, n - 1), min_size=world - 1, max_size=world - 1, unique=True).map(sorted)
        chunks = draw(st.one_of(st.just(chunks), cuts.map(lambda c: tuple(b - a for a, b in zip([0] + c, c + [n])))))
    return Case(OP, case.dtype, ARGS, {f"{name}_local": case.tensors[name] for name in ("q", "k", "v")},
                {"causal": causal, "sm_scale": case.params["sm_scale"], "chunks": chunks})


# --------------------------------------------------------------------------- tolerance

def _scale(case: Case) -> float:
    d = case.tensors["q_local"].shape[-1]
    return 1.0 / math.sqrt(d) if case.params["sm_scale"] is None else float(case.params["sm_scale"])


def _starts(chunks) -> list[int]:
    return [sum(chunks[:r]) for r in range(len(chunks))]


def merged_allowance(q, k, v, o, lse, chunks, causal: bool, scale: float, p: Precision):
    """Allowed |error| of (o, lse) (fp64 arrays, whole sequence) for an implementation that
    merges, for each rank's queries, blocks over each rank's keys by log-sum-exp in fp32:
    lse' = logaddexp(lse_acc, lse_b) = max + log1p(e^{-|lse_acc - lse_b|}), and the two sides
    weighted by e^{lse_acc - lse'} and e^{lse_b - lse'}.

    Block j of a row (keys of one rank; causal: earlier ranks' whole chunks and its own
    diagonal chunk) has exact (o_j, lse_j), computed within a_o_j, a_lse_j
    (``rules.attention`` for that block alone). The exact merge is lse = LSE_j lse_j and
    o = sum_j w_j o_j, w_j = e^{lse_j - lse} (formed from the scores: _block_log_weights).
    - lse: LSE is monotone and shifts with its arguments, so errors d_j in the lse_j move
      it by at most L = max_j a_lse_j (exact, not first order).
    - the merge's own rounding, per step: the sum max + t (t = log1p(...) in [0, ln 2])
      rounds to within min(u32 |lse'|, t) of max + t (max itself is a candidate), at most
      min(u32 m, ln 2) with m = max(|lse|, |lse_j|) bounding every partial lse; t's exp and
      log1p add 2 EXP_ULPS u32 (t <= ln 2 < 1) and |lse_acc - lse_b|'s rounding moves t by
      at most u32 (d/dx log1p(e^{-x}) <= 1, and x e^{-x} < 1). An error in lse' scales both
      weights of the step alike. Over W steps, with SAFETY:
      M = SAFETY W (min(u32 m, ln 2) + u32 (1 + 2 EXP_ULPS)).
      The exponent lse_x - lse' of the smaller side, of size x, rounds by u32 x; its weight
      e^{-x} moves by at most u32 x e^{-x} < u32: an absolute SAFETY W u32 per weight.
    - weights: the computed w'_j is within w_j e^{+-E_j}, E_j = a_lse_j + L + 2 M, plus the
      absolute part; and w'_j <= 1 whatever the errors (a product of per-step weights, each
      e^{x - lse'} with lse' >= x: a rounded max + t, t >= 0, is never below max).
    - o: o' - o = sum_j w'_j e_j + sum_j (w'_j - w_j)(o_j - o) + o (sum_j w'_j - 1), with
      |e_j| <= a_o_j, w'_j <= min(1, w_j e^{E_j}), |w'_j - w_j| <= min(1, w_j expm1(E_j) +
      SAFETY W u32), |sum_j w'_j - 1| <= expm1(2 M) + SAFETY W^2 u32 (the w'_j are
      e^{lse'_j - LSE(lse'_j)}, which sum to 1, up to the merge's rounding); the fp32
      products and sums of the merge, 3 roundings a step, SAFETY 3 W u32 sum_j w'_j |o_j|;
      the final store in the input dtype, p.store |o| + p.floor. All of it is capped by
      |o' - o| <= sum_j w'_j |o'_j| + |o| <= W max_j (|o_j| + a_o_j) + |o|.
    Where the blocks' lse tie at scores near the dtype's range (constant keys at 1e37:
    every lse_j is the same fp32 number, their ulp 1e30) the weights are lost and so is
    o; the allowance says so (the cap), and the one-pass rule may still hold it. The third
    array marks the elements of o where the cap is the allowance: not checkable by the
    merge's decomposition (docs/vacuity.md), reported apart from the vacuous ones.
    """
    starts = _starts(chunks)
    world = len(chunks)
    a_o = np.zeros_like(o)
    a_lse = np.zeros_like(lse)
    lost = np.zeros(o.shape, dtype=bool)
    for r, (qa, nq) in enumerate(zip(starts, chunks)):
        rows = slice(qa, qa + nq)
        blocks = []
        for s, (ka, nk) in enumerate(zip(starts, chunks)):
            if causal and s > r:
                continue  # keys after every query of rank r: no weight
            diag = causal and s == r
            qb, kb, vb = q[..., rows, :], k[..., ka:ka + nk, :], v[..., ka:ka + nk, :]
            o_j, lse_j = ref.attention(qb, kb, vb, diag, scale)
            a_o_j, a_lse_j = rules.attention(qb, kb, vb, o_j, lse_j, diag, scale, p)
            blocks.append((o_j, lse_j, a_o_j, a_lse_j))
        o_r, lse_r = o[..., rows, :], lse[..., rows]
        log_ws = _block_log_weights(q[..., rows, :], k, qa, chunks, r, causal, scale)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            big_l = np.max([b[3] for b in blocks], axis=0)
            m = np.maximum(np.abs(lse_r), np.max([np.abs(b[1]) for b in blocks], axis=0))
            big_m = SAFETY * world * (np.minimum(U32 * m, math.log(2)) + U32 * (1 + 2 * EXP_ULPS))
            w_abs = SAFETY * world * U32  # the smaller side's exponent rounding, per weight
            sum_dev = np.expm1(np.minimum(2 * big_m, 300.0))[..., None] + world * w_abs
            o_err = np.abs(o_r) * sum_dev
            abs_sum = np.zeros_like(o_r)
            reach = np.zeros_like(o_r)  # max_j |o_j| + a_o_j
            for (o_j, _lse_j, a_o_j, a_lse_j), log_w in zip(blocks, log_ws):
                log_w = log_w[..., None]
                w = np.exp(log_w)
                # w e^{E} in the log domain: w may underflow where e^{E} overflows
                w_up = np.minimum(np.exp(np.minimum(log_w + (a_lse_j + big_l + 2 * big_m)[..., None], 300.0)), 1.0)
                dw = np.minimum(w_up - w + w_abs, 1.0)
                o_err = o_err + w_up * a_o_j + dw * np.abs(o_j - o_r)
                abs_sum = abs_sum + w_up * np.abs(o_j)
                reach = np.maximum(reach, np.abs(o_j) + a_o_j)
            rounding = SAFETY * 3 * world * U32 * abs_sum + p.store * np.abs(o_r) + p.floor
            cap = world * reach + np.abs(o_r)
            lost[..., rows, :] = ~(o_err < cap)
            o_err = np.minimum(o_err, cap) + rounding
        a_o[..., rows, :] = o_err
        a_lse[..., rows] = big_l + big_m
    return a_o, a_lse, lost


def _block_log_weights(q_rows, k, q_start: int, chunks, rank: int, causal: bool, scale: float) -> list:
    """log w_j, each visible block's share of the row's normaliser (the order of the blocks
    of :func:`merged_allowance`), from the scores: log sum_{keys of j} e^{s - m_j} + m_j - m
    - log sum_{all keys} e^{s - m}. Not lse_j - lse: at scores of 1e16 and more fp64's lse
    loses the log of the key counts (an ulp of 2e17 is 32), and constant keys gave every
    block weight 1 instead of its share."""
    s = (q_rows @ np.swapaxes(k, -1, -2)) * scale
    if causal:
        pos = np.arange(q_start, q_start + q_rows.shape[-2])
        s = np.where(np.arange(k.shape[-2])[None, :] > pos[:, None], -np.inf, s)
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        m = np.max(s, axis=-1)
        log_total = np.log(np.sum(np.exp(s - m[..., None]), axis=-1))
        out = []
        for r_s, (ka, nk) in enumerate(zip(_starts(chunks), chunks)):
            if causal and r_s > rank:
                continue
            part = s[..., ka:ka + nk]
            m_j = np.max(part, axis=-1)
            log_part = np.log(np.sum(np.exp(part - m_j[..., None]), axis=-1))
            out.append(np.minimum(log_part + (m_j - m) - log_total, 0.0))  # a share: <= 1
    return out


def _tolerance(case: Case, inputs64, expected, p: Precision) -> dict[str, np.ndarray]:
    """The larger of the one-pass rule (``rules.attention`` of the whole problem) and the
    merged-blocks rule (:func:`merged_allowance`), element by element: either way of
    computing a rank's rows is correct (module docstring)."""
    q, k, v = (inputs64[n] for n in ("q_local", "k_local", "v_local"))
    o, lse = expected["o_local"], expected["lse_local"]
    causal, scale = case.params["causal"], _scale(case)
    a_o, a_lse = rules.attention(q, k, v, o, lse, causal, scale, p)
    m_o, m_lse, _ = merged_allowance(q, k, v, o, lse, case.params["chunks"], causal, scale, p)
    return {"o_local": np.maximum(a_o, m_o), "lse_local": np.maximum(a_lse, m_lse)}


def _merge_lost(case: Case, inputs64, expected, p: Precision) -> dict[str, np.ndarray]:
    """The elements of o that no rule pins down: the merged-blocks rule's cap is its
    allowance (the blocks' weights are lost, docs/vacuity.md) and the one-pass rule does
    not hold o there either. Not checkable: reported apart, not judged vacuous. (The
    rules run a second time: :func:`_tolerance` returns allowances only.)"""
    q, k, v = (inputs64[n] for n in ("q_local", "k_local", "v_local"))
    o, lse = expected["o_local"], expected["lse_local"]
    causal, scale = case.params["causal"], _scale(case)
    a_o, _ = rules.attention(q, k, v, o, lse, causal, scale, p)
    m_o, _, lost = merged_allowance(q, k, v, o, lse, case.params["chunks"], causal, scale, p)
    return {"o_local": lost & (m_o >= a_o)}


# ------------------------------------------------------------------------------- check

def run_ranks(case: Case, impl: Implementation, values=None) -> tuple[dict, dict[str, torch.Tensor]]:
    """Run ``impl`` on ``CONFIG.world_size`` ranks, rank r on its chunk of q, k, v; gather o
    and lse (CPU tensors over the whole sequence), checking each rank's shapes and dtypes."""
    world = CONFIG.world_size
    values = values if values is not None else case.materialise("cpu")
    chunks = case.params["chunks"]
    if len(chunks) != world:
        raise ValueError(f"the case splits the sequence over {len(chunks)} ranks, the run has {world}")
    starts = _starts(chunks)
    kwargs = {"causal": case.params["causal"], "sm_scale": case.params["sm_scale"]}
    per_rank = [(tuple(values[n][..., a:a + c, :].contiguous() for n in ("q_local", "k_local", "v_local")),
                 kwargs) for a, c in zip(starts, chunks)]
    with timed("kernel"):
        outs = rank_pool.pool(world, backend.current()).call(impl.target, per_rank)
    dtype = getattr(torch, case.dtype)
    b, h, _, d = case.tensors["q_local"].shape
    for r, (out, c) in enumerate(zip(outs, chunks)):
        if len(out) != 2:
            raise AssertionError(f"rank {r} returned {len(out)} tensors, the contract says 2 (o_local, lse_local)")
        for name, t, shape, want in (("o_local", out[0], (b, h, c, d), dtype), ("lse_local", out[1], (b, h, c),
                                                                                  torch.float32)):
            if tuple(t.shape) != shape or t.dtype != want:
                raise AssertionError(f"rank {r}: {name} is {list(t.shape)} {t.dtype}, the contract says "
                                     f"{list(shape)} {want}")
    return values, {"o_local": torch.cat([o for o, _ in outs], dim=2),
                    "lse_local": torch.cat([lse for _, lse in outs], dim=2)}


def _split(case: Case) -> str:
    return f"sequence split {list(case.params['chunks'])} over {len(case.params['chunks'])} ranks"


def matches_reference(case: Case, impl: Implementation) -> None:
    """The gathered o and lse match the fp64 reference on the whole sequence, within the
    larger of the one-pass rule and the merged-blocks rule (module docstring)."""
    op = OPS[OP]
    values, outs = run_ranks(case, impl)
    with timed("reference"):
        expected, inputs64 = op.expected(case, values)
    with timed("allowance"):
        p = generic.precision(impl, case)
        allowed = op.tolerance(case, inputs64, expected, p)
        unconstrained = _merge_lost(case, inputs64, expected, p)
    with timed("torch baseline"):
        baseline = parity.baseline_errors(OP, getattr(torch, case.dtype), case, values, outs, expected)
    with timed("compare"):
        for name in op.outputs:
            parity.assert_close(name, outs[name], expected[name], allowed[name], baseline[name],
                                dtype=op.output_dtypes.get(name, getattr(torch, case.dtype)),
                                what=f"does not match the fp64 reference ({_split(case)})",
                                computed_in=getattr(torch, case.dtype), rule=rule_name(op.tolerance),
                                unconstrained=unconstrained.get(name))


def causal_rows_unchanged(case: Case, impl: Implementation) -> None:
    """Causal: giving the keys and values at positions j > i fresh values leaves rows 0..i of
    o and lse bitwise unchanged, whichever ranks hold them (a query sees no future key, on
    its own rank or a later one). Exact: a correct implementation never reads them, and
    no allowance can be vacuous here."""
    values, outs = run_ranks(case, impl)
    n = values["q_local"].shape[2]
    i = case.tensors["k_local"].seed % (n - 1)
    changed = dict(values)
    for name in ("k_local", "v_local"):
        spec = case.tensors[name]
        fresh = dataclasses.replace(spec, seed=(spec.seed + 1) % 2**32, injections=()).materialise("cpu")
        new = values[name].clone()
        new[..., i + 1:, :] = fresh[..., i + 1:, :]
        changed[name] = new
    _, outs2 = run_ranks(case, impl, changed)
    what = f"changing keys/values j > {i} changed causal output rows <= {i} ({_split(case)})"
    assert_identical("o_local", outs["o_local"][..., :i + 1, :], outs2["o_local"][..., :i + 1, :], what)
    assert_identical("lse_local", outs["lse_local"][..., :i + 1], outs2["lse_local"][..., :i + 1], what)


def _runnable_on_ranks(impl: Implementation) -> str | None:
    """Why ``impl`` cannot run on this run's ranks here, or None."""
    world = CONFIG.world_size
    if backend.current() == "cuda" and torch.cuda.device_count() < world:
        # NCCL refuses two ranks on one GPU
        return f"cuda: {world} NCCL ranks need {world} GPUs, this machine has {torch.cuda.device_count()}"
    if impl.target is None:
        return (f"{impl.name} has no importable module:function name: each rank imports the implementation "
                "by name (give it as --impl cp_attention=module:function)")
    return None


def _cases(dtype: torch.dtype, limits=None, **fixed) -> st.SearchStrategy[Case]:
    """The op's cases on this run's ranks. ``limits``: the record names no dims or choices,
    so a declaration can only be of layout and dtype, which ``Limits.fit`` applies to each
    drawn case (harness.Target.strategy)."""
    return cp_cases(dtype, CONFIG.world_size, **fixed)


def _baseline(case: Case, values, outs):
    """Plain attention in the input dtype over the whole sequence (attention's baseline)."""
    return OPS["attention"].baseline(case, {n: values[f"{n}_local"] for n in ("q", "k", "v")}, outs)


def _check(name: str, run, **fixed) -> Check:
    return Check(name, run, cases=(lambda op, dtype: _cases(dtype, **fixed)) if fixed else None,
                 requires=_runnable_on_ranks)


register(OpSpec(
    name=OP,
    backend_limits=(BF16_DOT_ON_INTERPRETER,),
    declarations=(BF16_DOT_UPCAST,),
    signature="cp_attention(q_local, k_local, v_local, causal=False, sm_scale=None) -> (o_local, lse_local)",
    arguments=ARGS,
    outputs=("o_local", "lse_local"),
    kernel=KERNEL,
    reference=ref.attention,
    torch_reference=ref.attention_torch,
    cases=_cases,
    tolerance=_tolerance,
    checks=(_check("matches_reference", matches_reference),
            _check("causal_rows_unchanged", causal_rows_unchanged, causal=True, min_n=2)),
    dtypes=DTYPES,
    output_dtypes={"lse_local": torch.float32},
    meaning="attention over a sequence split across the W ranks of a process group in rank order: rank r "
            "holds rows [start_r, start_r + n_r) of q, k, v ([B, H, n_r, D], n_r >= 1, chunks may differ) and "
            "returns its rows of attention(q, k, v, causal, sm_scale) over the whole sequence; causal by "
            "global position. A keyword group=None (the default process group) follows, left at its default",
    scalars=("causal", "sm_scale"),
    controls=CONTROLS,
    baseline=_baseline,
    large_problem=NotApplicable("past 2**31 elements each rank holds a chunk of its own: the large-index "
                                "problem is attention's (its kernel computes every block here)"),
    bad_input=NotApplicable("a valid call needs a process group, which the in-process bad-input test has not; "
                            "the wrapper checks its arguments before any collective "
                            "(tests/test_context_parallel.py::test_bad_input_names_the_argument)"),
    distributed=True,
))
