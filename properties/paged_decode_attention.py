"""paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None,
num_splits=None) -> o: strategy, tolerance binding and properties.

What serving sends (the strategy): a batch of decode steps, many short sequences and a few
long ones, lengths at and around page and block edges (generic 16, 32, 64), empty
sequences (seq_lens 0), page sizes that are and are not powers of two, physical pages
allocated in order or shuffled, free pages (named by no live table entry) and stale slots
past each sequence's length, and table entries past the live pages pointing at a free page.
Half the cases pass q [B, H, D] (one new token), the others q [B, T, H, D] with T = 1 .. 8
query tokens (speculative or chunked decode), a sequence then often T - 1, T or T + 1 long
(its first query rows see no key, or just one). num_splits is drawn from
None, 1 (one pass) and 3 (split-K; split_k_equals_unsplit draws 2 .. 16). The table and lengths are int32 TensorSpecs whose
every element is an injection (as the varlen offsets: properties/varlen_attention.py), so a
case prints and replays them.

The domain is the dense op's for the query rows: q and the keys capped by ``qk_cap``, v by
``v_cap`` of the longest sequence.

Tolerance: properties/paged_decode_attention_tolerance.py (the dense causal rule per
sequence; a split case, the merge's derived allowance).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import strategies as st

from tritoncheck import backend
from tritoncheck.bad_input import BadInput, Spoiler, randn, scalar_spoilers, tensor_spoilers
from tritoncheck.config import CONFIG
from tritoncheck.generic import generic_checks, precision, run
from tritoncheck.large_problem import LargeProblem, paged_cache
from tritoncheck.limits import NO_LIMITS, Limits, OutsideLimits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.properties.attention import SM_SCALES, _qkv, qk_cap, v_cap
from tritoncheck.properties.attention_arguments import _resolved_scale
from tritoncheck.properties.paged_decode_attention_tolerance import (
    paged_decode_tolerance,
    sequence_allowance,
    split_allowance,
)
from tritoncheck.properties.varlen_attention import EDGES, HEAD_DIMS, SHORT_MAX
from tritoncheck.references import attention as dense
from tritoncheck.references import paged_decode_attention as ref
from tritoncheck.registry import OPS, Check, Implementation, OpSpec, register
from tritoncheck.strategies import Case, TensorSpec, block_edges, layouts

PAGE_SIZES = (16, 1, 5, 8, 3, 32)  # vLLM's 16 first; odd sizes catch a power-of-two slot mask
ARGS = ("q", "k_cache", "v_cache", "block_table", "seq_lens", "sm_scale", "num_splits")
MAX_QUERIES = 8  # speculative decoding drafts a handful of tokens
NUM_SPLITS = (None, 1, 3)  # None and 1: one pass over the keys; split_k_equals_unsplit draws more
SPLITS = (2, 3, 4, 7, 16)  # split_k_equals_unsplit's; 16 chunks leave short sequences empty chunks
_BLOCK_BUDGET = 40  # interpreter: B H T sum_b cdiv(n_b, 16) key blocks per case
_PROGRAM_BUDGET = 16  # interpreter: B H T S programs per case (T drawn below what fits: ~20 ms each)
_LONG_SMALL, _LONG_LARGE = 70, 4096


def index_spec(values: np.ndarray) -> TensorSpec:
    """An int32 tensor of ``values`` as a TensorSpec: zeros with every element injected."""
    flat = np.asarray(values).reshape(-1)
    return TensorSpec(tuple(np.asarray(values).shape), "int32", family="indices", scale=1.0,
                      injections=tuple((i, float(x)) for i, x in enumerate(flat)))


@st.composite
def _seq_len(draw, long: bool) -> int:
    if not long:
        return draw(st.integers(0, SHORT_MAX))
    hi = CONFIG.pick(_LONG_SMALL, _LONG_LARGE)
    edges = block_edges(SHORT_MAX + 1, hi, EDGES)
    return draw(st.one_of(st.integers(SHORT_MAX + 1, hi), st.sampled_from(edges)))


@st.composite
def _layout(draw, lens: list[int], page_size: int):
    """(pages, block_table, free pages): each sequence's live pages placed in a pool of
    physical pages in order or shuffled, one to three free pages among them, and the
    table's entries past a sequence's live pages pointing at a free page."""
    live = [-(-n // page_size) for n in lens]
    width = max(1, max(live))
    free = draw(st.integers(1, 3))
    pages = sum(live) + free
    order = list(range(pages))
    if draw(st.booleans()):
        order = draw(st.permutations(order))
    table = np.zeros((len(lens), width), dtype=np.int64)
    free_pages = order[sum(live):]
    taken = 0
    for b, count in enumerate(live):
        table[b, :count] = order[taken:taken + count]
        table[b, count:] = free_pages[b % len(free_pages)]
        taken += count
    return pages, table, free_pages


@st.composite
def _queries(draw, programs: int) -> int | None:
    """T, the query tokens per sequence, or None for q [B, H, D] (T = 1); under the
    interpreter no more than fit ``_PROGRAM_BUDGET`` with ``programs`` = B H S."""
    if draw(st.booleans()):
        return None
    hi = MAX_QUERIES if CONFIG.size == "large" else max(1, min(MAX_QUERIES, _PROGRAM_BUDGET // programs))
    return draw(st.one_of(st.integers(1, hi), st.just(hi)))


@st.composite
def paged_decode_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS, page_sizes: tuple | None = None,
                       splits: tuple = NUM_SPLITS) -> Case:
    """q [B, H, D] or [B, T, H, D]; caches [P, page_size, Hkv, D]; block_table [B, max_pages];
    seq_lens [B]; num_splits from ``splits`` (module docstring)."""
    count = draw(st.integers(1, 4))
    n_long = draw(st.integers(0, min(2, count)))
    lens = [draw(_seq_len(i < n_long)) for i in range(count)]
    lens = [lens[i] for i in draw(st.permutations(range(count)))]
    page_size = draw(st.sampled_from(page_sizes or PAGE_SIZES))
    d = draw(limits.pick("D", HEAD_DIMS))
    h = draw(limits.size("H", 1, 4))
    divisors = [n for n in range(h, 0, -1) if h % n == 0 and n in limits.sizes.get("Hkv", (n,))
                and limits.min_size.get("Hkv", 1) <= n <= limits.max_size.get("Hkv", n)]
    if not divisors:
        raise OutsideLimits(f"no KV head count divides H = {h} inside the declared Hkv limits")
    h_kv = draw(st.sampled_from(divisors))
    num_splits = draw(limits.choice("num_splits", splits))
    queries = draw(_queries(count * h * (num_splits or 1)))
    t = queries or 1
    if queries is not None and draw(st.booleans()):
        # a sequence about as long as its query tokens: its first rows see no key, or one
        lens[draw(st.integers(0, count - 1))] = max(0, t + draw(st.integers(-1, 1)))
    # over the interpreter's budget: the longest sequence is halved until it fits (not drawn again)
    while CONFIG.size != "large" and count * h * t * sum(max(1, -(-n // 16)) for n in lens) > _BLOCK_BUDGET \
            and max(lens) > 16:
        i = max(range(count), key=lambda j: lens[j])
        lens[i] //= 2
    pages, table, _ = draw(_layout(lens, page_size))
    sm_scale = draw(limits.choice("sm_scale", SM_SCALES))
    cap = qk_cap(dtype, d, _resolved_scale(sm_scale, d))
    q_shape = (count, h, d) if queries is None else (count, queries, h, d)
    q = draw(_qkv((1, count * t, h, d), dtype, cap))
    k = draw(_qkv((pages, page_size, h_kv, d), dtype, cap))
    v = draw(_qkv((pages, page_size, h_kv, d), dtype, v_cap(dtype, max(1, max(lens)))))
    specs = {"q": dataclasses.replace(q, shape=q_shape, layout=draw(layouts(len(q_shape)))),
             "k_cache": k, "v_cache": v, "block_table": index_spec(table), "seq_lens": index_spec(np.array(lens))}
    return Case("paged_decode_attention", str(dtype).replace("torch.", ""), ARGS, specs,
                {"sm_scale": sm_scale, "num_splits": num_splits})


def _split_cases(op: OpSpec, dtype: torch.dtype):
    return op.cases(dtype, splits=SPLITS)  # op.cases: inside the declared limits


# ------------------------------------------------------------------------- tolerance

def _scale_of(case: Case) -> float:
    return _resolved_scale(case.params["sm_scale"], case.tensors["q"].shape[-1])


def _allowed(case: Case, impl: Implementation, values) -> tuple[np.ndarray, np.ndarray]:
    expected, inputs64 = OPS["paged_decode_attention"].expected(case, values)
    return expected["o"], paged_decode_tolerance(case, inputs64, expected, precision(impl, case))["o"]


# ------------------------------------------------------------------------ properties

def _live(values: dict) -> tuple[int, list[int], list[int]]:
    """(page_size, live page count per sequence, sequence lengths)."""
    page_size = values["k_cache"].shape[1]
    lens = values["seq_lens"].tolist()
    return page_size, [-(-n // page_size) for n in lens], lens


def page_permutation_invariant(case: Case, impl: Implementation) -> None:
    """Moving the physical pages (a permutation of the cache's first dim) and renaming
    them in the block table gives bit-identical o: where a page lies is bookkeeping."""
    values, outs = run(case, impl)
    pages = values["k_cache"].shape[0]
    perm = torch.from_numpy(np.random.default_rng(case.tensors["k_cache"].seed).permutation(pages))
    moved = dict(values)
    where = torch.empty_like(perm)
    where[perm] = torch.arange(pages)  # old page perm[i] now lies at i
    device = values["q"].device
    for name in ("k_cache", "v_cache"):
        moved[name] = values[name][perm.to(device)].contiguous()
    moved["block_table"] = where.to(device)[values["block_table"].long()].to(values["block_table"].dtype)
    _, outs2 = run(case, impl, moved)
    assert_identical("o", outs["o"], outs2["o"], "permuting the physical pages with the block table changed o")


def free_pages_never_read(case: Case, impl: Implementation) -> None:
    """Free pages, the slots past each sequence's length in its last page, and the pages
    that table entries past the live ones name hold NaN: o is bit-identical to the call
    with finite values there (a kernel reads only the live tokens)."""
    values = case.materialise(backend.device())
    page_size, live, lens = _live(values)
    table = values["block_table"].tolist()
    stale = torch.ones(values["k_cache"].shape[:2], dtype=torch.bool)  # (page, slot) read by no live token
    for b, n in enumerate(lens):
        for j in range(n):
            stale[table[b][j // page_size], j % page_size] = False
    # both calls on contiguous caches: only the stale slots' contents differ
    finite, poisoned = dict(values), dict(values)
    mask = stale.to(values["q"].device)[..., None, None]
    for name in ("k_cache", "v_cache"):
        finite[name] = values[name].contiguous()
        poisoned[name] = values[name].masked_fill(mask, float("nan")).contiguous()
    _, outs = run(case, impl, finite)
    _, outs2 = run(case, impl, poisoned)
    assert_identical("o", outs["o"], outs2["o"], f"{int(stale.sum())} stale (page, slot)s set to NaN changed o")


def _repaged(values: dict, page_size: int) -> dict:
    """The same sequences in a cache of another page size: pages in order, one free page
    of zeros at the end that every table entry past the live pages names."""
    _, _, lens = _live(values)
    device = values["q"].device
    tables, k_parts, v_parts, taken = [], [], [], 0
    for b, n in enumerate(lens):
        count = -(-n // page_size)
        for parts, name in ((k_parts, "k_cache"), (v_parts, "v_cache")):
            tokens = ref.gathered(values[name], values["block_table"].tolist(), lens, b)
            pad = tokens.new_zeros((count * page_size - n, *tokens.shape[1:]))
            parts.append(torch.cat([tokens, pad]).reshape(count, page_size, *tokens.shape[1:]))
        tables.append(list(range(taken, taken + count)))
        taken += count
    width = max(1, max(len(t) for t in tables))
    table = torch.tensor([t + [taken] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
    free = values["k_cache"].new_zeros((1, page_size, *values["k_cache"].shape[2:]))
    return {**values, "k_cache": torch.cat(k_parts + [free]), "v_cache": torch.cat(v_parts + [free]),
            "block_table": table}


def page_size_invariant(case: Case, impl: Implementation) -> None:
    """The same sequences in caches of page size 1 and of page size + 1 give o within twice
    the derived allowance (each call is within it of the same exact value; the page size
    is a storage choice, not a change of the problem)."""
    values, outs = run(case, impl)
    _, allowed = _allowed(case, impl, values)
    dtype = getattr(torch, case.dtype)
    for size in (1, values["k_cache"].shape[1] + 1):
        _, outs2 = run(case, impl, _repaged(values, size))
        assert_close("o", outs["o"], to_numpy(outs2["o"]), 2 * allowed, dtype=dtype, record=False,
                     what=f"page size {values['k_cache'].shape[1]} != page size {size}")


def decode_is_last_rows_of_dense_causal(case: Case, impl: Implementation) -> None:
    """o[b] is the last T rows of the dense causal op (fp64, references/attention.py) on
    sequence b's gathered tokens, its earlier query rows any values: within the derived
    allowance. (The query tokens are the sequence's newest; bottom-right causal lets the
    last row see every key, the current token's own included, and query t the keys up to
    its own position.) Where the sequence is shorter than T, its n tokens are the dense
    op's n rows, and the first T - n query rows, whose position is before the sequence's
    first token, see no key: 0."""
    values, outs = run(case, impl)
    _, allowed = _allowed(case, impl, values)
    q, table, lens = ref.query_rows(to_numpy(values["q"])), values["block_table"].tolist(), values["seq_lens"].tolist()
    want = np.zeros(q.shape)
    queries, heads, d = q.shape[1:]
    rng = np.random.default_rng(case.tensors["q"].seed)
    for b, n in enumerate(lens):
        if n == 0:
            continue
        k, v = (np.swapaxes(to_numpy(ref.gathered(values[c], table, lens, b)), 0, 1)[None]
                for c in ("k_cache", "v_cache"))
        m = min(queries, n)  # query rows at a token of the sequence
        rows = rng.standard_normal((1, heads, n, d))
        rows[0, :, n - m:] = np.swapaxes(q[b, queries - m:], 0, 1)
        o_b, _ = dense.attention(rows, k, v, True, case.params["sm_scale"])
        want[b, queries - m:] = np.swapaxes(o_b[0, :, n - m:], 0, 1)
    assert_close("o", outs["o"], want.reshape(outs["o"].shape), allowed, dtype=getattr(torch, case.dtype),
                 record=False, what="decode != the last rows of the dense causal op on the gathered sequence")


def split_k_equals_unsplit(case: Case, impl: Implementation) -> None:
    """The split-K call (num_splits = S > 1: the contract's chunks of cdiv(n, S) keys, each
    one's partial o and lse in fp32, merged in fp32) equals the call with num_splits = 1:
    within the sum of their derived allowances, the merge's (each partial's dense rule
    carried through its weight, the weights moved by the partial lse's error and fp32
    rounding in log space as in the dense family's split_kv_merge, the merge's S-term
    sums: properties/paged_decode_attention_tolerance.py) and the dense rule's (each call
    is within its own allowance of the same exact o)."""
    values, outs = run(case, impl)
    _, outs1 = run(case, impl, {**values, "num_splits": 1})
    expected, inputs64 = OPS["paged_decode_attention"].expected(case, values)
    p = precision(impl, case)
    o = ref.query_rows(expected["o"])
    q, table, lens = ref.query_rows(inputs64["q"]), inputs64["block_table"], inputs64["seq_lens"]
    splits = case.params["num_splits"]
    allowed = np.zeros(o.shape)
    for b in range(o.shape[0]):
        if lens[b] == 0:
            continue
        k, v = (ref.gathered(inputs64[c], table, lens, b) for c in ("k_cache", "v_cache"))
        allowed[b] = sequence_allowance(q[b], k, v, o[b], _scale_of(case), p) + \
            split_allowance(q[b], k, v, o[b], _scale_of(case), p, splits)
    assert_close("o", outs["o"], to_numpy(outs1["o"]), allowed.reshape(outs["o"].shape),
                 dtype=getattr(torch, case.dtype), record=False,
                 what=f"num_splits={splits} != num_splits=1 (sequence lengths {list(lens)})")


# ------------------------------------------------------------------ the record's side pieces

def _baseline(case, values, outs):
    from tritoncheck.controls.paged_decode_attention import gathered_naive_torch
    return gathered_naive_torch(*(values[a] for a in case.args))


def _valid_call(dims, device):
    """q [B, T, H, D] with T = 1 .. 3 query tokens, num_splits None, 2 or 3 (by ``m``)."""
    b, h, n, d = dims["b"], dims["h"], dims["n"], dims["d"]
    page_size = 4
    pages_per = -(-n // page_size)
    table = torch.randperm(b * pages_per + 1)[:b * pages_per].reshape(b, pages_per).to(torch.int32).to(device)
    return {"q": randn((b, 1 + dims["m"] % 3, h, d), device),
            "k_cache": randn((b * pages_per + 1, page_size, h, d), device),
            "v_cache": randn((b * pages_per + 1, page_size, h, d), device), "block_table": table,
            "seq_lens": torch.tensor([n - (i % 2) for i in range(b)], dtype=torch.int32, device=device),
            "sm_scale": None, "num_splits": (None, 2, 3)[dims["m"] % 3]}


def _set(t: torch.Tensor, index, value) -> torch.Tensor:
    out = t.clone()
    out[index] = value
    return out


_SPOILERS = (
    # q has rank 3 or 4 (T = 1 query token, or T): the rank spoilers are 2 and 5, and T = 0
    tensor_spoilers("q", fixed_rank=False)
    + (Spoiler("q", "rank 2", lambda a: a["q"][0, 0]), Spoiler("q", "rank 5", lambda a: a["q"][None]),
       Spoiler("q", "no query token (T = 0)", lambda a: a["q"][:, :0]))
    + tensor_spoilers("k_cache", fixed_rank=True)
    + tensor_spoilers("v_cache", fixed_rank=True)
    + tensor_spoilers("block_table", fixed_rank=True, integer=True)
    + tensor_spoilers("seq_lens", fixed_rank=True, integer=True)
    + (Spoiler("k_cache", "a head dim other than q's", lambda a: torch.cat([a["k_cache"], a["k_cache"][..., :1]], -1)),
       Spoiler("v_cache", "float16 while q is float32", lambda a: a["v_cache"].half()),
       Spoiler("v_cache", "one page more than k_cache", lambda a: torch.cat([a["v_cache"], a["v_cache"][:1]])),
       Spoiler("k_cache", "a head count that does not divide q's",
               lambda a: torch.cat([a["k_cache"], a["k_cache"][:, :, :1]], dim=2)),
       Spoiler("block_table", "a live entry past the last page",
               lambda a: _set(a["block_table"], (0, 0), a["k_cache"].shape[0])),
       Spoiler("block_table", "a live entry of -1", lambda a: _set(a["block_table"], (0, 0), -1)),
       Spoiler("block_table", "one sequence fewer than q", lambda a: a["block_table"][1:]),
       Spoiler("seq_lens", "a negative length", lambda a: _set(a["seq_lens"], 0, -1)),
       Spoiler("seq_lens", "longer than the table's pages",
               lambda a: _set(a["seq_lens"], 0, a["block_table"].shape[1] * a["k_cache"].shape[1] + 1)),
       Spoiler("seq_lens", "float32", lambda a: a["seq_lens"].float()))
    + scalar_spoilers("sm_scale", (0.0, -0.5, math.nan, math.inf, "auto"))
    + scalar_spoilers("num_splits", (0, -2, 2.5, True, "2")))


register(OpSpec(
    name="paged_decode_attention",
    signature="paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None, num_splits=None)"
              " -> o",
    meaning="decode against a paged KV cache: `q [B, T, H, D]` the T >= 1 newest tokens of each sequence "
            "(speculative or chunked decode), `q [B, H, D]` meaning T = 1; `k_cache`, `v_cache` "
            "`[P, page_size, Hkv, D]` physical pages; `block_table [B, max_pages]` int32 maps sequence b's "
            "logical page p to a physical page; `seq_lens [B]` int32 its cached tokens, the query tokens' own "
            "included (0 .. max_pages * page_size). `o` (q's shape): query t of sequence b is its token "
            "`n - T + t` (n = seq_lens[b]) and is `attention` over the tokens j < n - T + 1 + t at slot "
            "`j % page_size` of page `block_table[b, j // page_size]` (GQA as there): the last T rows of the "
            "dense causal op on the gathered sequence; a row that sees no key (n - T + 1 + t <= 0: "
            "`seq_lens[b] = 0`, or fewer tokens than T) gives `o = 0`, as varlen_attention's bottom-right rows. "
            "`num_splits` (None or an int >= 1; None and 1: one pass) S > 1 is split-K decode: sequence b's "
            "keys are cut into S chunks of cdiv(n, S) positions (chunk c: [c L, min((c + 1) L, n)), empty ones "
            "contribute nothing), each row's attention over its part of each chunk is computed with its lse, "
            "both kept in float32, and the parts are merged in float32 (weights exp(lse_c - max lse), "
            "normalised); the result is within the merge's derived allowance of the unsplit one. An "
            "implementation whose signature takes no `num_splits` skips `split_k_equals_unsplit`. Table "
            "entries past a sequence's live pages, free pages and slots past its length are never read (they "
            "may hold anything). No gradient.",
    scalars=("sm_scale", "num_splits"),
    # negative axes: q is [B, H, D] or [B, T, H, D]
    dims={"H": ("q", -2), "Hkv": ("k_cache", 2), "D": ("q", -1)},
    choices={"sm_scale": SM_SCALES, "num_splits": NUM_SPLITS},
    arguments=ARGS,
    outputs=("o",),
    kernel="tritoncheck.kernels.paged_decode_attention:paged_decode_attention",
    controls=("tritoncheck.controls.paged_decode_attention:gathered_naive_torch",),
    baseline=_baseline,
    # two query tokens and split-K: each token's and each chunk's cache offsets past int32
    large_problem=LargeProblem(paged_cache(16, 8, 128, queries=2, num_splits=3), "rows",
                               ("q", "block_table", "seq_lens")),
    bad_input=BadInput(_valid_call, _SPOILERS),
    reference=ref.paged_decode_attention,
    torch_reference=ref.paged_decode_attention_torch,
    cases=paged_decode_cases,
    tolerance=paged_decode_tolerance,
    checks=generic_checks(grad=False) + (
        Check("page_permutation_invariant", page_permutation_invariant),
        Check("free_pages_never_read", free_pages_never_read),
        Check("page_size_invariant", page_size_invariant),
        Check("decode_is_last_rows_of_dense_causal", decode_is_last_rows_of_dense_causal),
        Check("split_k_equals_unsplit", split_k_equals_unsplit, cases=_split_cases, needs_arguments=("num_splits",)),
    ),
))
