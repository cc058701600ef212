"""linear_cross_entropy(x, weight, target, ignore_index, softcap, reduction): strategy,
tolerance binding and properties.

The domain: finite ``x`` and ``weight`` whose logits ``x @ weight.T`` are finite in fp32
(the families below stay far inside it), targets in ``[0, V)`` or ``ignore_index``,
``softcap`` 0 (off) or positive, the three reductions. Under ``"mean"`` with every row
ignored the loss is NaN (0 / 0, as ``F.cross_entropy``), compared as NaN.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck import backend, shape_pool
from tritoncheck.backend import BF16_DOT_ON_INTERPRETER
from tritoncheck.bad_input import BadInput, Spoiler, randn, scalar_spoilers, tensor_spoilers, widen_last
from tritoncheck.config import CONFIG
from tritoncheck.declarations import BF16_DOT_UPCAST, CHUNK_SIZES
from tritoncheck.generic import _backward, generic_checks, precision, run, with_upstream
from tritoncheck.large_problem import LargeProblem, rows_past_int32
from tritoncheck.large_problem import randn as large_randn
from tritoncheck.limits import NO_LIMITS, Limits
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.properties import linear_cross_entropy_tolerance as rules
from tritoncheck.references import linear_cross_entropy as ref
from tritoncheck.registry import OPS, Check, Implementation, OpSpec, register, resolve
from tritoncheck.strategies import Case, TensorSpec, tensors

V_BLOCKS = (32, 128)  # the kernel's default vocabulary chunk (interpreter, GPU): V past it loops
ROW_BLOCKS = (16, 64)  # its row blocks: N past one accumulates dweight over row blocks
H_BLOCKS = (32, 64)  # its hidden slices
IGNORE_INDICES = (-100, 0, -1)  # as cross_entropy's: the default, and values inside [0, V) / negative
SOFTCAPS = (0.0, 30.0, 1.0)  # off; Gemma 2's 30; 1, where most logits saturate
REDUCTIONS = ("mean", "sum", "none")
X_FAMILIES = ("normal", "constant", "outlier", "tiny", "offset")
# no "constant" weight: every class would get the same logit, p = 1 / V, and dx = sum_j g_j w
# = w sum_j g_j cancels to exactly 0, where any allowance is vacuous (the gradient checks discard
# such examples; a 4-example control hunt met only those). Constant x rows stay.
WEIGHT_FAMILIES = ("normal", "outlier")
SCALES = (1.0, 0.1, 3.0, 1e-3)
LARGE_V, LARGE_H = 4099, 256  # the large-index problem: x [N, 256] past 2**31 elements, V one past 4096


@st.composite
def linear_cross_entropy_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """x [N, H] and weight [V, H] in any layouts, targets in [0, V) with some rows set to
    ignore_index, a softcap and a reduction. On the interpreter (every example runs three
    kernels that recompute the logits tile by tile, a Python loop each) H stays within two
    hidden slices (mostly one), V within four vocabulary chunks (rarely 300) and N within
    two row blocks: past one of each, where the chunk and accumulation bugs live. On a GPU
    N * V stays within 2**22 (the fp64 reference materialises the logits)."""
    h = draw(limits.size("H", 1, CONFIG.pick(34, 1024), blocks=H_BLOCKS))
    v = draw(limits.length("linear_cross_entropy", "V", 1, CONFIG.pick(100, 8192),
                           long_max=CONFIG.pick(300, 2**17 + 3), long_percent=CONFIG.long_percent(3), blocks=V_BLOCKS))
    max_rows = max(1, min(CONFIG.pick(24, 512), CONFIG.pick(2**12, 2**22) // v))
    n = draw(limits.size("N", 1, max_rows, blocks=ROW_BLOCKS))
    x = draw(tensors((n, h), dtype, families=X_FAMILIES, scales=SCALES))
    weight = draw(tensors((v, h), dtype, families=WEIGHT_FAMILIES, scales=SCALES))
    ignore_index = draw(st.sampled_from(IGNORE_INDICES))
    ignored = draw(st.lists(st.integers(0, n - 1), max_size=2))
    # int64 targets in [0, V), contiguous (a strided int layout cannot be built: gaps are NaN)
    target = TensorSpec(shape=(n,), dtype="int64", family="indices", scale=float(v),
                        seed=draw(st.integers(0, 2**32 - 1)), layout=None,
                        injections=tuple((i, float(ignore_index)) for i in ignored))
    return Case("linear_cross_entropy", str(dtype).replace("torch.", ""),
                ("x", "weight", "target", "ignore_index", "softcap", "reduction"),
                {"x": x, "weight": weight, "target": target},
                {"ignore_index": ignore_index, "softcap": draw(limits.choice("softcap", SOFTCAPS)),
                 "reduction": draw(limits.choice("reduction", REDUCTIONS))})


def _scalars(case: Case) -> tuple[int, float, str]:
    return int(case.params["ignore_index"]), float(case.params["softcap"]), str(case.params["reduction"])


# ------------------------------------------------------------------ tolerance binding

def linear_cross_entropy_tolerance(case, inputs64, expected, p):
    ii, cap, red = _scalars(case)
    return {"loss": rules.linear_cross_entropy(inputs64["x"], inputs64["weight"], inputs64["target"], ii, cap, red,
                                               expected["loss"], p)}


def linear_cross_entropy_grad_tolerance(case, inputs64, outputs64, grads64, p):
    ii, cap, red = _scalars(case)
    allowed = rules.linear_cross_entropy_grad(inputs64["x"], inputs64["weight"], inputs64["target"], ii, cap, red,
                                              inputs64["dloss"], grads64["x"], grads64["weight"], p)
    return {"dx": allowed["dx"], "dweight": allowed["dweight"]}


def _loss_allowance(case: Case, impl: Implementation, values, reduction: str | None = None) -> np.ndarray:
    ii, cap, red = _scalars(case)
    red = reduction or red
    x64, w64, target = to_numpy(values["x"]), to_numpy(values["weight"]), values["target"].cpu().numpy()
    want = ref.linear_cross_entropy(x64, w64, target, ii, cap, red)
    return rules.linear_cross_entropy(x64, w64, target, ii, cap, red, want, precision(impl, case))


def _grad_allowance(case: Case, impl: Implementation, values) -> dict[str, np.ndarray]:
    ii, cap, red = _scalars(case)
    x64 = values["x"].detach().to(torch.float64).requires_grad_(True)
    w64 = values["weight"].detach().to(torch.float64).requires_grad_(True)
    loss = ref.linear_cross_entropy_torch(x64, w64, values["target"], ii, cap, red)
    dx, dw = torch.autograd.grad(loss, (x64, w64), values["dloss"].to(torch.float64))
    return rules.linear_cross_entropy_grad(x64.detach(), w64.detach(), values["target"], ii, cap, red,
                                           values["dloss"], dx, dw, precision(impl, case))


# ------------------------------------------------------------------ properties

@st.composite
def _with_ignored_row(draw, op: OpSpec, dtype: torch.dtype) -> Case:
    """The op's cases with an upstream gradient, and at least one ignored row."""
    case = draw(with_upstream(op, dtype))
    t = case.tensors["target"]
    row = draw(st.integers(0, t.shape[0] - 1))
    spec = TensorSpec(**{**t.__dict__, "injections": t.injections + ((row, float(case.params["ignore_index"])),)})
    return case.replace(tensors={"target": spec})


