#!/usr/bin/env bash
# The GPU run, in parts that each fit one device call (600 s):
#   bash scripts/gpu_run.sh suite kernels impl      # the gpu profile, the kernels' own tests, --impl runs
#   bash scripts/gpu_run.sh selfcheck large slow    # every mutant and control, the large-index check, the slow tier's rest
# Every part runs whole test files without -m, so both test tiers of those files run (docs/ci.md,
# Test tiers); `slow` runs the slow tier's tests of the files no other part runs.
#   bash scripts/gpu_run.sh numerics                # issue 36's numerics (about 4 min): softmax fp16 gradient,
#                                                   # autotune pins and agreement, rounding bias, rule audit
#   bash scripts/gpu_run.sh op:gated_delta_rule     # one op alone: its suite, kernel tests, self-test, large index
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
  slow)
    log "the slow tier's tests of the files the other parts do not run"
    ignore=(--ignore=tests/test_checks.py --ignore=tests/test_selfcheck.py --ignore=tests/test_context_parallel.py
            --ignore=tests/test_bad_input.py --ignore=tests/test_poisoning.py --ignore=tests/test_dropout_training_path.py)
    for f in tests/test_*_kernel.py; do ignore+=("--ignore=$f"); done
    timeout -s INT -k 10 "${SLOW_S:-300}" python3 -m pytest tests -m slow "${ignore[@]}" -n 8 -q -rfs --tb=short \
        -p no:randomly > "$OUT/gpu/slow.log" 2>&1
    echo "slow tier exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"; tail -n 8 "$OUT/gpu/slow.log" ;;
  numerics)
    log "issue 36 numerics: softmax fp16 gradient, autotune pins and agreement, rounding bias, rule audit"
    # in the background: the rule audit (each control's tightest case per rule) and the bias
    # survey (every project kernel, control and truncating mutant through the statistic)
    for i in 0 1 2 3; do
      timeout -s INT -k 10 150 python3 benchmarks/rule_audit.py --examples 40 --shard "$i/4" --markdown \
          > "$OUT/gpu/rule-audit-$i.log" 2>&1 &
    done
    for i in 0 1 2; do
      timeout -s INT -k 10 150 python3 benchmarks/bias_survey.py --examples 8 --shard "$i/3" \
          > "$OUT/gpu/bias-survey-$i.log" 2>&1 &
    done
    timeout -s INT -k 10 80 python3 -m pytest tests/test_property_rules.py tests/test_autotune_configs.py \
        tests/test_rounding_bias.py tests/test_parity.py -n 3 -q -rfs --tb=short -p no:randomly \
        > "$OUT/gpu/numerics-tests.log" 2>&1
    echo "numerics tests exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"
    tail -n 4 "$OUT/gpu/numerics-tests.log"
    timeout -s INT -k 10 130 python3 -m pytest tests/test_selfcheck.py -n 6 -q -rfs --tb=short -p no:randomly \
        -k "unbiased_rounding or autotune_configs_agree or cuda_backward or truncating or autotune_config_rounds" \
        > "$OUT/gpu/numerics-selfcheck.log" 2>&1
    echo "numerics self-test exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"
    tail -n 4 "$OUT/gpu/numerics-selfcheck.log"
    wait
    echo "rule audit and bias survey done in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log"
    cat "$OUT"/gpu/bias-survey-*.log | grep -v "^op " | sort -k8 -gr | head -n 8 | tee -a "$OUT/gpu/run.log"
    grep -h "WRONG SIDE\|implementation(s) on the wrong side" "$OUT"/gpu/bias-survey-*.log | tee -a "$OUT/gpu/run.log"
    grep -h "^| [a-z]" "$OUT"/gpu/rule-audit-*.log | grep -v "^| op" | sort -t'|' -k9 -gr | head -n 10 \
        | tee -a "$OUT/gpu/run.log"
    grep -h "^FAILED" "$OUT"/gpu/rule-audit-*.log | tee -a "$OUT/gpu/run.log" ;;
  op:*)  # one op alone, as scripts/gpu_family.sh runs it (its logs in $OUT/gpu/NAME/)
    OUT="$OUT/gpu" bash scripts/gpu_family.sh "${part#op:}"
    echo "${part#op:} exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu/run.log" ;;
  *) echo "unknown part $part (suite, kernels, impl, selfcheck, large, slow, numerics, op:NAME)"; exit 2 ;;
  esac
done
tar czf "$OUT/gpu.tgz" -C "$OUT" gpu && log "packed $OUT/gpu.tgz"
