"""The strategies draw what they promise, rebuild bit for bit, and shrink to readable cases."""
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, find, given, settings

from tritoncheck import registry
from tritoncheck.config import CONFIG
from tritoncheck.strategies import LONG_FROM, Case, Layout, TensorSpec, block_edges, layouts, lengths, sizes, tensors


def test_layout_is_a_view_with_the_promised_strides():
    values = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    t = Layout(order=(0, 2, 1), step_dim=2, step=2, offset=7).apply(values)
    assert torch.equal(t, values)
    assert t.storage_offset() == 7
    assert t.stride() == (24, 1, 6)  # dim 1 innermost; dim 2 stepped by 2 over 3 rows


def test_layout_gaps_hold_nan():
    t = Layout(order=(0,), step_dim=0, step=3, offset=2).apply(torch.ones(5))
    storage = t.as_strided((t.untyped_storage().nbytes() // 4,), (1,), 0)
    assert torch.isnan(storage).sum() == storage.numel() - 5


@given(spec=tensors((3, 17), torch.float16, families=("normal", "outlier", "neg_inf_tail"),
                    specials=(0.0, -math.inf)))
@settings(max_examples=30, deadline=None)
def test_materialise_is_deterministic_and_json_round_trips(spec):
    again = TensorSpec.from_json(spec.to_json())
    assert again == spec
    a, b = spec.materialise(), again.materialise()
    assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)) and a.dtype == torch.float16


def test_case_json_round_trip():
    spec = TensorSpec((4,), "float32", "normal", 1e3, 5, None, ((1, -math.inf),))
    case = Case("softmax", "float32", ("x", "temperature"), {"x": spec}, {"temperature": 0.5})
    assert Case.from_json(case.to_json()).to_json() == case.to_json()


def test_sizes_reach_past_a_block():
    seen = set()

    @given(sizes(1, 300, blocks=(64,)))
    @settings(max_examples=200, deadline=None, database=None)
    def collect(n):
        seen.add(n)

    collect()
    assert set(block_edges(1, 300, (64,))) <= seen | {63, 64, 65, 129} and 65 in seen and 1 in seen


def test_a_failure_past_one_block_shrinks_to_one_past_the_block():
    """The minimal case of 'breaks past one block' is the first size past it."""
    assert find(sizes(1, 5000, blocks=(1024,)), lambda n: n > 1024) == 1025


def test_a_layout_failure_shrinks_to_the_simplest_bad_layout():
    """A bug on non-contiguous input shrinks to a single departure from contiguous."""
    bad = find(layouts(3), lambda lay: not lay.contiguous)
    departures = (bad.order != (0, 1, 2)) + (bad.step > 1) + (bad.offset > 0)
    assert departures == 1


def test_families_shrink_toward_normal_and_injections_toward_none():
    spec = find(tensors((8,), torch.float32, families=("normal", "near_max"), specials=(1.0, -math.inf)),
                lambda s: True)
    assert spec.family == "normal" and spec.injections == () and spec.seed == 0 and spec.scale == 1.0


@pytest.mark.parametrize("family", ["near_max", "tiny", "offset", "neg_inf_tail"])
def test_value_families_draw_what_they_say(family):
    t = TensorSpec((4, 64), "float16", family, 1.0, 3).materialise()
    v = t.double().numpy()
    info = torch.finfo(torch.float16)
    if family == "near_max":
        assert np.all(np.abs(v) >= info.max / 2) and np.all(np.isfinite(v))
    elif family == "tiny":
        assert np.all(np.abs(v) < 32 * info.tiny)
    elif family == "offset":
        assert abs(abs(v.mean()) - 1e4) < 10
    else:
        assert np.isneginf(v).any() and np.isfinite(v[:, 0]).all()


def test_lengths_reach_past_the_common_block_caps_whatever_the_everyday_range():
    strategy = lengths(1, 100, long_max=2**17 + 3, long_percent=5)
    assert find(strategy, lambda n: n > 65536) > 65536
    assert find(strategy, lambda n: 4096 < n <= 8192) > 4096
    assert find(strategy, lambda n: True) == 1  # shrinks to the everyday branch
    with pytest.raises(ValueError, match="long_percent"):
        lengths(1, 100, long_max=10**5, long_percent=101)


def _drawn_row_lengths(strategy, count: int) -> list[int]:
    got = []

    @given(case=strategy)
    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    def draw(case):
        got.append(case.tensors[next(iter(case.tensors))].shape[-1])

    draw()
    return got


@pytest.mark.parametrize("op", ["softmax", "cross_entropy", "layer_norm"])  # dropout: GPU only (norms.py)
def test_row_wide_ops_draw_rows_past_4096_on_the_cpu_profile(op, monkeypatch):
    # A kernel with 4096-wide blocks must meet its multi-block path in a CPU run: with
    # 20 examples per test and 7-11 checks per dtype, a few percent of draws is enough.
    ops = registry.load()
    monkeypatch.setattr(CONFIG, "size", "small")  # the sizes of the ci profile, on any machine
    n = _drawn_row_lengths(ops[op].cases(torch.float16), 300)
    assert sum(v > 4096 for v in n) >= 3, f"{op}: {sum(v > 4096 for v in n)} of 300 rows past 4096"
    assert sum(v > 4096 for v in n) <= 30, f"{op}: the long branch is too dear for the interpreter"


def test_softmax_rows_independent_always_has_two_rows():
    check = {c.name: c for c in registry.load()["softmax"].checks}["rows_independent"]

    @given(case=check.cases(registry.OPS["softmax"], torch.float16))
    @settings(max_examples=60, deadline=None, database=None)
    def rows(case):
        assert math.prod(case.tensors["x"].shape[:-1]) >= 2

    rows()


# slow: up to 2000 draws of the gpu profile's attention cases, about 45 CPU-seconds; a property of the
# gpu profile's sizes, which the GPU run's suite draws too
@pytest.mark.slow
def test_attention_reaches_long_sequences_on_the_gpu_profile(monkeypatch):
    # Issue 12's realistic sizes: a 16k-key cache read by up to 2048 queries, squares to
    # 8k, in the large profile, with B = H = 1 once the scores alone pass the budget;
    # never on the CPU's. ``find`` searches until it meets one: how many of a fixed number
    # of derandomized draws are long depends on what else the run collected (Hypothesis's
    # literal pool), 3 to 20 of 400 here.
    from tritoncheck.properties import attention

    ops = registry.load()
    monkeypatch.setattr(CONFIG, "size", "large")
    strategy = ops["attention"].cases(torch.float16)
    long_cache = find(strategy, lambda c: c.tensors["k"].shape[2] > 8192,
                      settings=settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck)))
    assert long_cache.tensors["q"].shape[2] <= attention.LONG_QUERIES
    for q, k in _attention_shapes(ops, 400):
        assert k[2] <= attention.LONG_KEYS and q[2] <= max(attention.LONG_QUERIES, attention.LONG_SQUARE)
        assert q[0] * q[1] * q[2] * k[2] <= max(attention._SCORE_BUDGET, q[2] * k[2]), (q, k)
    monkeypatch.setattr(CONFIG, "size", "small")
    assert all(k[2] < LONG_FROM for _, k in _attention_shapes(ops, 200)), "the CPU profile drew a long sequence"


def _attention_shapes(ops, n):
    shapes = []

    @given(case=ops["attention"].cases(torch.float16))
    @settings(max_examples=n, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def draw(case):
        shapes.append((case.tensors["q"].shape, case.tensors["k"].shape))

    draw()
    return shapes
