#!/usr/bin/env bash
# The Triton tutorial's grouped GEMM, as a mixture-of-experts layer (adapters.py), under tritoncheck on
# one GPU in one device call (about 4 minutes): the suite through the adapter at the quick profile and
# at the gpu profile, and the large-index check in a process of its own. No wheel: torch and triton only.
# Usage, from the checkout's root: bash examples/triton_grouped_gemm/run.sh [pytest args...]
# Logs in $OUT (default /tmp/grouped-gemm-out): run.log (the summary), quick.log, gpu.log, large.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/grouped-gemm-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} OMP_NUM_THREADS=1
export PYTHONPATH=".:examples/triton_grouped_gemm${PYTHONPATH:+:$PYTHONPATH}"
WORKERS=${WORKERS:-15}
IMPL=(--impl "fused_moe=adapters:moe_grouped_gemm")
log() { echo "== $(date +%T) $*" | tee -a "$OUT/run.log"; }
suite() {  # suite NAME SECONDS PYTEST_ARGS...: one run, its log in $OUT/NAME.log, its summary in run.log
    local name=$1 seconds=$2 begin
    begin=$(date +%s)
    shift 2
    timeout -s INT -k 15 "$seconds" python3 -m pytest "$@" > "$OUT/$name.log" 2>&1
    log "$name: exit $? in $(( $(date +%s) - begin )) s"
    grep -E "^(FAILED|ERROR)|passed|failed|Falsifying|max error" "$OUT/$name.log" | cut -c1-300 | tail -n 20 \
        | tee -a "$OUT/run.log"
}
log "$(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__,
    torch.cuda.get_device_name())' 2>&1 | tail -1)"
suite quick 60 tests/test_checks.py "${IMPL[@]}" -n "$WORKERS" --hypothesis-profile quick -q -rfs --tb=short \
    -p no:randomly --report-dir "$OUT/report-quick" "$@"
suite gpu 90 tests/test_checks.py "${IMPL[@]}" -n "$WORKERS" --hypothesis-profile gpu --max-examples 30 -q -rfs \
    --tb=short -p no:randomly --report-dir "$OUT/report-gpu" "$@"
suite large 90 tests/test_large_index.py -m large "${IMPL[@]}" -k "fused_moe and past_int32" -q -rs --tb=short \
    -p no:randomly
