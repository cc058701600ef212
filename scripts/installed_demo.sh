#!/usr/bin/env bash
# What a kernel library's CI does with the suite: install tritoncheck (not editable) into a fresh
# virtual environment, go to an empty directory holding the user's own package named `kernels`
# (examples/user_project), and check a correct and a wrong softmax, through the command and
# through pytest's entry point. Exits non-zero when any verdict is not the expected one.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Inside a virtual environment that already holds the dependencies (.ci/run's), the new one reads
# them from there through a .pth line rather than installing torch a second time (700 MB unpacked,
# about 75 s on CI's 2 cores); tritoncheck itself is installed into it from the checkout, not
# editable, as a user installs it. Outside one, everything is installed afresh.
outer_site=""
if [ -n "${VIRTUAL_ENV:-}" ] && python -c "import torch, triton, hypothesis, xdist" 2>/dev/null; then
  outer_site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
fi
python3 -m venv "$work/venv"
. "$work/venv/bin/activate"
if [ -n "$outer_site" ]; then
  echo "$outer_site" > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/dependencies.pth"
  python -m pip install -q --no-deps "$repo"
else
  python -m pip install -q --upgrade pip
  python -m pip install -q torch==2.13.0 "$repo"
fi
mkdir "$work/user" && cp -r "$repo/examples/user_project/kernels" "$work/user/"
cd "$work/user"
run() { echo "\$ $*"; "$@" > out.log 2>&1 && status=0 || status=$?; tail -n 3 out.log; return 0; }

run tritoncheck softmax=kernels.softmax:softmax --dtype float32 --max-examples 5
[ "$status" = 0 ] || { cat out.log; echo "FAIL: the correct softmax did not pass (exit $status)"; exit 1; }

run tritoncheck softmax=kernels.softmax:softmax_off_by_a_tenth --dtype float32 --max-examples 5
[ "$status" = 1 ] || { cat out.log; echo "FAIL: the wrong softmax did not fail (exit $status)"; exit 1; }
replay="$(grep -m1 -oE 'python -m tritoncheck.replay reports/failures/[^ ]+\.json' out.log)"
[ -n "$replay" ] || { cat out.log; echo "FAIL: no replay command printed"; exit 1; }
run $replay
grep -q "FAILED" out.log || { cat out.log; echo "FAIL: the replay did not reproduce the failure"; exit 1; }
[ "$status" = 1 ] || { echo "FAIL: the replay exited $status, not 1"; exit 1; }

run python -m pytest --pyargs tritoncheck.suite --impl softmax=kernels.softmax:softmax --dtype float32 --max-examples 5
[ "$status" = 0 ] || { cat out.log; echo "FAIL: the correct softmax did not pass through pytest (exit $status)"; exit 1; }
run python -m pytest --pyargs tritoncheck.suite --impl softmax=kernels.softmax:softmax_off_by_a_tenth \
    --dtype float32 --max-examples 5
[ "$status" = 1 ] || { cat out.log; echo "FAIL: the wrong softmax did not fail through pytest (exit $status)"; exit 1; }
echo "installed demo: 5 verdicts as expected"
# a user's own op, defined with tritoncheck.op in the user's package (same environment)
cd "$repo"
DEMO_VENV="$work/venv" bash "$repo/scripts/installed_user_op_demo.sh"
