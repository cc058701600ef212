#!/usr/bin/env bash
# The whole GPU run in one go: the suite with the gpu profile, the kernels' own
# tests, the self-test (mutants and controls), one planted bug and one control
# through --impl, the speed tables.
# Usage: OUT=/some/dir bash scripts/gpu_run.sh   (everything lands in $OUT/gpu.tgz)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT/gpu"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
# one BLAS/OpenMP thread per process: the xdist workers already fill the cores
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
WORKERS=${WORKERS:-12}
SUITE_S=${SUITE_S:-280}  # the whole script fits the device tool's 600 s per call
log() { echo "== $(date +%T) $*" | tee -a "$OUT/gpu/run.log"; }

log "device: $(python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)')"
log "suite, gpu profile"
start=$(date +%s)
# SIGINT, not SIGTERM: pytest still writes the report and the summary of what ran
timeout -s INT -k 20 "$SUITE_S" python3 -m pytest tests/test_checks.py -n "$WORKERS" --hypothesis-profile gpu --max-examples "${EXAMPLES:-100}" \
    --report-dir "$OUT/gpu/report" -q -rfs --tb=short -p no:randomly > "$OUT/gpu/suite.log" 2>&1
echo "suite exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"
tail -n 60 "$OUT/gpu/suite.log"

log "kernel tests"
timeout -s INT -k 10 100 python3 -m pytest tests/test_softmax_kernel.py tests/test_attention_kernel.py tests/test_norms_kernel.py \
    tests/test_linear_attention_kernel.py tests/test_losses_kernel.py tests/test_elementwise_kernel.py \
    -n 8 -q --tb=short > "$OUT/gpu/kernels.log" 2>&1
echo "kernel tests exit $?" | tee -a "$OUT/gpu/run.log"; tail -n 5 "$OUT/gpu/kernels.log"

log "self-test: every mutant killed, every control passed, on the GPU"
timeout -s INT -k 10 240 python3 -m pytest tests/test_selfcheck.py -n "$WORKERS" -q -rfsx --tb=short -p no:randomly \
    > "$OUT/gpu/selfcheck.log" 2>&1
echo "self-test exit $?" | tee -a "$OUT/gpu/run.log"; grep -E "kill rate|passed|failed" "$OUT/gpu/selfcheck.log" | tail -3

log "large-index check: every op past 2**31 elements, and the int32-offset mutant"
timeout -s INT -k 10 240 python3 -m pytest tests/test_large_index.py -m large -q -rs --tb=short -s > "$OUT/gpu/large.log" 2>&1
echo "large-index exit $?" | tee -a "$OUT/gpu/run.log"; tail -n 8 "$OUT/gpu/large.log"

log "a planted bug and a control through --impl"
timeout -s INT -k 10 45 python3 -m pytest tests/test_checks.py -n 8 --impl softmax=mutants.softmax:padded_lanes_zero \
    --report-dir "$OUT/gpu/mutant" -q --tb=line > "$OUT/gpu/mutant.log" 2>&1
echo "mutant run exit $? (1 expected)" | tee -a "$OUT/gpu/run.log"; grep -m3 -A8 "AssertionError" "$OUT/gpu/mutant.log" | head -30
timeout -s INT -k 10 45 python3 -m pytest tests/test_checks.py -n 8 --impl softmax=controls.softmax:torch_softmax \
    --report-dir "$OUT/gpu/control" -q --tb=short > "$OUT/gpu/control.log" 2>&1
echo "control run exit $? (0 expected)" | tee -a "$OUT/gpu/run.log"; tail -n 3 "$OUT/gpu/control.log"

log "speed"
timeout 60 python3 benchmarks/suite_speed.py --examples 20 --op softmax --op layer_norm > "$OUT/gpu/speed.log" 2>&1; cat "$OUT/gpu/speed.log"
timeout 30 python3 benchmarks/linear_attention.py --no-loop > "$OUT/gpu/linear_attention_bench.log" 2>&1; cat "$OUT/gpu/linear_attention_bench.log"
tar czf "$OUT/gpu.tgz" -C "$OUT" gpu && log "packed $OUT/gpu.tgz"
