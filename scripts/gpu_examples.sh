#!/usr/bin/env bash
# The example ops of examples/ (issue 35) on one GPU, from the checkout's root, in one command:
#   bash scripts/gpu_examples.sh
# 1. the quick profile of every example kernel through the tritoncheck command (the user's path);
# 2. tests/test_examples.py less its CPU-sized kernel hunts: every control passes every check, every
#    planted bug is killed by its check (approximate_scale_division exists on the GPU only), and the
#    large-index check past 2**31 elements on each kernel and on the int32-offset mutant.
# Logs land in $OUT/examples/ and $OUT/examples.tgz; the two steps are bounded at 130 s and 160 s (QUICK_S,
# SELF_S), under 5 minutes on one H200 with a cold Triton cache.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT/examples"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYTHONPATH="$PWD/examples${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/examples/run.log"; }
log "device: $(python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)')"

start=$(date +%s)
log "quick profile of the five example kernels"
timeout -s INT -k 20 "${QUICK_S:-130}" python3 -m tritoncheck --op-module matmul.ops --op-module bias_gelu.ops \
    --op-module fp8_quant.ops matmul=matmul.kernels:matmul matmul=matmul.kernels:matmul_split_k \
    bias_gelu=bias_gelu.kernels:bias_gelu quantize_fp8=fp8_quant.kernels:quantize_fp8 \
    dequantize_fp8=fp8_quant.kernels:dequantize_fp8 --profile quick --report-dir "$OUT/examples/quick" \
    > "$OUT/examples/quick.log" 2>&1
echo "quick profile exit $? in $(( $(date +%s) - start )) s (0 expected)" | tee -a "$OUT/examples/run.log"
grep -E "^(matmul|bias_gelu|quantize_fp8|dequantize_fp8) .*(pass/fail|/[0-9]+/)" "$OUT/examples/quick.log" | head -20
grep -E "passed|failed" "$OUT/examples/quick.log" | tail -1

start=$(date +%s)
log "controls, planted bugs and the large-index check (tests/test_examples.py)"
timeout -s INT -k 20 "${SELF_S:-160}" python3 -m pytest tests/test_examples.py -k "not test_kernel_passes" -n 8 \
    -q -rfsxP --tb=short -p no:randomly > "$OUT/examples/selfcheck.log" 2>&1
echo "self-test exit $? in $(( $(date +%s) - start )) s (0 expected)" | tee -a "$OUT/examples/run.log"
grep -E "killed by|FAILED|passed|failed" "$OUT/examples/selfcheck.log" | tail -25
tar czf "$OUT/examples.tgz" -C "$OUT" examples && log "packed $OUT/examples.tgz"
