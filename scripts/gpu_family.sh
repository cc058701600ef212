#!/usr/bin/env bash
# One op family on one GPU in one device call of about 9 minutes: the kernel's own tests, the
# suite's checks at the gpu profile, the self-test's hunts and controls of the op, the large-index
# check (the kernel, and its int32-offset mutant). Each step has its own time limit (SIGINT: pytest
# still writes its summary), so a cut run keeps every log written so far.
# Usage, from the checkout's root: bash scripts/gpu_family.sh OP    (e.g. fused_moe; logs in
# $OUT/OP/, packed into $OUT/OP.tgz). EXAMPLES (default 20) and WORKERS (15) may be set.
set -uo pipefail
OP=${1:?usage: bash scripts/gpu_family.sh OP}
OUT=${OUT:-/tmp/gpu-out}
LOGS="$OUT/$OP"
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
step kernel 50 python3 -m pytest "tests/test_${OP}_kernel.py" -n 8 -q -p no:randomly --tb=short
step suite 80 python3 -m pytest tests/test_checks.py --op "$OP" -n "$WORKERS" --hypothesis-profile gpu \
    --max-examples "${EXAMPLES:-20}" -q -rfs --tb=short -p no:randomly --report-dir "$LOGS/report"
# 240 s: on an H200 (2026-11-28) gated_delta_rule's self-test took 168 s, ssd_scan's 127 s, fused_moe's 44 s
# for 68 of its 69 tests and 48 s for its slowest hunt (330 s before its weights got the large size's budget)
step selfcheck 240 python3 -m pytest tests/test_selfcheck.py -k "$OP" -n "$WORKERS" -q -rfsx --tb=short -p no:randomly
# 180 s: the scans' three large-index tests took 95 s (ssd_scan) and 122 s (gated_delta_rule) on an H200
step large 180 python3 -m pytest tests/test_large_index.py -m large -k "$OP" -q -rs --tb=short -p no:randomly
tar czf "$OUT/$OP.tgz" -C "$OUT" "$OP" && log "packed $OUT/$OP.tgz"
