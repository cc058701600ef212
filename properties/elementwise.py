"""rope(x, cos, sin) and swiglu(gate, up): strategies, tolerance binding and properties."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from hypothesis import strategies as st

from tritoncheck.bad_input import BadInput, Spoiler, randn, tensor_spoilers, widen_last
from tritoncheck.config import CONFIG
from tritoncheck.generic import UPSTREAM_FAMILIES, generic_checks, precision, run, with_upstream
from tritoncheck.large_problem import LargeProblem, row_wise, rows_past_int32
from tritoncheck.large_problem import randn as large_randn
from tritoncheck.limits import NO_LIMITS, Limits
from tritoncheck.oracle import assert_close, to_numpy
from tritoncheck.parity import control_baseline
from tritoncheck.properties import elementwise_tolerance as rules
from tritoncheck.references import elementwise as ref
from tritoncheck.registry import Check, Implementation, OpSpec, register
from tritoncheck.strategies import Case, Layout, TensorSpec, layouts, sizes, special_values, tensors
from tritoncheck.tolerance import reference_precision

# cos and sin must come from real angles, as every model builds them: the spine's
# "cos_of_angles" / "sin_of_angles" families (tritoncheck/strategies.py) rebuild a
# [S, D/2] table from its seed; a cos spec and a sin spec with the same seed, shape
# and scale share theta.
ANGLE_FAMILIES = ("cos_of_angles", "sin_of_angles")

# ------------------------------------------------------------------------------ rope

ROPE_PAIR_BLOCKS = (16, 128)  # the kernel's pair-block caps (interpreter, GPU)
ROPE_ROW_TILES = (16, 128)  # rows per tile, 256 / BLOCK_P interpreted: 16 at the pair-block cap, 128 at D = 2
TABLE_STARTS = (1.0, 4096.0, 2.0**20)  # first positions of the schedule: 0, up to 4k, up to 1M


def _bshd(draw, base: Layout) -> Layout:
    """Half the layouts are the [B, S, H, D] memory order seen as [B, H, S, D] (the
    transposed view attention code passes), keeping base's step and offset."""
    if draw(st.booleans()):  # shrinks toward False: base's order
        return dataclasses.replace(base, order=(0, 2, 1, 3))
    return base


