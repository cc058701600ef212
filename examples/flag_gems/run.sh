#!/usr/bin/env bash
# The FlagGems example on one GPU, in one device call (about 6 minutes at most on an H100):
# install the wheels of .whl/ (flag_gems, PyYAML, SQLAlchemy: README.md says why these),
# probe.py (each finding read from FlagGems's source, called once), then the suite through
# the adapters at the quick profile, at the gpu profile, and the large-index check.
# Usage, from the checkout's root: bash examples/flag_gems/run.sh [pytest args...]
# Logs land in $OUT (default /tmp/flag_gems-out): run.log (the summary), probe.log,
# quick.log, gpu.log, large-<op>.log, and reports.tgz (the quick and gpu report directories). Each step
# has its own timeout (SIGINT: pytest still writes its report and summary), so a cut run
# still leaves every log written so far.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/flag_gems-out}
REPORTS=/tmp/flag_gems-reports
mkdir -p "$OUT" "$REPORTS"
# GEMS_VENDOR: FlagGems otherwise finds its vendor by running each vendor's query tool at import;
# FLAGGEMS_DB_URL: its autotune cache in memory, not one sqlite file that every xdist worker
# creates at once at import (the varlen kernel is not autotuned: nothing is lost)
export PYTHONUNBUFFERED=1 GEMS_VENDOR=nvidia FLAGGEMS_DB_URL=sqlite:// FLAGGEMS_CACHE_DIR=/tmp/flaggems-cache
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} OMP_NUM_THREADS=1
WORKERS=${WORKERS:-15}
IMPLS=(--impl varlen_attention=adapters:varlen_attention --impl varlen_attention=adapters:varlen_attention_unwindowed
       --impl paged_decode_attention=adapters:paged_decode_attention)
log() { echo "== $(date +%T) $*" | tee -a "$OUT/run.log"; }

if [[ -d .whl ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        2>&1 | tail -3 | tee -a "$OUT/run.log"
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=".:examples/flag_gems${PYTHONPATH:+:$PYTHONPATH}"
log "$(python3 -c 'import flag_gems, torch, triton; print("flag_gems", flag_gems.__version__, "torch", torch.__version__,
    "triton", triton.__version__, torch.cuda.get_device_name())' 2>&1 | tail -1)"

start=$(date +%s)
timeout -k 10 40 python3 examples/flag_gems/probe.py > "$OUT/probe.log" 2>&1
log "probe.py exit $? (the number of findings that showed) in $(( $(date +%s) - start )) s"
grep -E "^(SHOWS|not shown|RAISED|refused|accepted|convention)" "$OUT/probe.log" | tee -a "$OUT/run.log"

suite() {  # suite NAME SECONDS PYTEST_ARGS...: one suite run, its log in $OUT/NAME.log
    local name=$1 seconds=$2 begin
    begin=$(date +%s)
    shift 2
    timeout -s INT -k 20 "$seconds" python3 -m pytest tests/test_checks.py -n "$WORKERS" -q -rfs --tb=short \
        -p no:randomly "${IMPLS[@]}" --report-dir "$REPORTS/$name" "$@" > "$OUT/$name.log" 2>&1
    log "$name: exit $? in $(( $(date +%s) - begin )) s"
    awk '$4 ~ /^[0-9]+\/[0-9]+\/[0-9]+$/' "$OUT/$name.log" | cut -c1-220 | tee -a "$OUT/run.log"
    tail -n 1 "$OUT/$name.log" | tee -a "$OUT/run.log"
}
suite quick 120 "$@"
suite gpu 110 --hypothesis-profile gpu --max-examples 15 "$@"

# one process per op: an illegal address past 2**31 elements loses that process's CUDA context,
# and with it every later test of the process
for op in varlen_attention paged_decode_attention; do
    start=$(date +%s)
    timeout -s INT -k 10 90 python3 -m pytest tests/test_large_index.py -m large -q -rs --tb=short -p no:randomly \
        --impl "$op=adapters:$op" > "$OUT/large-$op.log" 2>&1
    log "large-index $op: exit $? in $(( $(date +%s) - start )) s"
    grep -E "passed|failed|FAILED|SKIPPED|Error" "$OUT/large-$op.log" | cut -c1-400 | tee -a "$OUT/run.log"
done
tar czf "$OUT/reports.tgz" -C "$REPORTS" . && log "packed $OUT/reports.tgz"
