#!/usr/bin/env bash
# On a GPU machine whose python3 already has PyTorch (and pytest): installs a prebuilt astrai-jit
# wheel into a virtual environment that sees the system packages, runs the Python suite (GPU
# tests included) and the host-overhead benchmark. Logs go to $OUT when set.
# Usage: tools/run_python_gpu_suite.sh WHEEL_DIR [pytest args...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wheels=${1:?usage: tools/run_python_gpu_suite.sh WHEEL_DIR [pytest args...]}
shift
out=${OUT:-/tmp/python-gpu-out}
venv=${VENV:-/tmp/astrai-jit-venv}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --no-deps --no-index --force-reinstall "$wheels"/astrai_jit-*.whl || exit 1
export ASTRAI_JIT_CACHE_DIR=${ASTRAI_JIT_CACHE_DIR:-$(mktemp -d)}
cd "$out"
"$venv/bin/python" -m pytest "$root/python/tests" -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$out/pytest.txt"
status=${PIPESTATUS[0]}
"$venv/bin/python" "$root/python/bench/host_overhead.py" 2>&1 | tee "$out/host_overhead.txt"
exit "$status"
