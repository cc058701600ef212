"""The block-scaled low-precision GEMM: kernel, references, rule, properties, controls.

Fast (Triton interpreter on CPU, or the GPU when the suite's backend picks it). The suite's
strategies and properties do the fuzzing (tests/test_checks.py --op scaled_mm); these pin
the pieces: every format and scale layout against the fp64 reference under the derived
rule, the properties on the inputs their bugs need, the declarations, the helpers.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from tritoncheck import backend, registry
from tritoncheck.controls import scaled_mm as controls
from tritoncheck.generic import precision
from tritoncheck.kernels.scaled_mm import scaled_mm
from tritoncheck.mutants import scaled_mm as mutants
from tritoncheck.properties import scaled_mm as props
from tritoncheck.properties import scaled_mm_tolerance as rules
from tritoncheck.references import quantisation as q
from tritoncheck.references import scaled_mm as refs
from tritoncheck.strategies import Case, TensorSpec
from tritoncheck.tolerance import Precision

DEVICE = backend.device()
OP = registry.load()["scaled_mm"]
FORMATS = q.FORMATS
A_GROUPS = {"tensor": (None, None), "row": (1, None), "block": (1, 128)}
B_GROUPS = {"tensor": (None, None), "column": (None, 1), "block": (128, 128), "block_column": (128, 1)}


def _operands(fmt, m, k, n, a_scaling, b_scaling, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    x[:, k // 2:] *= 40  # blocks of different amax: a scale read from the wrong block shows
    a, sa = q.quantise(x, fmt, A_GROUPS[a_scaling])
    b, sb = q.quantise(w, fmt, B_GROUPS[b_scaling])
    return a.to(DEVICE), b.to(DEVICE), sa.to(DEVICE), sb.to(DEVICE)


def _within_rule(c, a, b, sa, sb, bias, fn=scaled_mm) -> None:
    impl = registry.Implementation.of("scaled_mm", fn, kind="kernel")
    case = Case("scaled_mm", str(a.dtype)[6:], props.ARGS, {}, {"out_dtype": c.dtype})
    num = lambda t: None if t is None else t.detach().cpu().double().numpy()  # noqa: E731
    want = refs.scaled_mm(num(a), num(b), num(sa), num(sb), num(bias))
    allowed = rules.scaled_mm(num(a), num(b), num(sa), num(sb), num(bias), want, a.dtype, precision(impl, case))
    err = np.abs(c.double().cpu().numpy() - want)
    assert (err <= allowed).all(), f"max error / allowance {float((err / allowed).max()):.3g}"


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("a_scaling", list(A_GROUPS))
@pytest.mark.parametrize("b_scaling", list(B_GROUPS))
def test_every_format_and_scale_layout_matches_the_reference(fmt, a_scaling, b_scaling):
    """K = 300: a short last block; N = 130 for b's 128 x 128 blocks (a short one along N
    too); b transposed in memory (the weight's [N, K] storage)."""
    n = 130 if b_scaling == "block" else 20
    a, b, sa, sb = _operands(fmt, 17, 300, n, a_scaling, b_scaling)
    bias = torch.randn(n, device=DEVICE).to(torch.float16)
    c = scaled_mm(a, b.t().contiguous().t(), sa, sb, bias, torch.float16)
    assert c.dtype == torch.float16 and c.shape == (17, n)
    _within_rule(c, a, b, sa, sb, bias)


@pytest.mark.parametrize("out_dtype", props.OUT_DTYPES, ids=lambda d: str(d)[6:])
def test_out_dtypes_and_strided_scales(out_dtype):
    a, b, sa, sb = _operands(torch.float8_e4m3fn, 40, 257, 20, "block", "block", seed=3)
    sa_t = sa.t().contiguous().t()  # a_scale column-major, as DeepGEMM stores it
    c = scaled_mm(a[:, :], b, sa_t, sb, None, out_dtype)
    assert c.dtype == out_dtype
    _within_rule(c, a, b, sa, sb, None)


@pytest.mark.parametrize("fn", [controls.dequantised_matmul, controls.blockwise_matmul], ids=lambda f: f.__name__)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda d: str(d)[6:])
def test_controls_are_within_the_rule(fn, fmt):
    a, b, sa, sb = _operands(fmt, 17, 200, 140, "block", "column", seed=1)
    _within_rule(fn(a, b, sa, sb, None, torch.float32), a, b, sa, sb, None, fn=fn)


