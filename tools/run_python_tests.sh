#!/usr/bin/env bash
# Builds the astrai-jit wheel (scikit-build-core, the project's CMake), installs it into a
# virtual environment with PyTorch and pytest, and runs python/tests there (GPU tests skip
# without a GPU). Usage: tools/run_python_tests.sh [WORK_DIR]   (default: build-python)
# PYTHON picks the interpreter (default python3). The environment is reused between runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/build-python}
python=${PYTHON:-python3}
mkdir -p "$work"
work=$(cd "$work" && pwd)  # the script changes directory below
venv=$work/venv
export PATH=/usr/local/cuda/bin:$PATH
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"$venv/bin/python" -c "import torch, pytest, numpy, nanobind, scikit_build_core" 2>/dev/null ||
  "${pip[@]}" install -q "torch>=2.4" pytest numpy "nanobind>=2.0" "scikit-build-core>=0.10"
rm -rf "$work/dist"
"${pip[@]}" wheel -q --no-build-isolation --no-deps -w "$work/dist" "$root"
"${pip[@]}" install -q --force-reinstall --no-deps "$work"/dist/astrai_jit-*.whl
cd "$work"
"$venv/bin/astrai-jit" --help >/dev/null
"$venv/bin/python" -m pytest "$root/python/tests" -q -p no:cacheprovider
