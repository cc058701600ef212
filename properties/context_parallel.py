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

import contextlib
import dataclasses
import math
import time
import zlib

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, assume, given, seed, settings
from hypothesis import strategies as st

from tritoncheck import backend, rank_pool, registry, tolerance
from tritoncheck.oracle import assert_close, assert_identical, recording
from tritoncheck.properties import attention_tolerance as rules
from tritoncheck.properties.attention import NO_WINDOW, attention_cases
from tritoncheck.references import attention as ref
from tritoncheck.strategies import FLOAT_DTYPES, Case
from tritoncheck.tolerance import EXP_ULPS, SAFETY, U32, Precision

OP = "cp_attention"
KERNEL = "tritoncheck.kernels.context_parallel:cp_attention"
DTYPES = FLOAT_DTYPES  # attention's
CONTROLS = ("tritoncheck.controls.context_parallel:all_gather_torch",)
DEFAULT_WORLD_SIZE = 2  # what CPU CI runs (two gloo processes); --cp-world-size to change
HUNT_EXAMPLES = 100  # a mutant must die within this many examples per dtype
HUNT_SEED = 20261124
CONTROL_EXAMPLES = 20  # plain PyTorch on 2 ranks: about 1 s per dtype


@dataclasses.dataclass
class Settings:
    world_size: int = DEFAULT_WORLD_SIZE
    user_targets: tuple[str, ...] = ()  # --impl cp_attention=module:function


SETTINGS = Settings()


def register_implementation(target: str) -> None:
    """Check ``module:function`` (``--impl cp_attention=...``) instead of the project's ring
    attention; it must import here (each rank imports it again by the same name)."""
    registry.resolve(target)  # a usage error now, not W tracebacks later
    SETTINGS.user_targets += (target,)


def implementations() -> list[tuple[str, str]]:
    """(name, target) of each implementation under test: the user's, else the project's."""
    targets = SETTINGS.user_targets or (KERNEL,)
    return [(t.rpartition(":")[2], t) for t in targets]


# ------------------------------------------------------------------------------- cases

