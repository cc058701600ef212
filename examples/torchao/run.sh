#!/usr/bin/env bash
# torchao's Triton fp8 GEMMs under tritoncheck on one GPU, one device call (about 5 minutes): install the
# torchao wheel of .whl/ (README.md), the K-tail reproducer, the suite through the three adapters at the
# quick profile and at the gpu profile (one autotune config each: --autotune-config 0), and the
# large-index check of each adapter in a process of its own (an illegal address loses its CUDA context).
# Usage, from the checkout's root: bash examples/torchao/run.sh [pytest args...]
# Logs in $OUT (default /tmp/torchao-out): run.log (the summary), repro.log, quick.log, gpu.log,
# large-<adapter>.log, reports.tgz (the quick and gpu report directories).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/torchao-out}
REPORTS=/tmp/torchao-reports
mkdir -p "$OUT" "$REPORTS"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} OMP_NUM_THREADS=1
WORKERS=${WORKERS:-15}
ADAPTERS=(blockwise_fp8_gemm fp8_gemm_1x128_128x128 fp8_gemm_1x128_128x1)
IMPLS=()  # and the training kernels under a declared K, a multiple of 128 (the runs past finding 1)
for a in "${ADAPTERS[@]}" fp8_gemm_1x128_128x128_k_blocks fp8_gemm_1x128_128x1_k_blocks; do
    IMPLS+=(--impl "scaled_mm=adapters:$a")
done
log() { echo "== $(date +%T) $*" | tee -a "$OUT/run.log"; }

if [[ -d .whl ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/torchao-*.whl 2>&1 | tail -3 | tee -a "$OUT/run.log"
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=".:examples/torchao${PYTHONPATH:+:$PYTHONPATH}"
log "$(python3 -c 'import torchao, torch, triton; print("torchao", torchao.__version__, "torch", torch.__version__,
    "triton", triton.__version__, torch.cuda.get_device_name())' 2>&1 | tail -1)"

start=$(date +%s)
timeout -k 10 60 python3 examples/torchao/repro_k_tail.py > "$OUT/repro.log" 2>&1
log "repro_k_tail.py exit $? (1: the K-tail bug shows) in $(( $(date +%s) - start )) s"
grep -E "^K = " "$OUT/repro.log" | tee -a "$OUT/run.log"

suite() {  # suite NAME SECONDS PYTEST_ARGS...: one suite run, its log in $OUT/NAME.log
    local name=$1 seconds=$2 begin
    begin=$(date +%s)
    shift 2
    timeout -s INT -k 20 "$seconds" python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=short \
        -p no:randomly --autotune-config 0 "${IMPLS[@]}" --report-dir "$REPORTS/$name" "$@" > "$OUT/$name.log" 2>&1
    log "$name: exit $? in $(( $(date +%s) - begin )) s"
    grep -E "^(FAILED|SKIPPED)|passed|failed" "$OUT/$name.log" | cut -c1-240 | tail -n 40 | tee -a "$OUT/run.log"
}
suite quick 100 "$@"
suite gpu 100 --hypothesis-profile gpu --max-examples 15 "$@"

for a in "${ADAPTERS[@]}"; do
    start=$(date +%s)
    timeout -s INT -k 10 25 python3 -m pytest tests/test_large_index.py -m large -k "past_int32 and scaled_mm" -q -rs \
        --tb=short -p no:randomly --impl "scaled_mm=adapters:$a" > "$OUT/large-$a.log" 2>&1
    log "large-index $a: exit $? in $(( $(date +%s) - start )) s"
    grep -E "passed|failed|FAILED|SKIPPED|Error" "$OUT/large-$a.log" | cut -c1-400 | tee -a "$OUT/run.log"
done
tar czf "$OUT/reports.tgz" -C "$REPORTS" . && log "packed $OUT/reports.tgz"