def ignored_rows_zero(case: Case, impl: Implementation) -> None:
    """Rows whose target is ignore_index contribute exactly nothing: their loss is exactly 0
    (``reduction="none"``), their dx rows are exactly 0, and giving them other x (the row
    negated and reversed: exact, finite) leaves the loss and dweight bit for bit as they
    were, under the case's reduction (a zero gradient row adds exact zeros to dweight)."""
    ii, _, red = _scalars(case)
    values = case.materialise(backend.device())
    ignored = values["target"] == ii
    assume(bool(ignored.any()))  # _with_ignored_row injects one; a replayed case may lack it
    _, rows = run(case, impl, {**values, "reduction": "none"})
    bad = torch.nonzero(ignored & (rows["loss"].detach() != 0)).flatten()
    if bad.numel():
        i = int(bad[0])
        raise AssertionError(f"target[{i}] == ignore_index = {ii}, but its loss (reduction='none') is "
                             f"{rows['loss'][i].item()!r}, not 0 ({bad.numel()} such rows)")
    if not impl.supports_backward:
        return
    op = OPS[case.op]
    outs, grads = _backward(op, case, impl, dict(values))
    ign = ignored.to(grads["x"].device)
    assert_identical("dx", torch.zeros_like(grads["x"][ign]), grads["x"][ign],
                     f"the dx rows of ignored targets (rows {torch.nonzero(ignored).flatten().tolist()}) are not 0")
    other = values["x"].clone()
    other[ign] = -values["x"][ign].flip(-1)
    outs2, grads2 = _backward(op, case, impl, {**values, "x": other})
    assert_identical("loss", outs["loss"].detach(), outs2["loss"].detach(),
                     f"the loss (reduction={red!r}) changed when only ignored rows' x changed")
    assert_identical("dweight", grads["weight"], grads2["weight"], "dweight changed when only ignored rows' x changed")


