#!/usr/bin/env bash
# The flash-linear-attention example on a GPU: the adapter formula check, then the suite
# through the adapters. Needs fla-core 0.6.0 and einops importable
# (pip install --no-deps fla-core==0.6.0 einops).
# Usage: bash examples/fla/run.sh [REPORT_DIR] [pytest args...]   (default reports/fla)
# FLA_CHUNK=1 also runs fla's other linear-attention path (chunk_linear_attn).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPORTS=${1:-reports/fla}
WORKERS=${WORKERS:-8}
export PYTHONPATH=".:examples/fla${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import fla, torch, triton; from importlib.metadata import version; print("fla-core", version("fla-core"), "einops", version("einops"), "torch", torch.__version__, "triton", triton.__version__)'
python3 examples/fla/adapter_formula.py; echo "examples/fla/adapter_formula.py: exit $? (0: the formula is the contract's)"
# fla autotunes per head dims, heads and batch (fused_chunk_fwd_kernel 12 configs per
# (H, D, Dv, chunk), chunk_global_cumsum_vector_kernel 48 per (B, H, D), elu_p1 30 + 30 per
# last dim, each per dtype; README). --shapes 1: one pool value per dim besides the block
# boundaries, shared by the dtypes, while N and the values stay free. --autotune-config 0:
# each fla kernel runs its first config, one compilation per new key instead of a sweep
# (AUTOTUNE=tuned keeps fla's own choice; benchmarks/autotune_sweep.py checks every config).
# The first-example time of each test (compile + autotune) is in the report.
AUTOTUNE=${AUTOTUNE:-0}
python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=line -p no:randomly --shapes 1 \
    --autotune-config "$AUTOTUNE" "${@:2}" \
    --impl linear_attention=adapters:linear_attention --impl elu_feature_map=adapters:elu_feature_map \
    --report-dir "$REPORTS/fused_chunk"
echo "linear_attention (fused_chunk_linear_attn), elu_feature_map (elu_p1): exit $?"
# the gated delta rule: chunk_gated_delta_rule (forward and backward, chunk sizes 16/32/64) and
# fused_recurrent_gated_delta_rule (forward only), then the standalone probes (GDR_LARGE=1: past 2**31)
python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=line -p no:randomly --shapes 1 \
    --autotune-config "$AUTOTUNE" "${@:2}" \
    --impl gated_delta_rule=adapters:gated_delta_rule --impl gated_delta_rule=adapters:fused_gated_delta_rule \
    --report-dir "$REPORTS/gated_delta_rule"
echo "gated_delta_rule (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule): exit $?"
python3 examples/fla/repro_gated_delta_rule.py ${GDR_LARGE:+--large}
echo "examples/fla/repro_gated_delta_rule.py: exit $? (0: every probe within its bound)"
if [[ "${FLA_CHUNK:-0}" == 1 ]]; then
    python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=line -p no:randomly --shapes 1 \
        --autotune-config "$AUTOTUNE" "${@:2}" \
        --impl linear_attention=adapters:chunk_linear_attention --report-dir "$REPORTS/chunk"
    echo "linear_attention (chunk_linear_attn): exit $?"
fi
