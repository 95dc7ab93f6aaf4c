#!/usr/bin/env bash
# Builds astrai-jit and runs the whole test suite with CTest, then builds the Python wheel and
# runs the Python tests (scripts/ci/run_python_tests.sh). Without a GPU the `gpu` tests report
# "skipped"; with one they run. Usage: scripts/ci/run_tests.sh [BUILD_DIR]
# ASTRAI_SKIP_PYTHON=1 runs the C++ suite only.
#
# Time: the Python environment (PyTorch and its CUDA wheels, gigabytes from PyPI on a fresh
# machine) is installed in the background while the C++ suite builds and runs, and the wheel
# reuses this build tree (ASTRAI_PY_CMAKE_BUILD_DIR), so the library and the CLI are compiled
# once. The tree is configured as scripts/ci/bootstrap.sh configures it (CMake preset `release`).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
mkdir -p "$build"
build=$(cd "$build" && pwd)  # the wheel build below is started from another directory
export PATH=/usr/local/cuda/bin:$PATH
python_tests=1
[ "${ASTRAI_SKIP_PYTHON:-0}" = 1 ] && python_tests=0

deps_pid=""
deps_log=$build/py-deps.log
venv=$build/py/venv
if [ "$python_tests" = 1 ]; then
  echo "run_tests: [1/4] preparing the Python test environment in the background: $venv" \
    "(PyTorch with its CUDA wheels, about 5 GB from PyPI the first time; log: $deps_log;" \
    "ASTRAI_SKIP_PYTHON=1 skips the Python part)"
  # In a process group of its own: a failed C++ step ends the script, and the install (pip
  # included) must not outlive it.
  setsid "$root/scripts/ci/run_python_tests.sh" --deps-only "$build/py" >"$deps_log" 2>&1 </dev/null &
  deps_pid=$!
  trap '[ -z "$deps_pid" ] || kill -- "-$deps_pid" 2>/dev/null || true' EXIT
else
  echo "run_tests: [1/4] Python part skipped (ASTRAI_SKIP_PYTHON=1)"
fi

# The configuration scripts/ci/bootstrap.sh uses (CMakePresets.json), so that this build goes on
# from the set-up's instead of starting over.
echo "run_tests: [2/4] building everything in $build (preset release)"
cmake -S "$root" --preset release -B "$build" >/dev/null
cmake --build "$build" -j "$(nproc)"
echo "run_tests: [3/4] CTest (the unit label runs anywhere; gpu skips without a GPU)"
(cd "$build" && ctest --output-on-failure -j 2)

if [ "$python_tests" = 1 ]; then
  echo "run_tests: [4/4] Python: the environment, the wheel (from this build tree), pytest"
  # The install may still run: say how far it is rather than wait in silence.
  waited=0
  while kill -0 "$deps_pid" 2>/dev/null; do
    if [ $((waited % 15)) -eq 0 ]; then
      echo "run_tests: still installing the Python environment: $(du -sm "$venv" 2>/dev/null | cut -f1) MB" \
        "so far; $(grep -v '^ ' "$deps_log" | tail -n 1 | cut -c1-100)"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  if ! wait "$deps_pid"; then
    deps_pid=""
    echo "run_tests: installing the Python test dependencies failed:" >&2
    cat "$deps_log" >&2
    exit 1
  fi
  deps_pid=""
  ASTRAI_PY_CMAKE_BUILD_DIR=$build "$root/scripts/ci/run_python_tests.sh" "$build/py"
fi
