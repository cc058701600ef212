"""One GPU per xdist worker (tritoncheck/devices.py): the mapping, and the report's record of it."""
import pytest
import torch

from tritoncheck import devices, report
from tritoncheck.report import markdown


@pytest.mark.parametrize("worker_id, gpus, expected", [
    ("gw0", 2, 0), ("gw1", 2, 1), ("gw2", 2, 0), ("gw7", 2, 1),
    ("gw5", 8, 5), ("gw13", 8, 5), ("gw3", 3, 0),
    ("gw4", 1, None), ("gw4", 0, None),     # one GPU or none: nothing to choose
    (None, 4, None), ("main", 4, None),     # the controlling process, or not an xdist id
])
def test_worker_i_takes_gpu_i_mod_g(worker_id, gpus, expected):
    assert devices.worker_gpu(worker_id, gpus) == expected


def test_workers_spread_evenly_over_every_gpu():
    for workers in range(1, 17):
        for gpus in range(2, 9):
            per_gpu = [0] * gpus
            for i in range(workers):
                per_gpu[devices.worker_gpu(f"gw{i}", gpus)] += 1
            assert max(per_gpu) - min(per_gpu) <= 1, (workers, gpus, per_gpu)
            assert sum(per_gpu) == workers


@pytest.mark.parametrize("gpus", [-1, 2.0, True, "2"])
def test_a_gpu_count_that_is_not_a_count_is_an_error(gpus):
    with pytest.raises(ValueError, match="gpu_count"):
        devices.worker_gpu("gw0", gpus)


def test_off_cuda_nothing_is_selected_or_recorded():
    assert devices.select_worker_gpu("gw1", "interpret") is None
    assert devices.current_gpu("interpret") is None


def test_the_report_says_which_gpu_ran_each_test(tmp_path):
    for name, gpu, tests in (("gw0", 0, ("a-k-float16-x", "b-k-float16-x")), ("gw1", 1, ("c-k-float32-x",)),
                             ("gw2", None, ())):
        collector = report.Collector()
        for test in tests:
            collector.examples[test] += 3
        collector.dump(tmp_path / "parts", name, gpu=gpu)
    data = report.build(tmp_path, [], {"backend": "cuda"})
    assert data["gpu_per_test"] == {"a-k-float16-x": 0, "b-k-float16-x": 0, "c-k-float32-x": 1}
    assert markdown.gpu_line(data) == "tests per GPU: cuda:0 2, cuda:1 1"
    assert markdown.gpu_line({"gpu_per_test": {}}) == ""


def test_release_cache_empties_only_past_the_kept_size(monkeypatch):
    calls = []
    reserved = {"bytes": devices.CACHE_KEPT_BYTES}
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: reserved["bytes"])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: calls.append("reset"))
    devices.release_cache("cuda")
    assert calls == []  # at the kept size: nothing to hand back
    reserved["bytes"] += 1
    devices.release_cache("interpret")
    assert calls == []  # no GPU
    devices.release_cache("cuda")
    assert calls == ["empty", "reset"]