def test_quantise_round_trips_within_the_formats_precision():
    x = torch.randn(9, 300) * torch.logspace(-3, 3, 9)[:, None]
    for fmt, rel in ((torch.float8_e4m3fn, 2.0**-4), (torch.float8_e5m2, 2.0**-3)):
        qx, s = q.quantise(x, fmt, (1, 128))
        assert s.shape == (9, 3) and qx.dtype == fmt
        back = q.dequantise(qx, s, (1, 128))
        blockmax = q.expand(s.double(), x.shape, (1, 128)) * q.format_max(fmt)
        # normal values: within half an ulp of 3 (2) bits; the rest within the smallest subnormal's scale
        assert ((back - x.double()).abs() <= rel * x.double().abs() + blockmax * q.smallest(fmt) / q.format_max(fmt)
                ).all()


def test_scale_groups_are_read_from_the_shape_and_refused_otherwise():
    assert refs.a_groups((5, 3), (5, 300)) == (1, 128)
    assert refs.b_groups((1, 7), (300, 7)) == (None, 1)
    assert refs.b_groups((3, 2), (300, 130)) == (128, 128)
    with pytest.raises(ValueError, match="a_scale has 300 entries along axis 1"):
        refs.a_groups((5, 300), (5, 300))


def test_the_interpreter_misreads_e5m2_dot_operands():
    """The backend limit (tritoncheck/backend.py) is a fact of the interpreter: its fp8 dot
    decodes e5m2 through float16 and reads 2^-16 as 0. When this fails, Triton fixed it:
    drop the limit and the kernel's upcast."""
    if backend.current() != "interpret":
        pytest.skip("a fact of the Triton interpreter")
    import triton.language as tl
    from triton.runtime.interpreter import _convert_float
    subnormal = torch.tensor([2.0**-16], dtype=torch.float8_e5m2)
    read = _convert_float(subnormal.view(torch.uint8).numpy(), tl.float8e5, tl.float16, None).view(np.float16)
    assert float(read[0]) == 0.0
    assert backend.limit_for(registry.OPS["scaled_mm"], torch.float8_e5m2) is not None
    assert backend.limit_for(registry.OPS["scaled_mm"], torch.float8_e5m2, scaled_mm) is None  # waived: it upcasts there


# ------------------------------------------------------------------ properties on their inputs

def _case(fmt, m, k, n, a_scale_shape, b_scale_shape, out_dtype=torch.bfloat16, seed=5, **params) -> Case:
    spec = lambda shape, dt, fam="normal", scale=1.0, s=seed: TensorSpec(shape, str(dt)[6:], fam, scale, s)  # noqa: E731
    value_scale = 30.0 if fmt == torch.int8 else 1.0
    return Case("scaled_mm", str(fmt)[6:], props.ARGS,
                {"a": spec((m, k), fmt, scale=value_scale), "b": spec((k, n), fmt, scale=value_scale, s=seed + 1),
                 "a_scale": spec(a_scale_shape, torch.float32, "scales", 1e-2, seed + 2),
                 "b_scale": spec(b_scale_shape, torch.float32, "scales", 1e-2, seed + 3)},
                {"bias": None, "out_dtype": out_dtype, **params})


def _impl(fn):
    return registry.Implementation.of("scaled_mm", fn, kind="mutant" if fn is not scaled_mm else "kernel")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda d: str(d)[6:])
def test_the_bf16_dress_up_fails_computes_in_input_format_and_the_kernel_passes(fmt):
    case = _case(fmt, 8, 41, 9, (8, 1), (1, 9))
    props.computes_in_input_format(case, _impl(scaled_mm))
    with pytest.raises(AssertionError, match="not that of the quantised values"):
        props.computes_in_input_format(case, _impl(mutants.dequantised_in_bf16))


