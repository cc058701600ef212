#!/usr/bin/env bash
# The GPU run, in parts that each fit one device call (600 s):
#   bash scripts/gpu_run.sh suite kernels impl      # the gpu profile, the kernels' own tests, --impl runs
#   bash scripts/gpu_run.sh selfcheck large         # every mutant and control, the large-index check
#   bash scripts/gpu_run.sh gdr                     # the gated delta rule alone: suite, kernel tests, self-test, large index
# Logs land in $OUT/gpu/ and $OUT/gpu.tgz. Run from the checkout (installed or not).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT/gpu"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
# one BLAS/OpenMP thread per process: the xdist workers already fill the cores
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
WORKERS=${WORKERS:-15}
SUITE_S=${SUITE_S:-330}
log() { echo "== $(date +%T) $*" | tee -a "$OUT/gpu/run.log"; }
log "device: $(python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)')"

for part in "$@"; do
  start=$(date +%s)
  case "$part" in
  suite)
    log "suite, gpu profile"
    # SIGINT, not SIGTERM: pytest still writes the report and the summary of what ran
    timeout -s INT -k 20 "$SUITE_S" python3 -m pytest tests/test_checks.py -n "$WORKERS" --hypothesis-profile gpu \
        --max-examples "${EXAMPLES:-100}" --report-dir "$OUT/gpu/report" -q -rfs --tb=short -p no:randomly \
        > "$OUT/gpu/suite.log" 2>&1
    echo "suite exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"
    tail -n 60 "$OUT/gpu/suite.log" ;;
  kernels)
    log "kernel tests"
    timeout -s INT -k 10 150 python3 -m pytest tests/test_*_kernel.py tests/test_dropout_training_path.py \
        tests/test_bad_input.py tests/test_poisoning.py -n 8 -q --tb=short -p no:randomly > "$OUT/gpu/kernels.log" 2>&1
    echo "kernel tests exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"; tail -n 5 "$OUT/gpu/kernels.log" ;;
  impl)
    log "a planted bug and a control through --impl"
    timeout -s INT -k 10 60 python3 -m pytest tests/test_checks.py -n 8 \
        --impl softmax=tritoncheck.mutants.softmax:padded_lanes_zero --report-dir "$OUT/gpu/mutant" -q --tb=line \
        -p no:randomly > "$OUT/gpu/mutant.log" 2>&1
    echo "mutant run exit $? (1 expected)" | tee -a "$OUT/gpu/run.log"; grep -E "passed|failed" "$OUT/gpu/mutant.log" | tail -1
    timeout -s INT -k 10 60 python3 -m pytest tests/test_checks.py -n 8 \
        --impl softmax=tritoncheck.controls.softmax:torch_softmax --report-dir "$OUT/gpu/control" -q --tb=short \
        -p no:randomly > "$OUT/gpu/control.log" 2>&1
    echo "control run exit $? (0 expected)" | tee -a "$OUT/gpu/run.log"; tail -n 3 "$OUT/gpu/control.log" ;;
  selfcheck)
    log "self-test: every mutant killed by its check's assertion, every control passed, on the GPU"
    timeout -s INT -k 10 "${SELF_S:-330}" python3 -m pytest tests/test_selfcheck.py tests/test_context_parallel.py \
        -n "$WORKERS" -q -rfsx --tb=short -p no:randomly > "$OUT/gpu/selfcheck.log" 2>&1
    echo "self-test exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"
    grep -E "kill rate|time to kill|passed|failed" "$OUT/gpu/selfcheck.log" | tail -4 ;;
  large)
    log "large-index check: every op past 2**31 elements, and the int32-offset mutant"
    timeout -s INT -k 10 200 python3 -m pytest tests/test_large_index.py -m large -q -rs --tb=short -p no:randomly \
        > "$OUT/gpu/large.log" 2>&1
    echo "large-index exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"; tail -n 8 "$OUT/gpu/large.log" ;;
  gdr)
    log "gated_delta_rule: the gpu profile, its kernel tests, its self-test, its large-index check"
    timeout -s INT -k 10 "${GDR_SUITE_S:-110}" python3 -m pytest tests/test_checks.py --op gated_delta_rule --shapes 1 \
        -n "$WORKERS" --hypothesis-profile gpu --max-examples "${EXAMPLES:-25}" --report-dir "$OUT/gpu/gdr-report" \
        -q -rfs --tb=short -p no:randomly > "$OUT/gpu/gdr-suite.log" 2>&1
    echo "gdr suite exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"; tail -n 40 "$OUT/gpu/gdr-suite.log"
    timeout -s INT -k 10 40 python3 -m pytest tests/test_gated_delta_rule_kernel.py -n 4 -q --tb=short \
        -p no:randomly > "$OUT/gpu/gdr-kernel.log" 2>&1
    echo "gdr kernel tests exit $?" | tee -a "$OUT/gpu/run.log"; tail -n 3 "$OUT/gpu/gdr-kernel.log"
    timeout -s INT -k 10 "${GDR_SELF_S:-70}" python3 -m pytest tests/test_selfcheck.py -k gated_delta_rule \
        -n "$WORKERS" -q -rfsx --tb=short -p no:randomly > "$OUT/gpu/gdr-selfcheck.log" 2>&1
    echo "gdr self-test exit $?" | tee -a "$OUT/gpu/run.log"; grep -E "kill rate|passed|failed" "$OUT/gpu/gdr-selfcheck.log" | tail -3
    timeout -s INT -k 10 "${GDR_LARGE_S:-70}" python3 -m pytest tests/test_large_index.py -m large -k gated_delta_rule \
        -q -rs --tb=short -p no:randomly > "$OUT/gpu/gdr-large.log" 2>&1
    echo "gdr large-index exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"; tail -n 6 "$OUT/gpu/gdr-large.log" ;;
  *) echo "unknown part $part (suite, kernels, impl, selfcheck, large, gdr)"; exit 2 ;;
  esac
done
tar czf "$OUT/gpu.tgz" -C "$OUT" gpu && log "packed $OUT/gpu.tgz"
