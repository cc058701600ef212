"""Dropout in attention: the checks of ``attention(..., dropout_p, seed, return_keep)``,
registered on the attention op (properties/attention.py imports this module and appends
:data:`CHECKS`; the strategy and helpers of properties/attention.py are read at call time).

The contract: P's entries are dropped after the softmax by a counter-based RNG seeded by
``seed``, the kept ones scaled by 1 / (1 - dropout_p); lse is dropout-free; the same seed
gives the same mask; ``dropout_p = 0`` is no dropout, bit for bit; ``return_keep=True``
returns the keep mask [B, H, Nq, Nk] (entries outside the band unspecified), which is the
way to check o against a reference, since the mask comes from the implementation's own
RNG. Models train with ``return_keep=False``: that call must compute what the call with the
mask computes, and its gradients are what training uses. So the checks are:

* ``dropout_zero_is_plain``: dropout_p = 0 (a seed passed) equals the call without the
  dropout arguments bit for bit: o and lse.
* ``dropout_seed_reproducible``: the same seed gives bitwise the same o, lse and keep; a
  seed differing in bit 0 or in bit 40 gives another mask (a statistical test: see below).
* ``dropout_keep_iid``: the mask's entries are independent Bernoulli(1 - p) draws: the kept
  count over the visible pairs is Binomial(n, 1 - p), and pairs of rows, and pairs of heads,
  agree as often as independent masks do.
* ``dropout_matches_reference``: o matches the fp64 reference given the returned mask
  (``tritoncheck.references.attention.attention(..., keep=)``) within ``rules.attention_dropout``; lse
  matches the dropout-free reference within ``rules.attention``'s allowance.
* ``dropout_gradient_uses_keep``: with the upstream gradient on one query row, dv of every
  key the returned mask drops there (or the band hides) is exactly 0: the backward uses
  the forward's mask.
* ``dropout_training_call_equals_keep_call``: the training call (return_keep=False) gives o
  and lse bitwise equal to the return_keep=True call with the same seed (a failure says
  when the training call is the dropout-free one); the checks of the returned mask then
  hold for the training call too.
* ``dropout_gradients_match_reference``: dq, dk, dv of the training call match fp64 autograd
  of the reference given the mask within ``rules.attention_dropout_grad`` (derivation
  there), cases outside the gradient domain and vacuous allowances discarded as in
  ``gradients_match_reference``; a gradient (1 - p) times the reference's is named as the
  missing 1 / (1 - p).

Where the mask comes from: an implementation whose signature takes ``return_keep`` returns
it (a call with return_keep=True). One whose signature stops at ``seed`` cannot: the
checks that read a mask recover it from its training call instead (:func:`_recovered_keep`:
q = 0 and one-hot values make o show which keys each row kept, ceil(Nk / D) calls), so the
statistical checks and the reference comparisons run on the training call itself, and
``dropout_training_call_equals_keep_call`` is not applicable (skipped with the reason). The
suite learns which from the signature alone: no declaration says "no return_keep" today
(tritoncheck/declarations.py lists the attributes).

Statistics. Only visible pairs (i, j) count: outside the band the mask is unspecified.
A kept count K ~ Binomial(n, 1 - p) fails when the two-sided Chernoff bound of a count as
far from n (1 - p) is below ALARM_KEEP / 2 (``tritoncheck.stats.binomial_tail_bound``). Two
independent draws agree with probability a = p^2 + (1 - p)^2; disjoint pairs (rows 2r and
2r + 1 of one head; heads 2t and 2t + 1 of one batch, at the same (i, j)) give independent
agreements, so their agreement count is Binomial(n, a) under independence and is tested
the same way, rows and heads at ALARM_INDEPENDENT / 2 each. Two seeds' masks over n
visible pairs coincide with probability a^n: compared only where a^n < COINCIDENCE. Per
example: ALARM_KEEP + ALARM_INDEPENDENT and COINCIDENCE (``Check.false_alarm``); together
with norms' checks 2.4e-8 per example (tritoncheck/stats.py).

Shapes stay small on the interpreter (Nq, Nk <= SMALL_N, D <= SMALL_D, a few tiles): Philox
runs as NumPy there, and a check calls the kernel one to three times, the gradient checks
once backward more (see SMALL_TILES; without return_keep, ceil(Nk / D) calls more per mask).

Implementations that take no dropout: a signature that stops before ``dropout_p`` (every
kernel written before it, third-party kernels without the argument) makes the dropout
checks not applicable, skipped with that reason (``Check.requires``), never run and never
passed; a kernel that takes the argument but not all of its domain declares
``limits = {"values": {"dropout_p": (0.0,)}}`` (the checks that need p > 0 are then
skipped with the reason, ``dropout_zero_is_plain`` still runs).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import assume

from tritoncheck import backend
from tritoncheck.config import CONFIG
from tritoncheck.generic import precision, require_grad_fn, run, snapshot, with_upstream
from tritoncheck.oracle import allowance_mostly_vacuous, assert_close, assert_identical, compare, to_numpy
from tritoncheck.phases import timed
from tritoncheck.properties import attention_tolerance as rules
from tritoncheck.properties.attention_arguments import (
    _backward_sums_in_domain,
    _complete,
    _scale_of,
    _values_for,
    _without_alibi,
    mods,
    window_of,
    with_params,
)
from tritoncheck.references import attention as ref
from tritoncheck.registry import OPS, Check, Implementation
from tritoncheck.stats import COINCIDENCE, FALSE_ALARM, agreement, binomial_tail_bound
from tritoncheck.strategies import Case
from tritoncheck.tolerance import reference_precision

DROPPED = (0.1, 0.5, 0.9, 0.25)  # the nonzero dropout probabilities the checks draw (tritoncheck.properties.attention.DROPOUT_PS)
ALARM_KEEP = FALSE_ALARM / 2  # per example, dropout_keep_iid's kept count
ALARM_INDEPENDENT = FALSE_ALARM / 2  # per example, dropout_keep_iid's agreements (rows and heads, half each)
# The interpreter's budget (CI: 2 cores, 20 examples per test and dtype). A tl.rand costs
# about 18 ms there whatever its tile, as much as the rest of an attention tile (about 28 ms
# a key block with it, 20 ms more a program), and the keep kernel about 25 ms per (batch,
# head). Checks whose subject is the o or the gradient of a multi-block call draw up to 32
# keys and queries (two 16-blocks each way) and 2 to 4 tiles (B H cdiv(Nq, 16) cdiv(Nk, 16))
# a call; the checks of the mask alone one block each way, dropout_keep_iid on two heads,
# dropout_seed_reproducible (three calls) on one (batch, head) slice. Measured on the 2-core
# CPU: the 15 tests in 65 s (-n 2), the 7 dropout mutants' hunts and naive_torch in 27 s.
SMALL_N = 32
SMALL_D = 32
SMALL_TILES = 4


def _through(last: str) -> tuple[str, ...]:
    """The contract's positional arguments up to ``last``."""
    args = OPS["attention"].arguments
    return args[:args.index(last) + 1]