@st.composite
def _with_permutation(draw, op: OpSpec, dtype: torch.dtype) -> Case:
    case = draw(with_upstream(op, dtype))
    return Case(case.op, case.dtype, case.args, case.tensors,
                {**case.params, "permutation_seed": draw(st.integers(0, 2**32 - 1))}, case.kwargs)


def _permutation(v: int, ignore_index: int, seed: int) -> torch.Tensor:
    """A permutation of the V classes; a class equal to ignore_index stays in place (a live
    target relabelled onto it would become ignored)."""
    perm = np.random.default_rng(seed).permutation(v)
    if 0 <= ignore_index < v:
        rest = perm[perm != ignore_index]
        perm = np.insert(rest, ignore_index, ignore_index)
    return torch.from_numpy(perm)


def vocabulary_permutation(case: Case, impl: Implementation) -> None:
    """Permuting the rows of weight (W' = W[P]) and relabelling the targets to match
    (t' = P^-1(t); ignored rows stay ignored) gives the same loss, the same dx and the
    permuted dweight (dW' = dW[P]), within twice the derived allowances. Not bitwise:
    each logit is the same dot in both calls, but the logsumexp and the sums of dx and
    dweight meet the classes in another order."""
    ii, _, _ = _scalars(case)
    values = case.materialise(backend.device())
    seed = int(case.params.get("permutation_seed", 0))
    w, target = values["weight"], values["target"]
    perm = _permutation(w.shape[0], ii, seed).to(w.device)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    live = target != ii
    moved = {**values, "weight": w[perm].contiguous(), "target": torch.where(live, inverse[target.clamp(min=0)], target)}
    op = OPS[case.op]
    if impl.supports_backward:
        outs, grads = _backward(op, case, impl, dict(values))
        outs2, grads2 = _backward(op, case, impl, dict(moved))
    else:
        (_, outs), (_, outs2), grads = run(case, impl, values), run(case, impl, moved), None
    assert_close("loss", outs2["loss"].detach(), to_numpy(outs["loss"]), 2 * _loss_allowance(case, impl, values),
                 what="loss(x, W[P], P^-1(target)) != loss(x, W, target)", dtype=torch.float32, record=False)
    if grads is None:
        return
    allowed = _grad_allowance(case, impl, values)
    p = perm.cpu().numpy()
    assert_close("dx", grads2["x"], to_numpy(grads["x"]), 2 * allowed["dx"],
                 what="dx with W[P], P^-1(target) != dx with W, target", record=False)
    assert_close("dweight", grads2["weight"], to_numpy(grads["weight"])[p], 2 * allowed["dweight"][p],
                 what="dweight with W[P], P^-1(target) != dweight[P]", record=False)


def _declares_chunks(impl: Implementation) -> str | None:
    chunks = getattr(impl.fn, "chunk_sizes", None)
    return None if chunks else f"{impl.name} declares no chunk_sizes (no chunk_size keyword to vary)"


