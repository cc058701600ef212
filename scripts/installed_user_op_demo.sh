#!/usr/bin/env bash
# A user's own op, installed (issue 35, ask 6): install tritoncheck (not editable) into a fresh
# virtual environment, copy examples/matmul into an empty directory as the user's package
# `matmul` (ops.py: the op defined with tritoncheck.op; kernels.py: the Triton matmul;
# mutants.py: its planted bugs), name the op module in the directory's pyproject.toml, and
# check that the correct kernel passes, the K-tail bug fails with a replay command, and the
# replay, run there, reproduces the failure. Exits non-zero when any verdict is not the
# expected one.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ -n "${DEMO_VENV:-}" ]; then  # scripts/installed_demo.sh's environment: tritoncheck already installed there
  . "$DEMO_VENV/bin/activate"
else
  python3 -m venv "$work/venv"
  . "$work/venv/bin/activate"
  python -m pip install -q --upgrade pip
  python -m pip install -q torch==2.13.0 "$repo"
fi
mkdir "$work/user" && cp -r "$repo/examples/matmul" "$work/user/matmul"
rm -rf "$work/user/matmul/__pycache__"
cd "$work/user"
cat > pyproject.toml <<'TOML'
[project]
name = "my-kernels"
version = "0.0.1"

[tool.tritoncheck]
op-modules = ["matmul.ops"]
TOML
# planted bugs are written as patched modules here, not into the user's home directory
export TRITONCHECK_MUTANT_DIR="$work/mutants"
run() { echo "\$ $*"; "$@" > out.log 2>&1 && status=0 || status=$?; tail -n 3 out.log; return 0; }

run tritoncheck matmul=matmul.kernels:matmul --profile quick --dtype float32 --max-examples 5 -n 2
[ "$status" = 0 ] || { cat out.log; echo "FAIL: the correct matmul did not pass (exit $status)"; exit 1; }

run tritoncheck matmul=matmul.mutants:k_tail_dropped --profile quick --dtype float32 --max-examples 5 -n 2
[ "$status" = 1 ] || { cat out.log; echo "FAIL: the K-tail bug did not fail (exit $status)"; exit 1; }
grep -q "FAILED.*matches_reference" out.log || { cat out.log; echo "FAIL: matches_reference did not fail"; exit 1; }
replay="$(grep -m1 -oE 'python -m tritoncheck.replay reports/failures/[^ ]+matches_reference\.json' out.log)"
[ -n "$replay" ] || { cat out.log; echo "FAIL: no replay command printed for matches_reference"; exit 1; }
run $replay
grep -q "FAILED: does not match the fp64 reference" out.log || { cat out.log; echo "FAIL: the replay did not reproduce"; exit 1; }
[ "$status" = 1 ] || { echo "FAIL: the replay exited $status, not 1"; exit 1; }

run python -m pytest --pyargs tritoncheck.suite --impl matmul=matmul.kernels:matmul --dtype float32 \
    --max-examples 5 -k matches_reference
[ "$status" = 0 ] || { cat out.log; echo "FAIL: the correct matmul did not pass through pytest (exit $status)"; exit 1; }
echo "installed user-op demo: 4 verdicts as expected"
