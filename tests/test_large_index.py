"""The large-index check (``-m large``): every op on an input past 2**31 elements, on the
GPU (see tritoncheck/large_index.py). Skipped with the reason on the CPU (the interpreter
would take hours over 2**31 elements) and where the GPU has too little memory free.

    python -m pytest tests/test_large_index.py -m large [--impl OP=module:function]
"""
import contextlib
import fcntl
import tempfile
from pathlib import Path

import pytest
import torch

from tritoncheck import backend, registry
from tritoncheck.large_index import bytes_needed, check, values_of, verdict_of

pytestmark = pytest.mark.large
DTYPE_PREFERENCE = (torch.bfloat16, torch.float16, torch.float32)


def _why_not(op: str, dtype: torch.dtype) -> str | None:
    if backend.current() != "cuda":
        return "the large-index check runs on CUDA only: under the interpreter 2**31 elements would take hours"
    free, _ = torch.cuda.mem_get_info()
    need = bytes_needed(op, dtype)
    if free < need:
        return f"{op} past 2**31 elements needs about {need / 2**30:.0f} GiB of GPU memory, {free / 2**30:.0f} GiB free"
    return None


@contextlib.contextmanager
def _one_at_a_time():
    """One large-index run per machine at a time: each takes tens of GiB, and xdist workers
    (or two pytest runs) would otherwise take the GPU's memory from each other."""
    with open(Path(tempfile.gettempdir()) / "tritoncheck-large-index.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)


def _ops():
    """Every op; one whose record declares the large problem not applicable is skipped with the reason."""
    return [pytest.param(op, marks=pytest.mark.skip(reason=f"{op}: {spec.large_problem.reason}"))
            if isinstance(spec.large_problem, registry.NotApplicable) else op
            for op, spec in sorted(registry.load().items())]


@pytest.mark.parametrize("op", _ops())
def test_every_op_builds_every_argument_past_int32(op):
    """The check calls each op with every argument of its signature: what the record's
    large_problem builds (on the meta device here: shapes without memory), the rest at the
    reference's defaults. A scalar added to an op without a default there needs its value in
    the problem's params, or the GPU run fails with a KeyError (it did, on an H100, when
    attention's dropout_p was copied into a side table and forgotten)."""
    spec = registry.OPS[op]
    assert spec.large_problem is not None, f"{op}'s record declares no large_problem"
    values = values_of(op, torch.bfloat16, torch.device("meta"))
    assert set(spec.arguments) <= set(values), f"{op}: no value for {sorted(set(spec.arguments) - set(values))}"
    # the largest tensor passes 2**31: a sliced one, or one passed whole to every slice (a
    # paged KV cache, read through the sliced block tables)
    largest = max(v.numel() for v in values.values() if isinstance(v, torch.Tensor))
    assert largest > 2**31, f"{op}: the largest argument, {largest} elements, does not pass 2**31"


def _targets():
    registry.load()
    out = []
    for op in sorted(registry.OPS):
        impls = registry.implementations(op)  # under --impl: the user's only
        if impls and isinstance(registry.OPS[op].large_problem, registry.NotApplicable):
            out.append(pytest.param(op, None, None, id=op, marks=pytest.mark.skip(
                reason=f"{op}: {registry.OPS[op].large_problem.reason}")))
            continue
        for impl in impls:
            dtype = next((d for d in DTYPE_PREFERENCE if not impl.unsupported(d)), None)
            if dtype is not None:
                out.append(pytest.param(op, impl, dtype, id=f"{op}-{impl.name}-{str(dtype)[6:]}"))
    return out


@pytest.mark.tritoncheck_impl
@pytest.mark.parametrize("op, impl, dtype", _targets())
def test_past_int32_offsets_match_the_reference(op, impl, dtype):
    if backend.current() != "cuda":
        pytest.skip(_why_not(op, dtype))
    with _one_at_a_time():
        reason = _why_not(op, dtype)
        if reason:
            pytest.skip(reason)
        compared = check(op, impl, dtype, backend.device())
    assert compared >= 5


@pytest.mark.parametrize("op, mutant", [("cross_entropy", "row_offset_int32"),
                                         ("linear_cross_entropy", "linear_cross_entropy_rows_int32"),
                                         ("gated_delta_rule", "gated_delta_rule_rows_int32"),
                                         ("ssd_scan", "ssd_scan_rows_int32")])
def test_an_int32_row_offset_is_caught(op, mutant):
    """tritoncheck.mutants.offsets' int32 row offsets (cross-entropy's row * stride; fused linear
    cross-entropy's row indices; the gated delta rule's and the SSD scan's batch row) fail it, in a spawned child: wild reads may
    break the CUDA context."""
    reason = _why_not(op, torch.bfloat16)
    if reason:
        pytest.skip(reason)
    from tritoncheck.selfcheck import isolated
    with _one_at_a_time():
        verdict = isolated(verdict_of, f"tritoncheck.mutants.offsets:{mutant}", op, "bfloat16")
    assert verdict.failed, f"the int32 row-offset mutant {mutant} passed the large-index check"
    print(verdict.text[:2000])


@pytest.mark.parametrize("op", ["swiglu", "layer_norm", "dropout_residual_layer_norm", "paged_decode_attention"])
def test_the_slicing_and_comparison_work_at_a_small_size(op, monkeypatch):
    """The machinery of the check, on every backend: a few thousand elements instead of
    2**31, the project's kernel, slices compared with their fp64 reference."""
    import tritoncheck.large_problem as large
    monkeypatch.setattr(large, "PAST_INT32", 3000)
    kernel = registry.Implementation.of(op, registry.resolve(registry.OPS[op].kernel), kind="kernel")
    assert check(op, kernel, torch.float16, backend.device()) >= 1


def test_a_scalar_the_signature_does_not_take_is_left_out(monkeypatch):
    """paged_decode_attention's problem asks for num_splits = 3; an implementation whose
    signature has no num_splits (declared limits: held at its default) is called without it."""
    import tritoncheck.large_problem as large
    from tritoncheck.kernels.paged_decode_attention import paged_decode_attention as kernel
    monkeypatch.setattr(large, "PAST_INT32", 3000)
    calls = []

    def unsplit(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
        calls.append(q.shape)
        return kernel(q, k_cache, v_cache, block_table, seq_lens, sm_scale)

    impl = registry.Implementation.of("paged_decode_attention", unsplit, kind="user")
    assert impl.limits.held("num_splits")
    assert check("paged_decode_attention", impl, torch.float16, backend.device()) >= 1
    assert calls and len(calls[0]) == 4  # two query tokens a sequence
