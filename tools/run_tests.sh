#!/usr/bin/env bash
# Builds astrai-jit and runs the whole test suite with CTest, then builds the Python wheel and
# runs the Python tests (tools/run_python_tests.sh). Without a GPU the `gpu` tests report
# "skipped"; with one they run. Usage: tools/run_tests.sh [BUILD_DIR]
# ASTRAI_SKIP_PYTHON=1 runs the C++ suite only.
#
# Time: the Python environment (PyTorch and its CUDA wheels, gigabytes from PyPI on a fresh
# machine) is installed in the background while the C++ suite builds and runs, and the wheel
# reuses this build tree (ASTRAI_PY_CMAKE_BUILD_DIR), so the library and the CLI are compiled
# once.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
mkdir -p "$build"
build=$(cd "$build" && pwd)  # the wheel build below is started from another directory
export PATH=/usr/local/cuda/bin:$PATH
python_tests=1
[ "${ASTRAI_SKIP_PYTHON:-0}" = 1 ] && python_tests=0

deps_pid=""
deps_log=$build/py-deps.log
if [ "$python_tests" = 1 ]; then
  # In a process group of its own: a failed C++ step ends the script, and the install (pip
  # included) must not outlive it.
  setsid "$root/tools/run_python_tests.sh" --deps-only "$build/py" >"$deps_log" 2>&1 </dev/null &
  deps_pid=$!
  trap '[ -z "$deps_pid" ] || kill -- "-$deps_pid" 2>/dev/null || true' EXIT
fi

# A unity build: the header-only fmt and CLI11 are compiled once per batch of files, not per
# file (on the 2-core development machine a clean Release build took 100 s against 170).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON
cmake --build "$build" -j "$(nproc)"
(cd "$build" && ctest --output-on-failure -j 2)

if [ "$python_tests" = 1 ]; then
  if ! wait "$deps_pid"; then
    deps_pid=""
    echo "run_tests: installing the Python test dependencies failed:" >&2
    cat "$deps_log" >&2
    exit 1
  fi
  deps_pid=""
  ASTRAI_PY_CMAKE_BUILD_DIR=$build "$root/tools/run_python_tests.sh" "$build/py"
fi