@st.composite
def rope_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """x [B, H, S, D] with D even (pairs past one pair block included), tables
    [S, D/2] of real angles in x's dtype or another float dtype (fp32 tables with
    low-precision x are what models use).

    The domain: |x| <= max / 2 of x's dtype: a rotated pair can grow one component
    to sqrt(2) max|x| (x_2i c - x_2i+1 s with c = -s = 1/sqrt 2), which must not
    overflow the dtype. x holds no inf or NaN (the contract does not define them).
    """
    half = draw(limits.halved("D").specialised("rope", "D", 1, CONFIG.pick(40, 256), blocks=ROPE_PAIR_BLOCKS))
    budget = CONFIG.pick(2**12, 2**20) // half  # B * H * S; x has 2 * half times as many elements
    s = draw(limits.size("S", 1, max(1, min(CONFIG.pick(48, 8192), budget)), blocks=ROPE_ROW_TILES))
    b = draw(limits.specialised("rope", "B", 1, max(1, min(CONFIG.pick(3, 8), budget // s)),
                                span=(1, CONFIG.pick(3, 8))))
    h = draw(limits.specialised("rope", "H", 1, max(1, min(CONFIG.pick(4, 64), budget // (s * b))),
                                span=(1, CONFIG.pick(4, 64))))
    shape = (b, h, s, 2 * half)
    cap = float(torch.finfo(dtype).max) / 2
    x = draw(tensors(shape, dtype, families=("normal", "near_max", "tiny", "constant", "outlier", "offset"),
                     max_magnitude=cap, specials=special_values(dtype, max_magnitude=cap), layout=False))
    x = dataclasses.replace(x, layout=_bshd(draw, draw(layouts(4))))
    others = tuple(d for d in (torch.float32, torch.bfloat16, torch.float16) if d != dtype)
    table_dtype = draw(st.sampled_from((dtype,) + others))
    seed = draw(st.integers(0, 2**32 - 1))
    start = draw(st.sampled_from(TABLE_STARTS))
    tables = {name: TensorSpec(shape=(s, half), dtype=str(table_dtype).replace("torch.", ""), family=family,
                               scale=start, seed=seed, layout=draw(layouts(2)))
              for name, family in zip(("cos", "sin"), ANGLE_FAMILIES)}
    return Case("rope", str(dtype).replace("torch.", ""), ("x", "cos", "sin"), {"x": x, **tables})


def rope_tolerance(case, inputs64, expected, p):
    table = getattr(torch, case.tensors["cos"].dtype)
    return {"y": rules.rope(inputs64["x"], inputs64["cos"], inputs64["sin"], expected["y"], table, p)}


def rope_grad_tolerance(case, inputs64, outputs64, grads64, p):
    # dx is the rotation of dy by -theta: the same two products and a sum per element.
    table = getattr(torch, case.tensors["cos"].dtype)
    return {"dx": rules.rope(inputs64["dy"], inputs64["cos"], -inputs64["sin"], grads64["x"], table, p)}


def pair_norms_preserved(case: Case, impl: Implementation) -> None:
    """Each interleaved pair (y_2i, y_2i+1) has the norm of (x_2i, x_2i+1) times
    sqrt(cos^2 + sin^2) of the tables as given (1 within their rounding for real angles):
    [[c, -s], [s, c]] is a scaled rotation. The allowance is derived for the norm
    (``rules.rope_pair_norm``: the two components' rounding errors in quadrature)."""
    values, outs = run(case, impl)
    x, c, s = (to_numpy(values[k]) for k in ("x", "cos", "sin"))
    y = to_numpy(outs["y"])
    norm, allowed = rules.rope_pair_norm(x, c, s, y, values["cos"].dtype, precision(impl, case))
    _, noise = rules.rope_pair_norm(x, c, s, y, values["cos"].dtype, reference_precision(precision(impl, case)))
    ny = np.hypot(y[..., 0::2], y[..., 1::2])
    assert_close("|(y_2i, y_2i+1)|", torch.from_numpy(ny), norm, allowed,
                 what="rope changed the norm of an interleaved pair", dtype=getattr(torch, case.dtype), record=False,
                 vacuity=True, noise=noise)



def _large_rope(s: int, d: int):
    def build(dtype, device):
        batch = math.ceil(rows_past_int32(s * d) / 16)
        theta = torch.rand((s, d // 2), device=device) * 6.2831853
        return {"x": large_randn((batch, 16, s, d), dtype, device), "cos": theta.cos().to(dtype),
                "sin": theta.sin().to(dtype)}
    return build


register(OpSpec(
    name="rope",
    signature="rope(x, cos, sin) -> y",
    meaning="`x [B, H, S, D]`, `D` even; `cos`, `sin` `[S, D // 2]`; interleaved pairs: "
            "`y[..., 2i] = x[..., 2i] cos[s, i] - x[..., 2i+1] sin[s, i]`, "
            "`y[..., 2i+1] = x[..., 2i] sin[s, i] + x[..., 2i+1] cos[s, i]`",
    dims={"B": ("x", 0), "H": ("x", 1), "S": ("x", 2), "D": ("x", 3)},
    arguments=("x", "cos", "sin"),
    outputs=("y",),
    kernel="tritoncheck.kernels.elementwise:rope",
    controls=("tritoncheck.controls.elementwise:torch_rope",),
    baseline=control_baseline("tritoncheck.controls.elementwise:torch_rope"),
    large_problem=LargeProblem(_large_rope(4096, 128), "heads", ("x",)),
    bad_input=BadInput(
        lambda dims, device: {"x": randn((dims["b"], dims["h"], dims["n"], 2 * dims["d"]), device),
                              "cos": randn((dims["n"], dims["d"]), device), "sin": randn((dims["n"], dims["d"]), device)},
        tensor_spoilers("x", fixed_rank=True) + tensor_spoilers("cos", fixed_rank=True)
        + tensor_spoilers("sin", fixed_rank=True)
        + (Spoiler("x", "an odd head dim", lambda a: a["x"][..., :-1]),
           Spoiler("cos", "one position more than x", lambda a: torch.cat([a["cos"], a["cos"][:1]])),
           Spoiler("sin", "a wider table than D // 2", lambda a: widen_last(a["sin"])))),
    reference=ref.rope,
    torch_reference=ref.rope_torch,
    cases=rope_cases,
    tolerance=rope_tolerance,
    grad_tolerance=rope_grad_tolerance,
    grad_inputs=("x",),
    grad_outputs=("y",),
    output_shapes=lambda case: {"y": case.tensors["x"].shape},
    checks=generic_checks(grad=True) + (
        Check("pair_norms_preserved", pair_norms_preserved),
    ),
))

# ---------------------------------------------------------------------------- swiglu

SWIGLU_BLOCKS = (256, 1024)  # elements per program (interpreter, GPU)
SWIGLU_FAMILIES = ("normal", "near_max", "tiny", "constant", "outlier", "offset")
GATE_SLOPE_MAX = 1.1  # max over g of d(g sigmoid(g))/dg = s + g s (1 - s) (1.0998 at g ~ 2.4)


def _swiglu_caps(dtype: torch.dtype) -> tuple[float, float]:
    """(cap of |gate| and |up|, cap of |dy|) that keep y and both gradients finite.

    The domain: y = gate sigmoid(gate) up, |y| <= |gate| |up|, finite in the dtype
    (and so in fp32): |gate|, |up| <= A = sqrt(max / 2). The backward multiplies dy by
    up (times at most GATE_SLOPE_MAX) and by gate sigmoid(gate): |dy| <= max / (2.2 A).
    For fp16 that is A = 181, well past where sigmoid saturates (|gate| > 89 overflows
    a naive exp(gate)); for fp32 and bf16 A = 1.3e19.
    """
    big = float(torch.finfo(dtype).max)
    a = math.sqrt(big / 2)
    return a, big / (2 * GATE_SLOPE_MAX * a)


@st.composite
def swiglu_cases(draw, dtype: torch.dtype, limits: Limits = NO_LIMITS) -> Case:
    """gate and up of one shape (rank 1 to 3, sizes past one program's block), each
    in any layout; large |gate| of both signs (sigmoid saturation), tiny, near the
    domain's limit (:func:`_swiglu_caps`). No inf or NaN (the contract does not
    define them: silu(-inf) is NaN)."""
    n = draw(limits.specialised("swiglu", "N", 1, CONFIG.pick(600, 2**16), blocks=SWIGLU_BLOCKS))
    max_rows = max(1, min(CONFIG.pick(8, 4096), CONFIG.pick(2**12, 2**20) // n))
    lead = tuple(draw(st.lists(sizes(1, max_rows), max_size=2).filter(lambda d: math.prod(d) <= max_rows)))
    shape = lead + (n,)
    cap, _ = _swiglu_caps(dtype)
    specials = special_values(dtype, max_magnitude=cap) + [100.0, -100.0, 88.0, -88.0]
    gate, up = (draw(tensors(shape, dtype, families=SWIGLU_FAMILIES, max_magnitude=cap, specials=specials))
                for _ in range(2))
    return Case("swiglu", str(dtype).replace("torch.", ""), ("gate", "up"), {"gate": gate, "up": up})


def _swiglu_with_upstream(op: OpSpec, dtype: torch.dtype) -> st.SearchStrategy[Case]:
    """generic.with_upstream with dy inside the domain (|dy| capped, so the true
    gradients are finite in the dtype)."""
    _, dy_cap = _swiglu_caps(dtype)

    def add(case: Case) -> st.SearchStrategy[Case]:
        dy = tensors(case.tensors["gate"].shape, dtype, families=UPSTREAM_FAMILIES, scales=(1.0, 1e-3, 1e3),
                     max_magnitude=dy_cap)
        return dy.map(lambda t: case.replace(tensors={"dy": t}))

    return op.cases(dtype).flatmap(add)


def swiglu_tolerance(case, inputs64, expected, p):
    return {"y": rules.swiglu(inputs64["gate"], inputs64["up"], expected["y"], p)}


def swiglu_grad_tolerance(case, inputs64, outputs64, grads64, p):
    a_gate, a_up = rules.swiglu_grad(inputs64["gate"], inputs64["up"], inputs64["dy"], grads64["gate"],
                                         grads64["up"], p)
    return {"dgate": a_gate, "dup": a_up}


def _swiglu_checks() -> tuple[Check, ...]:
    return tuple(dataclasses.replace(c, cases=_swiglu_with_upstream) if c.cases is with_upstream else c
                 for c in generic_checks(grad=True))


register(OpSpec(
    name="swiglu",
    signature="swiglu(gate, up) -> y",
    meaning="`y = gate * sigmoid(gate) * up`, elementwise, same shapes",
    dims={"N": ("gate", -1)},
    arguments=("gate", "up"),
    outputs=("y",),
    kernel="tritoncheck.kernels.elementwise:swiglu",
    controls=("tritoncheck.controls.elementwise:torch_swiglu",),
    baseline=control_baseline("tritoncheck.controls.elementwise:torch_swiglu"),
    large_problem=LargeProblem(row_wise(11008, "gate", "up"), "rows", ("gate", "up")),
    bad_input=BadInput(
        lambda dims, device: {"gate": randn((dims["b"], dims["n"]), device), "up": randn((dims["b"], dims["n"]), device)},
        tensor_spoilers("gate", fixed_rank=False) + tensor_spoilers("up", fixed_rank=False)
        + (Spoiler("up", "another shape than gate", lambda a: widen_last(a["up"])),
           Spoiler("up", "float16 while gate is float32", lambda a: a["up"].half()))),
    reference=ref.swiglu,
    torch_reference=ref.swiglu_torch,
    cases=swiglu_cases,
    tolerance=swiglu_tolerance,
    grad_tolerance=swiglu_grad_tolerance,
    grad_inputs=("gate", "up"),
    grad_outputs=("y",),
    output_shapes=lambda case: {"y": case.tensors["gate"].shape},
    checks=_swiglu_checks(),
))