# --------------------------------------------------------------------------- cases

def _cases(upstream: bool = False, dropouts: tuple = DROPPED, small_n: int = SMALL_N, tiles: int = SMALL_TILES,
           **fixed):
    """A ``Check.cases``: attention cases drawing dropout (with every variant: GQA, causal,
    windows, ALiBi, softcaps), on the interpreter up to ``small_n`` queries and keys and
    ``tiles`` tiles, with the keep mask asked for unless dropout_p is 0; ``upstream`` adds an
    upstream gradient ``do``."""
    def make(op, dtype):
        def cases(dt):
            return op.cases(dt, dropouts=dropouts, return_keep=dropouts != (0.0,), max_n=CONFIG.pick(small_n, 512),
                            max_d=CONFIG.pick(SMALL_D, 128), max_tiles=tiles, **fixed)
        return with_upstream(dataclasses.replace(op, cases=cases), dtype) if upstream else cases(dtype)
    return make


def _takes(last: str):
    """A ``Check.requires``: the implementation must take the dropout arguments through
    ``last`` (``seed`` or ``return_keep``: its signature, as tritoncheck/calling.py reads
    it) and return lse (the dropout checks compare it too)."""
    def requires(impl: Implementation) -> str | None:
        needed = _through(last)[_through(last).index("dropout_p"):]
        if impl.calling is None:
            return None
        reason = impl.calling.lacks(needed) or impl.calling.missing_outputs(("lse",))
        return f"{reason} (the dropout checks need attention(..., dropout_p, seed, return_keep) -> (o, lse))" \
            if reason else None
    return requires


