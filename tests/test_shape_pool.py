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


def test_one_class_pool_keeps_one_power_of_two_class_with_its_edges():
    """--shape-classes 1 (the quick profile): every size of a wide range in one class
    (2^(k-1), 2^k], so a kernel's next_power_of_2 block compiles once; the class's edge,
    one short of it and one past the edge below are in it (a masked tail, Triton's
    divisible-by-16 and other integer classes)."""
    for seed in range(6):
        a = shape_pool.pool("softmax", "N", 1, 2100, (128,), 4, seed, 1)
        edge = max(a)
        assert edge in (16, 32, 64, 128) and all(edge // 2 < v <= edge for v in a), a
        assert {edge - 1, edge // 2 + 1} <= set(a) and len(a) == 7
        assert a == shape_pool.pool.__wrapped__("softmax", "N", 1, 2100, (128,), 4, seed, 1)
    assert len({shape_pool.pool("softmax", "N", 1, 2100, (128,), 4, s, 1)[-1] for s in range(12)}) > 1  # per run
    assert shape_pool.pool("attention", "B", 1, 3, (), 4, 0, 1) == (1, 2, 3)  # small ranges keep every size


def test_one_class_choice_keeps_a_head_dim_off_its_power_of_two(monkeypatch):
    monkeypatch.setattr(CONFIG, "shapes", 4)
    monkeypatch.setattr(CONFIG, "shape_classes", 1)
    for seed in range(6):
        monkeypatch.setattr(CONFIG, "shapes_seed", seed)
        dims = set(shape_pool.choice("attention", "D", attention.HEAD_DIMS_SMALL).elements)
        assert len({1 << (d - 1).bit_length() for d in dims}) == 1, dims  # one BLOCK_D
        assert any(d & (d - 1) for d in dims) and len(dims) == 2, dims  # and a masked head dim


def test_run_subset_compares_neighbours_in_quick_and_all_otherwise(monkeypatch):
    monkeypatch.setattr(CONFIG, "shape_classes", None)
    assert shape_pool.run_subset("lce", "chunk_size", (16, 32, 64, 128), 2) == (16, 32, 64, 128)
    monkeypatch.setattr(CONFIG, "shape_classes", 1)
    picked = set()
    for seed in range(10):
        monkeypatch.setattr(CONFIG, "shapes_seed", seed)
        picked.add(shape_pool.run_subset("lce", "chunk_size", (16, 32, 64, 128), 2))
    assert all(len(p) == 2 and p in ((16, 32), (32, 64), (64, 128)) for p in picked) and len(picked) > 1


def test_quick_draws_every_free_attention_variant_on_or_every_one_off(monkeypatch):
    """Limits.variant: one coin per case in quick, so the kernels' variant flags come in
    two combinations; a check that fixes a variant keeps it; without --shape-classes
    every combination is drawn."""
    from tritoncheck.properties.attention_arguments import NO_WINDOW

    def flags(c):
        return (c.params["causal"], tuple(c.params["window"]) != NO_WINDOW, c.params["softcap"] > 0,
                "alibi_slopes" in c.tensors)

    monkeypatch.setattr(CONFIG, "shapes", 4)
    monkeypatch.setattr(CONFIG, "shape_classes", 1)
    assert _distinct("attention", torch.float32, flags, examples=40) == {(False,) * 4, (True,) * 4}
    fixed = set()

    @settings(max_examples=30, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=attention.attention_cases(torch.float32, causal=True, alibi=False))
    def draw(case):
        fixed.add(flags(case))

    draw()
    assert fixed == {(True, False, False, False), (True, True, True, False)}
    monkeypatch.setattr(CONFIG, "shape_classes", None)
    assert len(_distinct("attention", torch.float32, flags, examples=80)) > 4