def test_the_tail_blocks_scale_from_the_previous_block_moves_under_scale_block_invariant():
    """K = 300: blocks 0, 1 and a short block 2; the region is the last K block half the time."""
    case = _case(torch.float8_e4m3fn, 6, 300, 5, (6, 3), (3, 1))
    moved = 0
    for seed in range(8):
        c = dataclasses.replace(case, params={**case.params, "region_seed": seed})
        props.scale_block_invariant(c, _impl(scaled_mm))
        try:
            props.scale_block_invariant(c, _impl(mutants.tail_block_scale_from_previous))
        except AssertionError as exc:
            assert "changed c" in str(exc)
            moved += 1
    assert moved >= 1


def test_tile_first_row_scales_fail_rows_independent():
    case = _case(torch.int8, 6, 40, 5, (6, 1), (1, 1))
    props.rows_independent(case, _impl(scaled_mm))
    with pytest.raises(AssertionError, match="row 3 of c changed"):
        props.rows_independent(case, _impl(mutants.a_scale_of_tile_first_row))


# ------------------------------------------------------------------ the rule and the declaration

def test_a_declared_fp8_accumulation_is_charged_on_cuda_only():
    a, b, sa, sb = (t.cpu() for t in _operands(torch.float8_e4m3fn, 4, 512, 4, "row", "column"))
    num = [t.double().numpy() for t in (a, b, sa, sb)]
    want = refs.scaled_mm(*num)
    base = Precision.of(torch.bfloat16, "cuda")
    fp32 = rules.scaled_mm(*num, None, want, torch.float8_e4m3fn, base)
    declared = rules.scaled_mm(*num, None, want, torch.float8_e4m3fn, dataclasses.replace(base, fp8_accumulation=(13, 128)))
    assert (declared > fp32).all()
    s = rules.magnitudes(*num, device="cpu")[2].numpy()
    # the declared charge: SAFETY * min(L, K) 2^-F of S
    assert np.allclose(declared - fp32, 2 * 128 * 2.0**-13 * s, rtol=1e-9)
    int8 = rules.scaled_mm(*num, None, want, torch.int8, dataclasses.replace(base, fp8_accumulation=(13, 128)))
    assert np.allclose(int8, fp32)  # int8 sums are exact in int32: no fp8 accumulation to charge


@pytest.mark.parametrize("value", [{"fraction_bits": 13}, {"fraction_bits": 0, "promote_every": 32},
                                   {"fraction_bits": 13, "promote_every": 0}, (13, 32),
                                   {"fraction_bits": 13.0, "promote_every": None}])
def test_a_bad_fp8_accumulation_declaration_is_an_error(value):
    def kernel(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
        raise AssertionError("not called")
    kernel.fp8_accumulation = value
    with pytest.raises(ValueError, match="fp8_accumulation must be"):
        registry.Implementation.of("scaled_mm", kernel)


def test_the_nk_layout_passes_b_as_n_by_k():
    seen = []

    def nk(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16):
        seen.append((tuple(b.shape), tuple(b_scale.shape)))
        return scaled_mm(a, b.t(), a_scale, b_scale.t(), bias, out_dtype)
    nk.layout = "nk"
    case = _case(torch.float8_e4m3fn, 5, 300, 7, (5, 3), (3, 1))
    check = {c.name: c for c in OP.checks}["matches_reference"]
    check.run(case, registry.Implementation.of("scaled_mm", nk))
    assert seen[0] == ((7, 300), (1, 3))


# ------------------------------------------------------------------ the strategy's domain

@settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=OP.cases(torch.float8_e5m2))
def test_drawn_results_stay_inside_the_output_dtype(case):
    values = case.materialise("cpu")
    num = {k: (v.double().numpy() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}
    c = refs.scaled_mm(*(num[a] for a in props.ARGS))
    assert np.abs(c).max() <= torch.finfo(case.params["out_dtype"]).max / 16
