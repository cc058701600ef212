"""Run-wide settings chosen once per run by the plugin (``tritoncheck/plugin.py``) or a replay script.

``size`` scales the problem sizes the strategies draw: ``small`` keeps each example
cheap enough for the Triton interpreter on a 2-core CI machine, ``large`` reaches
the sizes real models send (rows of 2**17, long sequences) on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

# "large" keeps each tensor to about 2**20-2**21 elements: the fp64 NumPy references and
# the derived tolerances run on the host at about 1 s per 4M elements per core, and at
# 2**22-2**24 a 20-example H100 run (14 workers, 16 cores) got through 50 of 186 tests in
# 280 s. Row lengths past every block size (softmax 2**17 + 3, ...) stay reachable.
PROFILE_SIZES = {"dev": "small", "ci": "small", "gpu": "large", "nightly": "large"}


@dataclass
class RunConfig:
    size: str = "small"
    ops: tuple[str, ...] | None = None  # --op
    dtypes: tuple[torch.dtype, ...] | None = None  # --dtype
    report_dir: Path = Path("reports")
    refusals: str = "auto"  # --refusals: auto | discard | fail (tritoncheck/refusals.py)
    tolerance: str = "derived"  # --tolerance: derived | parity (tritoncheck/parity.py)
    shapes: int | None = None  # --shapes N: sizes per (op, dtype, specialised dim) (tritoncheck/shape_pool.py)
    shapes_seed: int = 0  # --shapes-seed: which N (the same in every xdist worker)
    shape_classes: int | None = None  # --shape-classes K: the pool's sizes in K power-of-two classes only
    autotune_config: int | None = None  # --autotune-config I: declared autotuned kernels run config I only
    world_size: int = 2  # --cp-world-size W: the ranks a distributed op's implementation runs on (CPU CI: 2 gloo)
    configured: bool = False  # set once the plugin has chosen the above for a run

    def pick(self, small, large):
        """The ``small`` or ``large`` variant of a size limit, by the run's size."""
        return large if self.size == "large" else small

    def long_percent(self, small: int = 5) -> int:
        """Percent of the draws in which ``strategies.lengths`` reaches past 4096: rare
        on the interpreter, where such a row costs seconds (``small``, per family, from
        its measured cost), a third on a GPU (nominal shares: see ``lengths``)."""
        return self.pick(small, 33)


CONFIG = RunConfig()