def chunk_size_invariant(case: Case, impl: Implementation) -> None:
    """Every chunk size the implementation declares (``fn.chunk_sizes``, passed as
    ``chunk_size=``) gives the same loss and gradients, within twice the derived
    allowances (each is within them of the same fp64 values). A chunk boundary that drops
    or repeats a column, or a dweight that loses a chunk, moves with the chunk size.
    With ``--shape-classes`` (opt-in) it compares two neighbouring declared sizes, chosen per run
    (``shape_pool.run_subset``): each size is a compilation of the three kernels per
    variant and dtype, three quarters of the op's; the gpu profile compares them all."""
    values = case.materialise(backend.device())
    chunks = shape_pool.run_subset("linear_cross_entropy", "chunk_size", impl.fn.chunk_sizes, 2)
    op = OPS[case.op]
    results = {}
    for c in chunks:
        call = case.replace(tensors={}, chunk_size=c)
        results[c] = _backward(op, call, impl, dict(values)) if impl.supports_backward else (
            run(call, impl, values)[1], None)
    loss_allowed = 2 * _loss_allowance(case, impl, values)
    grad_allowed = _grad_allowance(case, impl, values) if impl.supports_backward else {}
    first = chunks[0]
    for c in chunks[1:]:
        what = f"chunk_size={c} disagrees with chunk_size={first}"
        assert_close("loss", results[c][0]["loss"].detach(), to_numpy(results[first][0]["loss"]), loss_allowed,
                     what=what, dtype=torch.float32, record=False)
        if results[c][1] is not None:
            for name in ("x", "weight"):
                assert_close(f"d{name}", results[c][1][name], to_numpy(results[first][1][name]),
                             2 * grad_allowed[f"d{name}"], what=what, record=False)


def agrees_with_cross_entropy(case: Case, impl: Implementation) -> None:
    """The loss equals the project's ``cross_entropy`` kernel (whatever implementation a run
    puts under test for that op) on the materialised fp32 logits ``x @ weight.T`` (softcapped in
    fp32), reduced as the contract says, within the combined allowance: the linear rule
    twice, since each side forms fp32 logits of the same dots and takes an fp32
    logsumexp of them, so each is within that rule of the same fp64 loss."""
    ii, cap, red = _scalars(case)
    values, outs = run(case, impl)
    z = values["x"].float() @ values["weight"].float().T
    if cap > 0:
        z = cap * torch.tanh(z / cap)
    rows = resolve(OPS["cross_entropy"].kernel)(z, values["target"], ii)
    want = ref.reduce(rows.detach().double(), values["target"], ii, red)
    assert_close("loss", outs["loss"].detach(), to_numpy(want), 2 * _loss_allowance(case, impl, values),
                 what="linear_cross_entropy(x, W) != cross_entropy(x @ W.T), reduced", dtype=torch.float32,
                 record=False)


# ------------------------------------------------------------------ the record's side pieces

def _baseline(case, values, outs):
    """Plain PyTorch in the input dtype: the logits x @ W.T (and the softcap) in it, then
    ``F.cross_entropy`` of them upcast (the loss is float32 by the contract)."""
    z = values["x"] @ values["weight"].T
    cap = float(values["softcap"])
    if cap > 0:
        z = cap * torch.tanh(z / cap)
    return F.cross_entropy(z.float(), values["target"], ignore_index=int(values["ignore_index"]),
                           reduction=values["reduction"])


def _large_problem(dtype, device):
    """x [N, 256] past 2**31 elements (N = 8.4M rows) and a vocabulary one past 4096, so
    N * V (3.4e10) and N * H both pass 2**31; about 9 GiB of x and dx in bfloat16."""
    n = rows_past_int32(LARGE_H)
    return {"x": large_randn((n, LARGE_H), dtype, device), "weight": large_randn((LARGE_V, LARGE_H), dtype, device),
            "target": torch.randint(0, LARGE_V, (n,), device=device)}