def _takes_with_backward(last: str):
    takes = _takes(last)

    def requires(impl: Implementation) -> str | None:
        if not impl.supports_backward:
            return f"{impl.name} declares supports_backward = False"
        return takes(impl)
    return requires


# --------------------------------------------------------------------------- helpers

def _returns_keep(impl: Implementation) -> bool:
    """Whether ``impl`` takes ``return_keep`` (its signature binds the contract's arguments
    through it, or cannot be read): the keep mask then comes from that call; else it is
    recovered from the training call (:func:`_recovered_keep`)."""
    return impl.calling is None or impl.calling.takes("return_keep")


def _training(case: Case) -> Case:
    """``case`` as a model trains with it: return_keep=False (not passed)."""
    return with_params(case, return_keep=False)


def _recovered_keep(case: Case, impl: Implementation, values: dict) -> torch.Tensor:
    """The keep mask [B, H, Nq, Nk] (bool, on the host) of the training call of ``case``,
    read off that call's o, for an implementation that cannot return it.

    By the contract the mask is a function of the seed and the shape alone (a counter-based
    RNG), so a call with other values draws the same one: q = 0 gives every visible key of
    row i the weight 1 / n_i (the softmax of equal scores; ALiBi is left out, softcaps
    cap 0 to 0), and v_j = e_(j - t D) (one-hot over the D columns, keys tD .. tD + D - 1;
    0 for the other keys) gives o_id = c M_i,(tD + d) / n_i: nonzero exactly where key tD + d
    is kept (c / n_i >= 1 / 32 on the interpreter's shapes, far from every dtype's
    underflow). ceil(Nk / D) calls; outside the band the mask reads False (unspecified
    there anyway). A mask that depends on the values shows in dropout_matches_reference."""
    probe = _training(_without_alibi(case))
    q, v = values["q"], values["v"]
    b, h, n_q, d = q.shape
    h_kv, n_k = v.shape[1], v.shape[2]
    keep = torch.zeros(b, h, n_q, n_k, dtype=torch.bool)
    for start in range(0, n_k, d):
        width = min(d, n_k - start)
        one_hot = torch.zeros(b, h_kv, n_k, d, dtype=v.dtype, device=v.device)
        cols = torch.arange(width, device=v.device)
        one_hot[:, :, start + cols, cols] = 1.0
        probe_values = _values_for(probe, {**values, "q": torch.zeros_like(q), "v": one_hot})
        with torch.no_grad():
            _, outs = run(probe, impl, probe_values)
        keep[..., start:start + width] = (outs["o"][..., :width] != 0).cpu()
    return keep


def _run_keep(case: Case, impl: Implementation, values: dict | None = None):
    """impl on ``case``: the values and (o, lse, keep), checked for number, type, shape and
    dtype. o and lse of the return_keep=True call with its mask where the implementation
    takes return_keep (dropout_training_call_equals_keep_call ties that call to the training
    call), else of the training call, with the mask recovered from it."""
    if values is None:
        with timed("inputs"):
            values = case.materialise(backend.device())
    if not _returns_keep(impl):
        train = _training(case)
        _, outs = run(train, impl, _values_for(train, values))
        return values, {**outs, "keep": _recovered_keep(case, impl, values)}
    with timed("kernel"):
        result = impl.call(values, case.args, case.kwargs)
    items = result if isinstance(result, (tuple, list)) else (result,)
    if len(items) != 3:
        raise AssertionError(f"attention with return_keep=True must return 3 tensors (o, lse, keep), got {len(items)}")
    for name, item in zip(("o", "lse", "keep"), items):
        if not isinstance(item, torch.Tensor):
            raise AssertionError(f"attention output {name!r} is a {type(item).__name__}, not a tensor")
    o, lse, keep = items
    o = o if impl.calling is None else impl.calling.restored("o", o)  # in the contract's layout
    b, h, n_q, _ = values["q"].shape
    want = (b, h, n_q, values["k"].shape[-2])
    if keep.dtype != torch.bool or tuple(keep.shape) != want:
        raise AssertionError(f"output 'keep' is {keep.dtype} {list(keep.shape)}, the contract says torch.bool {list(want)}")
    if o.dtype != values["q"].dtype or lse.dtype != torch.float32:
        raise AssertionError(f"outputs o, lse are {o.dtype}, {lse.dtype}; the contract says {values['q'].dtype}, "
                             "torch.float32")
    return values, {"o": o, "lse": lse, "keep": keep}


