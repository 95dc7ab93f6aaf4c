#!/usr/bin/env bash
# Builds astrai-jit and runs the whole test suite with CTest, then builds the Python wheel and
# runs the Python tests (tools/run_python_tests.sh). Without a GPU the `gpu` tests report
# "skipped"; with one they run. Usage: tools/run_tests.sh [BUILD_DIR]
# ASTRAI_SKIP_PYTHON=1 runs the C++ suite only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
export PATH=/usr/local/cuda/bin:$PATH
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j 2
if [ "${ASTRAI_SKIP_PYTHON:-0}" != 1 ]; then
  "$root/tools/run_python_tests.sh" "$build/py"
fi