def _valid_call(dims, device):
    b, n, d = dims["b"], dims["n"], dims["d"]
    return {"x": randn((b, d), device), "weight": randn((n, d), device),
            "target": torch.randint(0, n, (b,), device=device), "ignore_index": -100, "softcap": 0.0,
            "reduction": "mean"}


BAD_INPUT = BadInput(
    _valid_call,
    tensor_spoilers("x", fixed_rank=True) + tensor_spoilers("weight", fixed_rank=True)
    + tensor_spoilers("target", fixed_rank=True, integer=True)
    + (Spoiler("weight", "a longer hidden dim than x's", lambda a: widen_last(a["weight"])),
       Spoiler("weight", "float16 while x is float32", lambda a: a["weight"].half()),
       Spoiler("target", "one row more than x", lambda a: torch.cat([a["target"], a["target"][:1]])),
       Spoiler("target", "a class index equal to V", lambda a: torch.full_like(a["target"], a["weight"].shape[0])),
       Spoiler("target", "a negative class index", lambda a: torch.full_like(a["target"], -3)),
       Spoiler("x", "an empty hidden dim", lambda a: a["x"][:, :0]))
    + scalar_spoilers("ignore_index", (1.5, "none"))
    + scalar_spoilers("softcap", (-1.0, float("nan"), float("inf"), "30", True))
    + scalar_spoilers("reduction", ("avg", None, 0)))


register(OpSpec(
    name="linear_cross_entropy",
    backend_limits=(BF16_DOT_ON_INTERPRETER,),
    declarations=(BF16_DOT_UPCAST, CHUNK_SIZES),
    signature='linear_cross_entropy(x, weight, target, ignore_index=-100, softcap=0.0, reduction="mean") -> loss',
    meaning="`x [N, H]`, `weight [V, H]`, `target [N]` int64; the logits `z = x @ weight.T` (with `softcap > 0`: "
            "`softcap * tanh(z / softcap)`) need never be stored; per row `lse(z[i]) - z[i, target[i]]`, exactly 0 "
            "where `target[i] == ignore_index`; `reduction` `\"none\"` (`[N]`), `\"sum\"`, or `\"mean\"` over the "
            "rows not ignored (0-dim; NaN when every row is ignored, as `F.cross_entropy`); the loss is float32",
    scalars=("ignore_index", "softcap", "reduction"),
    dims={"N": ("x", 0), "H": ("x", 1), "V": ("weight", 0)},
    choices={"softcap": SOFTCAPS, "reduction": REDUCTIONS},
    arguments=("x", "weight", "target", "ignore_index", "softcap", "reduction"),
    outputs=("loss",),
    kernel="tritoncheck.kernels.linear_cross_entropy:linear_cross_entropy",
    controls=("tritoncheck.controls.linear_cross_entropy:torch_linear_cross_entropy",
              "tritoncheck.controls.linear_cross_entropy:chunked_torch_linear_cross_entropy"),
    baseline=_baseline,
    large_problem=LargeProblem(_large_problem, "rows", ("x", "target"), whole_sum_grads=("weight",),
                               params={"reduction": "none"}),
    bad_input=BAD_INPUT,
    reference=ref.linear_cross_entropy,
    torch_reference=ref.linear_cross_entropy_torch,
    cases=linear_cross_entropy_cases,
    tolerance=linear_cross_entropy_tolerance,
    grad_tolerance=linear_cross_entropy_grad_tolerance,
    grad_inputs=("x", "weight"),
    grad_outputs=("loss",),
    output_shapes=lambda case: {"loss": (case.tensors["x"].shape[0],) if case.params["reduction"] == "none" else ()},
    output_dtypes={"loss": torch.float32},
    checks=generic_checks(grad=True) + (
        Check("ignored_rows_zero", ignored_rows_zero, cases=_with_ignored_row),
        Check("vocabulary_permutation", vocabulary_permutation, cases=_with_permutation),
        Check("chunk_size_invariant", chunk_size_invariant, cases=with_upstream, requires=_declares_chunks),
        Check("agrees_with_cross_entropy", agrees_with_cross_entropy),
    ),
))