def _visible(case: Case, values: dict) -> np.ndarray:
    """[Nq, Nk] bool: the pairs the band keeps (the keep mask is specified there only)."""
    return ref.visible_pairs(values["q"].shape[-2], values["k"].shape[-2], case.params["causal"],
                             tuple(case.params["window"]))


def _binomial_test(count: int, n: int, q: float, rate: float, what: str) -> None:
    """Fail when ``count`` successes of ``n`` are further from n q than a two-sided
    Chernoff test at false-alarm ``rate`` allows."""
    if n == 0:
        return
    bound = binomial_tail_bound(count, n, q)
    if bound < rate / 2:
        raise AssertionError(f"{what}: {count} of {n} ({count / n:.4f}), expected {q:.4f} of them; a count this far "
                             f"from {n * q:.1f} has probability <= {bound:.3g} (test at {rate:g})")


# --------------------------------------------------------------------------- checks

def dropout_zero_is_plain(case: Case, impl: Implementation) -> None:
    """dropout_p = 0 with a seed passed equals the call without dropout bit for bit, o and
    lse (no mask drawn, no 1 / (1 - p) product, no other code path). Not the gradients: two
    more backward calls would double the check's cost on the interpreter, and a backward
    that differs at p = 0 shows in dropout_gradient_uses_keep's cases only if it drops."""
    assert case.params["dropout_p"] == 0.0
    args = _through("seed")
    zero = dataclasses.replace(case, args=args, params=_complete(case.params, args, case.tensors))
    values, outs = run(zero, impl)
    _, outs2 = run(with_params(case, dropout_p=0.0, seed=0), impl, values)
    what = f"dropout_p = 0 (seed {case.params['seed']}) != no dropout"
    for name in ("o", "lse"):
        assert_identical(name, outs[name], outs2[name], what)


def dropout_seed_reproducible(case: Case, impl: Implementation) -> None:
    """The same seed gives bitwise the same o, lse and keep (at the visible pairs, where the mask
    is specified). Another seed, differing in bit 0
    or (every other case, by v's seed) in bit 40, gives another mask over the visible pairs
    (a seed cut to 32 bits shows in the second, one ignoring its low bits in the first),
    where a coincidence has probability (p^2 + (1-p)^2)^n < COINCIDENCE."""
    values, outs = _run_keep(case, impl)
    _, again = _run_keep(case, impl, dict(values))
    # the mask is specified at the visible pairs only
    visible = torch.from_numpy(np.broadcast_to(_visible(case, values), outs["keep"].shape).copy())
    for name, a, b in (("o", outs["o"], again["o"]), ("lse", outs["lse"], again["lse"]),
                       ("keep", outs["keep"].cpu()[visible], again["keep"].cpu()[visible])):
        assert_identical(name, a, b, "the same seed gave another result")
    p, seed = case.params["dropout_p"], case.params["seed"]
    keep = outs["keep"].cpu()[visible]
    if keep.numel() * math.log(agreement(p)) >= math.log(COINCIDENCE):
        return  # too few visible pairs for two masks to differ surely
    other = seed ^ (1 << (40 if case.tensors["v"].seed % 2 else 0))
    _, outs2 = _run_keep(case, impl, {**values, "seed": other})
    if torch.equal(outs2["keep"].cpu()[visible], keep):
        raise AssertionError(f"seeds {seed} and {other} gave the same keep mask over {keep.numel()} visible pairs "
                             f"at dropout_p = {p:g} (probability {agreement(p) ** keep.numel():.3g})")


