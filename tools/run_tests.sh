#!/usr/bin/env bash
# Builds astrai-jit and runs the whole test suite with CTest. Without a GPU the `gpu` tests
# report "skipped"; with one they run. Usage: tools/run_tests.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
export PATH=/usr/local/cuda/bin:$PATH
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j 2
