#!/usr/bin/env bash
# Builds the astrai-jit wheel (scikit-build-core, the project's CMake), installs it into a
# virtual environment with PyTorch and pytest, and runs python/tests there (GPU tests skip
# without a GPU).
# Usage: scripts/ci/run_python_tests.sh [--deps-only] [WORK_DIR]   (default: build-python)
#   --deps-only  only create the environment and install the dependencies (scripts/ci/run_tests.sh
#                runs this in the background while it builds the C++ suite: the PyTorch
#                download is the longest wait of a fresh run).
# PYTHON picks the interpreter (default python3). The environment is reused between runs.
# ASTRAI_PY_CMAKE_BUILD_DIR names a CMake build tree of this source (Release, Ninja) for the
# wheel to reuse, so that the library and the CLI already built there are not compiled again;
# the tree is then also configured with ASTRAI_JIT_BUILD_PYTHON=ON (tests and install stay on).
# Without it the wheel builds in build-python/ (pyproject.toml).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
deps_only=0
if [ "${1:-}" = --deps-only ]; then
  deps_only=1
  shift
fi
work=${1:-$root/build-python}
python=${PYTHON:-python3}
mkdir -p "$work"
work=$(cd "$work" && pwd)  # the script changes directory below
venv=$work/venv
export PATH=/usr/local/cuda/bin:$PATH
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
say() { echo "run_python_tests: $*"; }
if [ ! -x "$venv/bin/python" ]; then
  say "creating the virtual environment $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
if "$venv/bin/python" -c "import torch, pytest, numpy, nanobind, scikit_build_core, prometheus_client" 2>/dev/null; then
  say "the test dependencies are installed in $venv"
else
  # Not quiet: pip's "Collecting" and "Downloading" lines are the progress of the longest step.
  say "installing PyTorch, pytest, numpy, nanobind, scikit-build-core and prometheus_client into $venv" \
    "(PyTorch with its CUDA wheels is about 5 GB)"
  "${pip[@]}" install --progress-bar off "torch>=2.4" pytest numpy "nanobind>=2.0" "scikit-build-core>=0.10" \
    prometheus_client
fi
[ "$deps_only" = 1 ] && exit 0
wheel_options=()
if [ -n "${ASTRAI_PY_CMAKE_BUILD_DIR:-}" ]; then
  wheel_options=(-Cbuild-dir="$ASTRAI_PY_CMAKE_BUILD_DIR"
    -Ccmake.define.ASTRAI_JIT_BUILD_TESTS=ON -Ccmake.define.ASTRAI_JIT_INSTALL=ON)
fi
rm -rf "$work/dist"
say "building the astrai-jit wheel${ASTRAI_PY_CMAKE_BUILD_DIR:+ in $ASTRAI_PY_CMAKE_BUILD_DIR}"
"${pip[@]}" wheel -q --no-build-isolation --no-deps "${wheel_options[@]}" -w "$work/dist" "$root"
"${pip[@]}" install -q --force-reinstall --no-deps "$work"/dist/astrai_jit-*.whl
cd "$work"
"$venv/bin/astrai-jit" --version
say "pytest (GPU tests skip without a GPU)"
"$venv/bin/python" -m pytest "$root/python/tests" -q -p no:cacheprovider