def dropout_keep_iid(case: Case, impl: Implementation) -> None:
    """The keep mask's entries at the visible pairs are independent Bernoulli(1 - p) draws, as
    far as three two-sided Chernoff tests can tell: the kept count is Binomial(n, 1 - p) (at
    ALARM_KEEP); rows 2r and 2r + 1 of each head, and heads 2t and 2t + 1 of each batch, agree
    on the (i, j) both see as often as independent masks do, each count of agreements
    Binomial(n, p^2 + (1-p)^2) (disjoint pairs are independent; ALARM_INDEPENDENT / 2 each).
    Heads sharing a mask (a counter without the head) agree everywhere."""
    values, outs = _run_keep(case, impl)
    visible = _visible(case, values)
    keep = outs["keep"].cpu().numpy()
    p = case.params["dropout_p"]
    seen = np.broadcast_to(visible, keep.shape)
    _binomial_test(int(keep[seen].sum()), int(seen.sum()), 1.0 - p, ALARM_KEEP, f"kept pairs at dropout_p = {p:g}")
    a = agreement(p)
    m = keep.shape[-2] // 2
    both = np.broadcast_to(visible[0:2 * m:2] & visible[1:2 * m:2], keep[..., 0:2 * m:2, :].shape)
    same = keep[..., 0:2 * m:2, :] == keep[..., 1:2 * m:2, :]
    _binomial_test(int(same[both].sum()), int(both.sum()), a, ALARM_INDEPENDENT / 2,
                   f"agreements of rows 2r and 2r + 1 at dropout_p = {p:g}")
    t = keep.shape[1] // 2
    seen = np.broadcast_to(visible, keep[:, 0:2 * t:2].shape)
    same = keep[:, 0:2 * t:2] == keep[:, 1:2 * t:2]
    _binomial_test(int(same[seen].sum()), int(seen.sum()), a, ALARM_INDEPENDENT / 2,
                   f"agreements of heads 2t and 2t + 1 at dropout_p = {p:g}")


def dropout_matches_reference(case: Case, impl: Implementation) -> None:
    """o matches the fp64 reference with the returned mask, o = (P * keep / (1 - p)) V, within
    rules.attention_dropout; lse matches the dropout-free reference within rules.attention's
    allowance. Both from the inputs as they were before the call (a snapshot, as
    matches_reference takes): a kernel that rewrote v to agree with a wrong o would agree
    with a reference read after it."""
    with timed("inputs"):
        values = case.materialise(backend.device())
        before = snapshot(values)
    _, outs = _run_keep(case, impl, values)
    values = before
    q, k, v = (to_numpy(values[n]) for n in ("q", "k", "v"))
    keep = outs["keep"].cpu().numpy()
    p, causal, window, extra = case.params["dropout_p"], case.params["causal"], window_of(case), \
        mods(case, values)
    with timed("reference"):
        o, lse = ref.attention(q, k, v, causal, case.params["sm_scale"], window, **extra, dropout_p=p, keep=keep)
    with timed("allowance"):
        a_o, a_lse = rules.attention_dropout(q, k, v, o, lse, keep, p, causal, _scale_of(case),
                                             precision(impl, case), window, **extra)
        noise_o, noise_lse = rules.attention_dropout(q, k, v, o, lse, keep, p, causal, _scale_of(case),
                                                     reference_precision(precision(impl, case)), window, **extra)
    what = f"does not match the fp64 reference given the returned keep mask (dropout_p = {p:g})"
    assert_close("o", outs["o"], o, a_o, what=what, dtype=values["q"].dtype, record=False, vacuity=True,
                 rule="tritoncheck.properties.attention_tolerance.attention_dropout", noise=noise_o)
    assert_close("lse", outs["lse"], lse, a_lse, what="lse (dropout-free) " + what, dtype=torch.float32,
                 record=False, vacuity=True, rule="tritoncheck.properties.attention_tolerance.attention",
                 noise=noise_lse)


