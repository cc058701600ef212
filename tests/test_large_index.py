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
from tritoncheck.large_index import OutOfMemory, bytes_needed, check, values_of, verdict_of
from tritoncheck.limits import OutsideLimits

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
    values = values_of(op, _dtype_of(spec), torch.device("meta"))
    assert set(spec.arguments) <= set(values), f"{op}: no value for {sorted(set(spec.arguments) - set(values))}"
    # the largest tensor passes 2**31: a sliced one, or one passed whole to every slice (a
    # paged KV cache, read through the sliced block tables)
    largest = max(v.numel() for v in values.values() if isinstance(v, torch.Tensor))
    assert largest > 2**31, f"{op}: the largest argument, {largest} elements, does not pass 2**31"


def _dtype_of(spec, impl=None) -> torch.dtype | None:
    """The dtype the check runs an op in: the first of DTYPE_PREFERENCE, else of the op's own
    (scaled_mm's are its input formats), that the implementation takes."""
    return next((d for d in (*DTYPE_PREFERENCE, *spec.dtypes)
                 if d in spec.dtypes and (impl is None or not impl.unsupported(d))), None)


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
            dtype = _dtype_of(registry.OPS[op], impl)
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
        compared = _checked(op, impl, dtype)
    assert compared >= 5


def _checked(op, impl, dtype) -> int:
    """The check's slices compared; running out of memory on the problem, huge on purpose, is
    a skip that says how much was asked for and what the device has, a failure only past a
    declared memory budget; a problem outside the declared limits is not applicable."""
    try:
        return check(op, impl, dtype, backend.device())
    except OutOfMemory as exc:
        if exc.over_budget:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    except OutsideLimits as exc:
        pytest.skip(f"not applicable: {exc}")


@pytest.mark.parametrize("op, mutant", [("cross_entropy", "row_offset_int32"),
                                         ("linear_cross_entropy", "linear_cross_entropy_rows_int32"),
                                         ("scaled_mm", "scaled_mm_rows_int32"),
                                         ("gated_delta_rule", "gated_delta_rule_rows_int32"),
                                         ("fused_moe", "fused_moe_pairs_int32"),
                                         ("ssd_scan", "ssd_scan_rows_int32")])
def test_an_int32_row_offset_is_caught(op, mutant):
    """tritoncheck.mutants.offsets' int32 row offsets (cross-entropy's row * stride; fused linear
    cross-entropy's row indices; the GEMM's rows; the gated delta rule's and the SSD scan's batch row) fail it, in a
    spawned child: wild reads may break the CUDA context."""
    dtype = _dtype_of(registry.OPS[op])
    reason = _why_not(op, dtype)
    if reason:
        pytest.skip(reason)
    from tritoncheck.selfcheck import isolated
    with _one_at_a_time():
        verdict = isolated(verdict_of, f"tritoncheck.mutants.offsets:{mutant}", op, str(dtype).replace("torch.", ""))
    assert verdict.failed, f"the int32 row-offset mutant {mutant} passed the large-index check"
    print(verdict.text[:2000])


@pytest.mark.parametrize("op", ["swiglu", "layer_norm", "dropout_residual_layer_norm", "paged_decode_attention",
                                "scaled_mm", "fused_moe",
                                # the scans' small problems cost 40-100 CPU-s under the interpreter: slow tier
                                pytest.param("gated_delta_rule", marks=pytest.mark.slow),
                                pytest.param("ssd_scan", marks=pytest.mark.slow)])
def test_the_slicing_and_comparison_work_at_a_small_size(op, monkeypatch):
    """The machinery of the check, on every backend: a few thousand elements instead of
    2**31, the project's kernel, slices compared with their fp64 reference."""
    import tritoncheck.large_problem as large
    monkeypatch.setattr(large, "PAST_INT32", 3000)
    spec = registry.OPS[op]
    kernel = registry.Implementation.of(op, registry.resolve(spec.kernel), kind="kernel")
    dtype = torch.float16 if torch.float16 in spec.dtypes else spec.dtypes[0]
    assert check(op, kernel, dtype, backend.device()) >= 1


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


