#!/usr/bin/env bash
# The mamba-ssm example on a GPU: the suite's ssd_scan checks through the adapter
# (mamba_chunk_scan_combined), then the standalone probes. Needs einops and packaging
# importable, and mamba-ssm's Triton SSD files assembled without its CUDA extension:
# MAMBA_SRC (default .whl/mamba_src) already assembled, or MAMBA_SOURCE (a mamba-ssm
# checkout, unpacked sdist or .tar.gz) to assemble into MAMBA_SRC first
# (examples/mamba_ssm/assemble.py; README).
# Usage: bash examples/mamba_ssm/run.sh [REPORT_DIR] [pytest args...]   (default reports/mamba_ssm)
# MAMBA_FP32_STATES=1 also runs the state_dtype=float32 adapter; MAMBA_CHUNK_SIZE=64 makes 64
# the adapters' default chunk (256, Mamba2's, otherwise); MAMBA_DETERMINISTIC=1 is mamba's
# own switch to its backward without atomics (read by mamba at import).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPORTS=${1:-reports/mamba_ssm}
WORKERS=${WORKERS:-8}
MAMBA_SRC=${MAMBA_SRC:-.whl/mamba_src}
if [[ -n "${MAMBA_SOURCE:-}" ]]; then
    python3 examples/mamba_ssm/assemble.py "$MAMBA_SOURCE" "$MAMBA_SRC" || exit 1
fi
MAMBA_SITE=$(cd "$MAMBA_SRC" && pwd) || { echo "no $MAMBA_SRC: run examples/mamba_ssm/assemble.py first"; exit 1; }
export PYTHONPATH=".:examples/mamba_ssm:$MAMBA_SITE${PYTHONPATH:+:$PYTHONPATH}"
cat "$MAMBA_SITE/ASSEMBLED_FROM.txt" 2>/dev/null | head -1
python3 -c 'import torch, triton, einops, packaging
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
print("torch", torch.__version__, "triton", triton.__version__, "einops", einops.__version__,
      "packaging", packaging.__version__)' || exit 1
# mamba autotunes each of its ~15 SSD kernels (forward and backward, 6-11 configs each) per
# chunk_size, head dim, state dim and head count (adapters.py). --shapes 1: one pool value
# per dim besides the block boundaries, shared by the dtypes. --autotune-config 0: each
# kernel runs its first config, one compilation per new key instead of a sweep
# (AUTOTUNE=tuned: the configs in turn, one per example, as the suite does by default;
# benchmarks/autotune_sweep.py checks every config).
AUTOTUNE=${AUTOTUNE:-0}
python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=line -p no:randomly --shapes 1 \
    --autotune-config "$AUTOTUNE" "${@:2}" \
    --op ssd_scan --impl ssd_scan=adapters:ssd_scan --report-dir "$REPORTS/ssd_scan"
echo "ssd_scan (mamba_chunk_scan_combined): exit $?"
if [[ "${MAMBA_FP32_STATES:-0}" == 1 ]]; then
    python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=line -p no:randomly --shapes 1 \
        --autotune-config "$AUTOTUNE" "${@:2}" \
        --op ssd_scan --impl ssd_scan=adapters:ssd_scan_fp32_states --report-dir "$REPORTS/ssd_scan_fp32_states"
    echo "ssd_scan (mamba_chunk_scan_combined, state_dtype=float32): exit $?"
fi
python3 examples/mamba_ssm/probe.py
echo "examples/mamba_ssm/probe.py: exit $? (0: every probe as the contract; 1: a DIFF printed)"
