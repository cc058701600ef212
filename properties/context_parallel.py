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

The check launches W processes (``properties/rank_pool.py``: gloo on CPU, NCCL on GPUs,
rank r on GPU r), draws cases (attention's strategy with Nq == Nk, causal or not, the
sequence split evenly or at drawn cut points), hands each rank its chunks, runs the
implementation on every rank, gathers o and lse, and compares them with
``references.attention.attention`` on the whole sequence.

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
import zlib

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, assume, given, seed, settings
from hypothesis import strategies as st

from properties import attention_tolerance as rules
from properties import backend, rank_pool, registry, tolerance
from properties.attention import attention_cases
from properties.oracle import assert_close
from properties.strategies import FLOAT_DTYPES, Case
from properties.tolerance import EXP_ULPS, SAFETY, U32, Precision
from references import attention as ref

OP = "cp_attention"
SIGNATURE = "cp_attention(q_local, k_local, v_local, causal=False, sm_scale=None, group=None) -> (o_local, lse_local)"
KERNEL = "kernels.context_parallel:cp_attention"
CONTROLS = ("controls.context_parallel:all_gather_torch",)
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
def cp_cases(draw, dtype: torch.dtype, world: int, equal_only: bool = False) -> Case:
    """An attention case with Nq == Nk >= world (one sequence, q, k and v split alike),
    causal or not, and the rows per rank: the even split (first, so failures shrink to
    it) or cut at drawn points (each rank at least one row); ``equal_only``: chunks of equal
    length (N a multiple of W; other draws are discarded)."""
    case = draw(attention_cases(dtype, causal=True, min_n=world))
    causal = draw(st.booleans())
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
    merges, for each rank's queries, blocks over each rank's keys by log-sum-exp in fp32.

    Block j of a row (keys of one rank; causal: earlier ranks' whole chunks and its own
    diagonal chunk) has exact (o_j, lse_j), computed within a_o_j, a_lse_j
    (``rules.attention`` for that block alone). The exact merge is lse = LSE_j lse_j and
    o = sum_j w_j o_j, w_j = e^{lse_j - lse}.
    - lse: LSE is monotone and shifts with its arguments, so errors d_j in the lse_j move
      it by at most L = max_j a_lse_j (exact, not first order); the fp32 merge adds, per
      merge step, the rounding of logaddexp and of the exponents' differences:
      u32 (|lse'| + |lse_acc - lse'| + |lse_b - lse'| + 2 EXP_ULPS + 1) <= u32 (5 m + 2 EXP_ULPS + 1),
      m = max(|lse|, |lse_j|); over W steps, with SAFETY: M.
    - weights: w'_j = e^{lse'_j - lse'}, so |log(w'_j / w_j)| <= E_j = a_lse_j + L + 2 M (the
      computed weight's own exponent rounding is inside the second M).
    - o: o' - o = sum_j w'_j e_j + sum_j (w'_j - w_j)(o_j - o) + o (sum_j w'_j - 1), with
      |e_j| <= a_o_j, |w'_j - w_j| <= w_j expm1(E_j) and |sum_j w'_j - 1| <= expm1(2 M) (the
      w'_j are exp(lse'_j - LSE(lse'_j)) up to the merge's rounding, and those sum to 1); the
      fp32 products and sums of the merge, 3 roundings a step, SAFETY 3 W u32 sum_j w_j |o_j|;
      the final store in the input dtype, p.store |o| + p.floor. Where E_j is of order 1 or
      more (scores near the dtype's range) the first part is capped by |o'| + |o| <=
      min(e^{2 M}, W) max_j (|o_j| + a_o_j) + |o|, a bound whatever the weights.
    """
    starts = _starts(chunks)
    world = len(chunks)
    a_o = np.zeros_like(o)
    a_lse = np.zeros_like(lse)
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
        with np.errstate(over="ignore", invalid="ignore"):
            big_l = np.max([b[3] for b in blocks], axis=0)
            m = np.maximum(np.abs(lse_r), np.max([np.abs(b[1]) for b in blocks], axis=0))
            big_m = SAFETY * world * U32 * (5 * m + 2 * EXP_ULPS + 1)
            two_m = np.minimum(2 * big_m, 300.0)[..., None]  # clipped: the cap below holds past it
            o_err = np.abs(o_r) * np.expm1(two_m)
            abs_sum = np.zeros_like(o_r)
            reach = np.zeros_like(o_r)  # max_j |o_j| + a_o_j: how far any block's computed o can be
            for o_j, lse_j, a_o_j, a_lse_j in blocks:
                # w_j <= 1 exactly; in fp64 lse_j can pass lse by its rounding (an ulp of lse is
                # 128 at 1e18, 1e22 at fp32's near-max scores), so clipped at 0
                log_w = np.minimum(lse_j - lse_r, 0.0)[..., None]
                w = np.exp(log_w)
                # w e^{E} in the log domain: w may underflow where e^{E} overflows; exponents
                # clipped at 300 (the cap below then holds the allowance)
                w_up = np.exp(np.minimum(log_w + (a_lse_j + big_l + 2 * big_m)[..., None], 300.0))
                o_err = o_err + w_up * a_o_j + (w_up - w) * np.abs(o_j - o_r)
                abs_sum = abs_sum + w * np.abs(o_j)
                reach = np.maximum(reach, np.abs(o_j) + a_o_j)
            rounding = SAFETY * 3 * world * U32 * abs_sum + p.store * np.abs(o_r) + p.floor
            # where the weights' errors are large (E_j of order 1: scores near the dtype's range)
            # the bound above explodes; |o' - o| <= |o'| + |o| <= sum_j w'_j |o'_j| + |o| holds
            # whatever the weights are, with sum_j w'_j <= e^{2M}, and <= W: each computed
            # weight is e^{lse'_j - lse'} <= 1, as a rounded logaddexp is never below its max
            cap = np.minimum(np.exp(two_m), world) * reach + np.abs(o_r)
            o_err = np.minimum(o_err + rounding, cap + rounding)
        a_o[..., rows, :] = o_err
        a_lse[..., rows] = big_l + big_m
    return a_o, a_lse


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
    m_o, m_lse = merged_allowance(q, k, v, o_ref, lse_ref, case.params["chunks"], causal, scale, p)
    what = f"does not match the fp64 reference (sequence split {list(case.params['chunks'])} over {world} ranks)"
    assert_close("o", o, o_ref, np.maximum(a_o, m_o), dtype=getattr(torch, case.dtype), record=False, what=what)
    assert_close("lse", lse, lse_ref, np.maximum(a_lse, m_lse), dtype=torch.float32, record=False, what=what)


CHECKS = {"matches_reference": matches_reference}


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
    minimal case); the first failure's text, or None when every example passed."""
    run = CHECKS[check]

    @seed(zlib.crc32(f"{base_seed}:{target}:{check}:{dtype}:{world}:{equal_only}".encode()))
    @settings(max_examples=examples, derandomize=False, database=None, deadline=None, print_blob=False,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(case=cp_cases(dtype, world, equal_only))
    def search(case):
        try:
            run(case, target, world)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\non:\n{case.describe()}") from None

    try:
        search()
    except AssertionError as exc:
        return str(exc)
    return None


DTYPES = FLOAT_DTYPES
