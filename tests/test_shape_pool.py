"""--shapes N (tritoncheck/shape_pool.py): the dims kernels specialise on come from a small
pool fixed for the run, block boundaries included; the other dims still vary."""
import torch
from hypothesis import HealthCheck, given, settings

from tritoncheck import registry, shape_pool
from tritoncheck.config import CONFIG
from tritoncheck.properties import attention, softmax


def test_pool_holds_the_boundaries_in_range_and_is_the_same_every_time():
    a = shape_pool.pool("softmax", "n", 1, 300, (128,), 4, 0)
    assert {16, 32, 64, 128} <= set(a) and len(a) == 8 and all(1 <= v <= 300 for v in a)
    assert a == shape_pool.pool.__wrapped__("softmax", "n", 1, 300, (128,), 4, 0)
    assert a != shape_pool.pool("softmax", "n", 1, 300, (128,), 12, 0)
    assert shape_pool.pool("rope", "B", 1, 3, (), 5, 0) == (1, 2, 3)  # no more than the range holds


def _distinct(op, dtype, pick, examples=60):
    seen = set()

    @settings(max_examples=examples, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=registry.load()[op].cases(dtype))
    def draw(case):
        seen.add(pick(case))

    draw()
    return seen


def test_specialised_dims_come_from_the_pool_while_rows_vary(monkeypatch):
    monkeypatch.setattr(CONFIG, "shapes", 2)
    last = _distinct("softmax", torch.float16, lambda c: c.tensors["x"].shape[-1])
    rows = _distinct("softmax", torch.float16, lambda c: c.tensors["x"].shape[:-1])
    pool = shape_pool.pool("softmax", "N", 1, CONFIG.pick(2100, 2**17 + 3), tuple(softmax.BLOCKS), 2, 0)
    assert last <= set(pool) and len(rows) > 3
    # one pool for every dtype: an autotuned kernel sweeps each value once per dtype, not a pool's worth more
    assert _distinct("softmax", torch.bfloat16, lambda c: c.tensors["x"].shape[-1]) <= set(pool)
    heads = _distinct("attention", torch.float32, lambda c: c.tensors["q"].shape[-1])
    allowed = set(shape_pool.choice("attention", "D", attention.HEAD_DIMS_LARGE if CONFIG.size == "large"
                                    else attention.HEAD_DIMS_SMALL).elements)
    assert {16, 32, 64, 128} <= allowed and len(allowed) == 6  # the boundaries and N = 2 others
    assert heads <= allowed and len(heads) > 2


def test_without_shapes_the_dims_are_free(monkeypatch):
    monkeypatch.setattr(CONFIG, "shapes", None)
    assert len(_distinct("softmax", torch.float16, lambda c: c.tensors["x"].shape[-1])) > 10