TORCH_OOM = ("CUDA out of memory. Tried to allocate 128.25 GiB. GPU 0 has a total capacity of 139.72 GiB of which "
             "101.35 GiB is free. Including non-PyTorch memory, this process has 38.36 GiB memory in use.")


@pytest.mark.parametrize("budget, outcome", [(None, "skipped"), (1.0, "failed"), (1e9, "skipped")])
def test_out_of_memory_on_the_large_problem_is_a_skip_with_the_size_unless_over_a_declared_budget(
        monkeypatch, budget, outcome):
    """torch.OutOfMemoryError from the implementation (here the message torch gave a plain
    attention on an H200, issue 36): a skip naming what it asked for and what the device has,
    not a wrong answer; with fn.memory_budget declared, a failure where the request passes it,
    a skip where it does not (the device is too small for the problem). At a small size."""
    import tritoncheck.large_problem as large
    monkeypatch.setattr(large, "PAST_INT32", 3000)

    def swiglu(gate, up):
        raise torch.OutOfMemoryError(TORCH_OOM)

    if budget is not None:
        swiglu.memory_budget = budget
    impl = registry.Implementation.of("swiglu", swiglu, kind="user")
    with pytest.raises((pytest.skip.Exception, pytest.fail.Exception)) as ended:
        _checked("swiglu", impl, torch.float16)
    text = str(ended.value)
    assert ended.errisinstance(pytest.skip.Exception) == (outcome == "skipped"), text
    assert "swiglu asked for 128.25 GiB at once on the large problem; the device has 139.72 GiB, 101.35 GiB of it " \
           "free" in text, text
    assert ("over it" in text) == (outcome == "failed"), text
    assert ("Not a wrong answer" in text) == (budget is None), text


def test_an_out_of_memory_runtime_error_is_one_too_and_other_errors_are_not(monkeypatch):
    import tritoncheck.large_problem as large
    from tritoncheck.large_index import is_out_of_memory
    monkeypatch.setattr(large, "PAST_INT32", 3000)
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory")) and not is_out_of_memory(RuntimeError("nan"))

    def swiglu(gate, up):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        _checked("swiglu", registry.Implementation.of("swiglu", swiglu, kind="user"), torch.float16)


def test_a_memory_budget_is_validated():
    def swiglu(gate, up):
        return gate

    for bad in (-1.0, True, "1 GiB", float("inf")):
        swiglu.memory_budget = bad
        with pytest.raises(TypeError, match="memory_budget must be a number >= 0"):
            registry.Implementation.of("swiglu", swiglu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's own out-of-memory error, on CUDA")
def test_a_plain_attention_that_materialises_its_scores_is_skipped_with_the_size_on_the_gpu():
    """The GPU run of issue 36: a correct plain-PyTorch attention (scores materialised in
    float32) on the large problem in bfloat16 runs out of memory; the test skips with the
    size it asked for, and fails where it declares a budget its scores pass."""
    if backend.current() != "cuda":
        pytest.skip("runs on CUDA only")

    def plain_attention(q, k, v, causal=False, sm_scale=None):
        scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
        s = (q.float() @ k.float().transpose(-1, -2)) * scale  # [B, H, N, N] in float32
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        p = torch.softmax(s, dim=-1)
        return (p @ v.float()).to(q.dtype), torch.logsumexp(s, dim=-1)

    with _one_at_a_time():
        with pytest.raises(pytest.skip.Exception, match=r"asked for [\d.]+ GiB at once on the large problem; the "
                                                        r"device has [\d.]+ GiB") as skipped:
            _checked("attention", registry.Implementation.of("attention", plain_attention, kind="user"),
                     torch.bfloat16)
        print(skipped.value)  # for the GPU run's log
        plain_attention.memory_budget = 2.0
        with pytest.raises(pytest.fail.Exception, match="over it") as failed:
            _checked("attention", registry.Implementation.of("attention", plain_attention, kind="user"),
                     torch.bfloat16)
        print(failed.value)