def dropout_gradient_uses_keep(case: Case, impl: Implementation) -> None:
    """With the upstream gradient on one query row i of one head only, dv = (P * keep)^T dO /
    (1 - p) is exactly 0 at every key that the returned mask drops in row i (or that row i
    does not see), and at every key of the other KV heads: a backward that redraws another
    mask than the forward's sends gradient to dropped keys."""
    values = case.materialise(backend.device())
    b_n, h_n, n_q, _ = values["q"].shape
    b, h = divmod(case.tensors["q"].seed % (b_n * h_n), h_n)
    visible = _visible(case, values)
    rows = np.flatnonzero(visible.any(axis=-1))
    i = int(rows[case.tensors["k"].seed % len(rows)]) if len(rows) else case.tensors["k"].seed % n_q
    do = torch.zeros_like(values["do"])
    do[b, h, i] = values["do"][b, h, i]
    for name in ("q", "k", "v"):
        values[name] = values[name].detach().requires_grad_(True)
    _, outs = _run_keep(case, impl, values)
    require_grad_fn(OPS["attention"], impl, outs)
    (dv,) = torch.autograd.grad(outs["o"], (values["v"],), do)
    kv = h // (h_n // values["k"].shape[1])
    zero = torch.ones(dv.shape[:-1], dtype=torch.bool)
    zero[b, kv] = ~(outs["keep"][b, h, i].cpu() & torch.from_numpy(visible[i]))
    part = dv[zero.to(dv.device)]
    dropped = int(zero[b, kv].sum())
    assert_identical("dv", torch.zeros_like(part), part,
                     f"with the upstream gradient on row {i} of (batch {b}, head {h}) only, dv is not 0 at the "
                     f"{dropped} keys the returned mask drops (or the band hides) there, or at other KV heads")