def even_chunks(n: int, world: int) -> tuple[int, ...]:
    """n rows over ``world`` ranks as evenly as possible (the first n % world get one more)."""
    return tuple(n // world + (r < n % world) for r in range(world))


@st.composite
def cp_cases(draw, dtype: torch.dtype, world: int, equal_only: bool = False, causal: bool | None = None,
             min_n: int = 1) -> Case:
    """An attention case with Nq == Nk >= max(world, min_n) (one sequence, q, k and v split
    alike), causal or not (None: drawn), and the rows per rank: the even split (first, so
    failures shrink to it) or cut at drawn points (each rank at least one row);
    ``equal_only``: chunks of equal length (N a multiple of W; other draws are discarded)."""
    # the contract's plain attention (one sequence, H = Hkv, no window, ALiBi or softcap):
    # cp_attention takes none of attention's variants
    case = draw(attention_cases(dtype, causal=True, min_n=max(world, min_n), gqa=False, shape="square",
                                windows=(NO_WINDOW,), alibi=False, softcaps=(0.0,)))
    causal = draw(st.booleans()) if causal is None else causal
    n = case.tensors["q"].shape[2]
    chunks = even_chunks(n, world)
    assume(not equal_only or n % world == 0)
    if world > 1 and not equal_only:
        cuts = st.lists(st.integers(1, n - 1), min_size=world - 1, max_size=world - 1, unique=True).map(sorted)
        chunks = draw(st.one_of(st.just(chunks), cuts.map(lambda c: tuple(b - a for a, b in zip([0] + c, c + [n])))))
    return Case(OP, case.dtype, case.args, case.tensors,
                {**case.params, "causal": causal, "chunks": chunks})


# --------------------------------------------------------------------------- tolerance

def _scale(case: Case) -> float:
    d = case.tensors["q"].shape[-1]
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


def precision_of(fn, dtype: torch.dtype) -> Precision:
    declared = getattr(fn, "fp32_dot_precision", None)
    return tolerance.declared_dot(Precision.of(dtype, backend.current(), declared), declared)


# ------------------------------------------------------------------------------- check

def run_ranks(case: Case, target: str, world: int, values=None) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Run ``target`` on ``world`` ranks, rank r on its chunk of q, k, v; gather o and lse
    (CPU tensors over the whole sequence), checking each rank's shapes and dtypes."""
    values = values if values is not None else case.materialise("cpu")
    chunks = case.params["chunks"]
    starts = _starts(chunks)
    kwargs = {"causal": case.params["causal"], "sm_scale": case.params["sm_scale"]}
    per_rank = [(tuple(values[n][..., a:a + c, :].contiguous() for n in ("q", "k", "v")), kwargs)
                for a, c in zip(starts, chunks)]
    outs = rank_pool.pool(world, backend.current()).call(target, per_rank)
    dtype = getattr(torch, case.dtype)
    b, h, _, d = case.tensors["q"].shape
    for r, (out, c) in enumerate(zip(outs, chunks)):
        if len(out) != 2:
            raise AssertionError(f"rank {r} returned {len(out)} tensors, the contract says 2 (o_local, lse_local)")
        for name, t, shape, want in (("o_local", out[0], (b, h, c, d), dtype), ("lse_local", out[1], (b, h, c),
                                                                                  torch.float32)):
            if tuple(t.shape) != shape or t.dtype != want:
                raise AssertionError(f"rank {r}: {name} is {list(t.shape)} {t.dtype}, the contract says "
                                     f"{list(shape)} {want}")
    return values, torch.cat([o for o, _ in outs], dim=2), torch.cat([lse for _, lse in outs], dim=2)


def matches_reference(case: Case, target: str, world: int) -> None:
    """The gathered o and lse match the fp64 reference on the whole sequence, within the
    larger of the one-pass rule and the merged-blocks rule (module docstring)."""
    values, o, lse = run_ranks(case, target, world)
    q, k, v = (values[n].to(torch.float64).numpy() for n in ("q", "k", "v"))
    causal, scale = case.params["causal"], _scale(case)
    o_ref, lse_ref = ref.attention(q, k, v, causal, case.params["sm_scale"])
    p = precision_of(registry.resolve(target), getattr(torch, case.dtype))
    a_o, a_lse = rules.attention(q, k, v, o_ref, lse_ref, causal, scale, p)
    m_o, m_lse, lost = merged_allowance(q, k, v, o_ref, lse_ref, case.params["chunks"], causal, scale, p)
    what = f"does not match the fp64 reference (sequence split {list(case.params['chunks'])} over {world} ranks)"
    # where the merge's weights are lost and the one-pass rule does not hold o either, no
    # rule pins o down: not checkable (reported), not vacuous
    assert_close("o", o, o_ref, np.maximum(a_o, m_o), dtype=getattr(torch, case.dtype), what=what,
                 unconstrained=lost & (m_o >= a_o))
    assert_close("lse", lse, lse_ref, np.maximum(a_lse, m_lse), dtype=torch.float32, what=what)


def causal_rows_unchanged(case: Case, target: str, world: int) -> None:
    """Causal: giving the keys and values at positions j > i fresh values leaves rows 0..i of
    o and lse bitwise unchanged, whichever ranks hold them (a query sees no future key, on
    its own rank or a later one). Exact: a correct implementation never reads them, and
    no allowance can be vacuous here."""
    values, o, lse = run_ranks(case, target, world)
    n = values["q"].shape[2]
    i = case.tensors["k"].seed % (n - 1)
    changed = dict(values)
    for name in ("k", "v"):
        spec = case.tensors[name]
        fresh = dataclasses.replace(spec, seed=(spec.seed + 1) % 2**32, injections=()).materialise("cpu")
        new = values[name].clone()
        new[..., i + 1:, :] = fresh[..., i + 1:, :]
        changed[name] = new
    _, o2, lse2 = run_ranks(case, target, world, changed)
    what = (f"changing keys/values j > {i} changed causal output rows <= {i} (sequence split "
            f"{list(case.params['chunks'])} over {world} ranks)")
    assert_identical("o", o[..., :i + 1, :], o2[..., :i + 1, :], what)
    assert_identical("lse", lse[..., :i + 1], lse2[..., :i + 1], what)


# name -> (check, the cases it needs: cp_cases' keyword arguments)
CHECKS = {"matches_reference": (matches_reference, {}),
          "causal_rows_unchanged": (causal_rows_unchanged, {"causal": True, "min_n": 2})}


# ------------------------------------------------------------------------------ report

@dataclasses.dataclass(frozen=True)
class _Named:
    name: str
    target: str | None = None


@dataclasses.dataclass(frozen=True)
class ReportTarget:
    """What the tolerance report's collector (tritoncheck/report.py) reads of a
    ``harness.Target``, for a context-parallel check: its rows, example counts and
    timings go into the same report.json, under op ``cp_attention``."""

    impl: _Named
    dtype: torch.dtype
    check: _Named
    op: _Named = _Named(OP)

    @property
    def id(self) -> str:
        return f"{OP}-{self.impl.name}-{str(self.dtype).replace('torch.', '')}-{self.check.name}"


def report_target(target: str, dtype: torch.dtype, check: str) -> ReportTarget:
    return ReportTarget(_Named(target.rpartition(":")[2], target), dtype, _Named(check))


@contextlib.contextmanager
def reported(report_target_: ReportTarget, case: Case):
    """Record the comparisons made inside (and the example's time) for the tolerance report,
    when the run collects one (the plugin sets the collector)."""
    from tritoncheck import harness
    collector = harness.collector()
    sink = collector.sink(report_target_, case) if collector is not None else None
    start = time.perf_counter()
    try:
        with recording(sink) if sink is not None else contextlib.nullcontext():
            yield
    finally:
        if collector is not None:
            collector.count(report_target_, seconds=time.perf_counter() - start)


def vacuity_failure(report_target_: ReportTarget) -> str | None:
    """The suite's vacuity policy (``harness.vacuous_test``) for a context-parallel test."""
    from tritoncheck import harness
    return harness.vacuous_test(report_target_.id, "tritoncheck.properties.context_parallel.matches_reference")


def skip_reason(target: str, dtype: torch.dtype) -> str | None:
    """Why ``target`` cannot be checked in ``dtype`` on this backend (None: it can)."""
    world = SETTINGS.world_size
    if backend.current() == "cuda" and torch.cuda.device_count() < world:
        # NCCL refuses two ranks on one GPU
        return f"cuda: {world} NCCL ranks need {world} GPUs, this machine has {torch.cuda.device_count()}"
    fn = registry.resolve(target)
    limit = backend.limit_for("attention", dtype, fn)
    if limit is not None:
        return f"{backend.current()}: {limit.reason}"
    declared = getattr(fn, "dtypes", None)
    if declared is not None and dtype not in declared:
        return f"{target} declares dtypes {[str(d).replace('torch.', '') for d in declared]}"
    return None


def hunt(target: str, check: str, dtype: torch.dtype, examples: int, world: int,
         base_seed: int = HUNT_SEED, equal_only: bool = False) -> str | None:
    """Run ``check`` on ``target`` for up to ``examples`` cases (no shrinking: a verdict, not a
    minimal case); the first failure (``ExceptionType: text``), or None when every example
    passed: ``RankFailure`` when a rank raised, died or hung, ``AssertionError`` when the
    gathered outputs were wrong."""
    run, fixed = CHECKS[check]

    @seed(zlib.crc32(f"{base_seed}:{target}:{check}:{dtype}:{world}:{equal_only}".encode()))
    @settings(max_examples=examples, derandomize=False, database=None, deadline=None, print_blob=False,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(case=cp_cases(dtype, world, equal_only, **fixed))
    def search(case):
        try:
            run(case, target, world)
        except AssertionError as exc:
            raise type(exc)(f"{exc}\non:\n{case.describe()}") from None

    try:
        search()
    except AssertionError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
