#!/usr/bin/env bash
# scaled_mm (issue 38) on one GPU, one device call of about 5 minutes: the kernel's own tests, the
# suite's checks at the gpu profile, the self-test's scaled_mm hunts and controls, the large-index
# check (the kernel, and the int32-offset mutant). Each step has its own time limit (SIGINT: pytest
# still writes its summary), so a cut run keeps every log written so far.
# Usage, from the checkout's root: bash scripts/gpu_scaled_mm.sh    (logs in $OUT/scaled_mm/, packed
# into $OUT/scaled_mm.tgz; the torchao run is examples/torchao/run.sh)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
LOGS="$OUT/scaled_mm"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
WORKERS=${WORKERS:-15}
log() { echo "== $(date +%T) $*" | tee -a "$LOGS/run.log"; }
step() {  # step NAME SECONDS COMMAND...: one step, its log in $LOGS/NAME.log, its last lines in run.log
    local name=$1 seconds=$2 begin
    begin=$(date +%s)
    shift 2
    timeout -s INT -k 15 "$seconds" "$@" > "$LOGS/$name.log" 2>&1
    log "$name: exit $? in $(( $(date +%s) - begin )) s"
    grep -E "kill rate|time to kill|^(FAILED|ERROR)|passed|failed" "$LOGS/$name.log" | cut -c1-300 | tail -n 12 \
        | tee -a "$LOGS/run.log"
}
log "device: $(python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)')"
step kernel 50 python3 -m pytest tests/test_scaled_mm_kernel.py -n 8 -q -p no:randomly --tb=short
step suite 90 python3 -m pytest tests/test_checks.py --op scaled_mm -n "$WORKERS" --hypothesis-profile gpu \
    --max-examples "${EXAMPLES:-20}" -q -rfs --tb=short -p no:randomly --report-dir "$LOGS/report"
step selfcheck 100 python3 -m pytest tests/test_selfcheck.py -k scaled_mm -n "$WORKERS" -q -rfsx --tb=short -p no:randomly
step large 55 python3 -m pytest tests/test_large_index.py -m large -k scaled_mm -q -rs --tb=short -p no:randomly
tar czf "$OUT/scaled_mm.tgz" -C "$OUT" scaled_mm && log "packed $OUT/scaled_mm.tgz"
