#!/usr/bin/env bash
# The Liger-Kernel example on a GPU: both reproducers, then the suite through the adapters.
# Needs liger-kernel 0.8.5 importable (pip install --no-deps liger-kernel==0.8.5).
# Usage: bash examples/liger/run.sh [REPORT_DIR]   (default reports/liger)
set -uo pipefail
cd "$(dirname "$0")/../.."
REPORTS=${1:-reports/liger}
WORKERS=${WORKERS:-8}
export PYTHONPATH="examples/liger${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import liger_kernel, torch, triton; print("liger-kernel", __import__("importlib.metadata").metadata.version("liger-kernel"), "torch", torch.__version__, "triton", triton.__version__)'
for repro in examples/liger/repro_*.py; do
    python3 "$repro"; echo "$repro: exit $? (1: the bug shows)"
done
# cross_entropy under --tolerance parity: Liger returns the loss in the logits' dtype, a
# stated contract difference (docs/third-party/liger.md, finding 3), judged against
# PyTorch's own same-dtype loss instead of the float32 rule.
python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=line -p no:randomly "${@:2}" \
    --impl softmax=adapters:softmax --impl rope=adapters:rope --impl swiglu=adapters:swiglu \
    --impl layer_norm=adapters:layer_norm --impl rms_norm=adapters:rms_norm --impl add_rms_norm=adapters:add_rms_norm \
    --report-dir "$REPORTS/default"
echo "softmax, rope, swiglu, layer_norm: exit $?"
python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=line -p no:randomly "${@:2}" \
    --impl cross_entropy=adapters:cross_entropy --tolerance parity --report-dir "$REPORTS/cross_entropy"
echo "cross_entropy (--tolerance parity): exit $?"
# fused linear cross-entropy: the loss and dW in the input dtype (finding 9), judged like cross_entropy
python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=line -p no:randomly "${@:2}" \
    --impl linear_cross_entropy=adapters:linear_cross_entropy --tolerance parity --report-dir "$REPORTS/linear_cross_entropy"
echo "linear_cross_entropy (--tolerance parity): exit $?"