def dropout_training_call_equals_keep_call(case: Case, impl: Implementation) -> None:
    """The training call (return_keep=False, the call a model trains with) gives o and lse
    bitwise equal to the return_keep=True call with the same seed: asking for the mask must
    not change what is computed, or every check of the returned mask checks another call
    than the one models run."""
    values, outs = _run_keep(case, impl)
    train = _training(case)
    _, trained = run(train, impl, _values_for(train, values))
    p, seed = case.params["dropout_p"], case.params["seed"]
    what = (f"the training call (return_keep=False) differs from the return_keep=True call with the same seed "
            f"{seed} (dropout_p = {p:g})")
    for name in ("o", "lse"):
        if not _identical(trained[name], outs[name]):
            plain = with_params(case, dropout_p=0.0, seed=0, return_keep=False)
            _, undropped = run(plain, impl, _values_for(plain, values))
            if _identical(trained["o"], undropped["o"]):
                what += ("; its o is bitwise the call without dropout: the training call applies no dropout "
                         "(dropout only when the mask is asked for)")
            assert_identical(name, trained[name], outs[name], what)


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaNs in the same places (as assert_identical compares)."""
    return a.shape == b.shape and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _unscaled_cause(name: str, got: torch.Tensor, expected: np.ndarray, allowed: np.ndarray, p: float,
                    dtype: torch.dtype) -> str:
    """The cause of ``got``'s failure when it is (1 - p) times a right gradient: within
    (1 - p) times the allowance (plus the allowance, for the product's rounding) of (1 - p)
    times the reference, the backward left out the kept weights' 1 / (1 - p). '' otherwise."""
    factor = 1.0 - p
    if not compare(name, got, factor * expected, (factor + 1.0) * allowed, dtype).ok:
        return ""
    return (f"; {name} is {factor:.4g} x the reference within the allowance: the gradient is off by "
            f"1/(1-p) = {1.0 / factor:.4g}, the backward leaves out the kept weights' 1 / (1 - p) scale")


def dropout_gradients_match_reference(case: Case, impl: Implementation) -> None:
    """dq, dk, dv of the training call (return_keep=False) under dropout match fp64 autograd
    of the reference given the implementation's keep mask (o = (P * keep / (1 - p)) V) on the
    same rounded inputs and upstream gradient, within rules.attention_dropout_grad. The mask
    comes from a return_keep=True call (or from the training call itself, for an
    implementation without return_keep). Cases are drawn as in gradients_match_reference:
    backward sums beyond max / 8 of the dtype for any mask, or an allowance beyond it, are
    outside the domain (``assume``); so is an example whose allowance would accept 0 for most
    elements of a gradient (vacuous: counted in the report's discards); the comparisons are
    recorded for the report. A gradient off by exactly the dropout's 1 / (1 - p) says so."""
    dtype = getattr(torch, case.dtype)
    with timed("inputs"):
        values = case.materialise(backend.device())
    names = ("q", "k", "v")
    inputs64 = {n: values[n].detach().to(torch.float64, copy=True) for n in (*names, "do")}
    _backward_sums_in_domain(case, *(inputs64[n] for n in (*names, "do")), None)
    with torch.no_grad():
        _, with_keep = _run_keep(case, impl, dict(values))
    keep = with_keep["keep"].to(inputs64["q"].device)
    p, causal, window, extra = case.params["dropout_p"], case.params["causal"], window_of(case), \
        mods(case, values)
    with timed("reference"):
        leaves = {n: inputs64[n].clone().requires_grad_(True) for n in names}
        o64, lse64 = ref.attention_torch(*(leaves[n] for n in names), causal, case.params["sm_scale"], window,
                                         **extra, dropout_p=p, keep=keep)
        grads64 = dict(zip(names, (g.detach() for g in torch.autograd.grad(o64, [leaves[n] for n in names],
                                                                           inputs64["do"]))))
    with timed("allowance"):
        allowed, noise = (rules.attention_dropout_grad(*(inputs64[n] for n in (*names, "do")), o64.detach(),
                                                       lse64.detach(), grads64["q"], grads64["k"], grads64["v"], keep,
                                                       p, causal, _scale_of(case), prec, window, **extra)
                          for prec in (precision(impl, case), reference_precision(precision(impl, case))))
    assume(max(float(np.max(a)) for a in allowed.values()) <= float(torch.finfo(dtype).max) / 8)
    expected = {n: to_numpy(grads64[n]) for n in names}
    assume(not any(allowance_mostly_vacuous(expected[n], allowed[f"d{n}"], dtype, noise[f"d{n}"]) for n in names))
    for n in names:
        values[n] = values[n].detach().requires_grad_(True)
    train = _training(case)
    _, outs = run(train, impl, _values_for(train, values))
    require_grad_fn(OPS["attention"], impl, outs)
    with timed("kernel"):
        got = dict(zip(names, torch.autograd.grad(outs["o"], [values[n] for n in names], values["do"])))
    what = (f"does not match fp64 autograd of the reference given the implementation's keep mask "
            f"(dropout_p = {p:g}, training call)")
    with timed("compare"):
        for n in ("v", "k", "q"):  # dv = c (P * keep)^T dO first: the factor shows there unmixed
            if got[n].dtype != dtype:
                raise AssertionError(f"gradient of {n!r} has dtype {got[n].dtype}, input has {dtype}")
            if not compare(f"d{n}", got[n], expected[n], allowed[f"d{n}"], dtype).ok:
                what += _unscaled_cause(f"d{n}", got[n], expected[n], allowed[f"d{n}"], p, dtype)
            assert_close(f"d{n}", got[n], expected[n], allowed[f"d{n}"], what=what, dtype=dtype,
                         rule="tritoncheck.properties.attention_tolerance.attention_dropout_grad", noise=noise[f"d{n}"])


CHECKS = (
    Check("dropout_zero_is_plain", dropout_zero_is_plain, cases=_cases(dropouts=(0.0,), tiles=2),
          requires=_takes("seed")),
    Check("dropout_seed_reproducible", dropout_seed_reproducible, cases=_cases(small_n=16, tiles=1),
          requires=_takes("seed"),
          false_alarm=COINCIDENCE),
    Check("dropout_keep_iid", dropout_keep_iid, cases=_cases(min_h=2, min_n=2, small_n=16, tiles=2),
          requires=_takes("seed"),
          false_alarm=ALARM_KEEP + ALARM_INDEPENDENT),
    Check("dropout_matches_reference", dropout_matches_reference, cases=_cases(), requires=_takes("seed")),
    Check("dropout_gradient_uses_keep", dropout_gradient_uses_keep, cases=_cases(upstream=True, tiles=2),
          requires=_takes_with_backward("seed")),
    Check("dropout_training_call_equals_keep_call", dropout_training_call_equals_keep_call,
          cases=_cases(tiles=2), requires=_takes("return_keep")),
    Check("dropout_gradients_match_reference", dropout_gradients_match_reference,
          cases=_cases(upstream=True, tiles=2), requires=_takes_with_backward("seed")),
)
