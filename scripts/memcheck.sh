#!/usr/bin/env bash
# compute-sanitizer over a fixed sample of fuzzed cases of every project kernel (must be
# clean), and over the planted out-of-bounds store (must be flagged). GPU only.
# Usage: OUT=/some/dir bash scripts/memcheck.sh   (logs in $OUT/memcheck/)
set -uo pipefail
OUT=${OUT:-/tmp/memcheck-out}
mkdir -p "$OUT/memcheck"
export PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1
SAN="compute-sanitizer --error-exitcode 7 --print-limit 10"

$SAN --tool memcheck python3 scripts/memcheck.py --examples "${EXAMPLES:-3}" > "$OUT/memcheck/kernels.log" 2>&1
echo "memcheck, project kernels: exit $? (0 = clean)"; grep -E "ERROR SUMMARY|cases" "$OUT/memcheck/kernels.log" | tail -n 30

# Shared-memory reductions (tl.sum / tl.max across a block): softmax, the norms, cross-entropy.
$SAN --tool racecheck python3 scripts/memcheck.py --examples 2 --op softmax --op layer_norm --op cross_entropy \
    > "$OUT/memcheck/racecheck.log" 2>&1
echo "racecheck, reductions: exit $? (0 = clean)"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUT/memcheck/racecheck.log" | tail -n 3

$SAN --tool memcheck python3 scripts/memcheck.py --examples 1 --impl swiglu=tritoncheck.mutants.memory:store_past_the_end \
    > "$OUT/memcheck/mutant.log" 2>&1
echo "memcheck, store_past_the_end mutant: exit $? (7 = flagged, as it must be)"
grep -m 3 -E "Invalid __global__ write|ERROR SUMMARY" "$OUT/memcheck/mutant.log"
