#!/usr/bin/env bash
# Smoke test of one astrai-jit wheel: installs it (with its nvidia-cuda-nvrtc dependency, no
# PyTorch) into a fresh virtual environment of PYTHON and checks, without a GPU: the import, the
# version, `astrai-jit --version`, one kernel variant compiled by `astrai-jit warm` into a
# temporary cache. Then the same import and compile with the CUDA toolkit hidden (a private
# mount namespace with an empty directory over it; needs `unshare -m`, i.e. root): NVRTC must
# then come from the nvidia-cuda-nvrtc wheel, and the check says which libnvrtc was mapped.
# Usage: scripts/ci/smoke_test_wheel.sh PYTHON WHEEL WORK_DIR   (WORK_DIR is emptied first)
# ASTRAI_WHEEL_REQUIRE_HIDDEN_TOOLKIT=1 makes the hidden-toolkit part an error when it cannot run.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: smoke_test_wheel.sh PYTHON WHEEL WORK_DIR" >&2; exit 2; }
python=$1
wheel=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
work=$3
label="smoke $($python -c 'import sys; print("%d.%d" % sys.version_info[:2])') $(basename "$wheel")"
say() { echo "$label: $*"; }
fail() { echo "$label: FAILED: $*" >&2; exit 1; }
[ -f "$wheel" ] || fail "no wheel $wheel"
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
"$python" -m venv "$work/venv"
say "installing the wheel and its dependencies (nvidia-cuda-nvrtc) into $work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
"$work/venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -i -E '^(astrai-jit|nvidia-cuda-nvrtc) '
cd "$work"  # not the source tree

# The import and where libnvrtc was mapped from; no GPU, no PyTorch.
check_import='
import os, sys
import astrai_jit
from astrai_jit import astrai_install
assert "torch" not in sys.modules, "importing astrai_jit imported torch"
maps = open("/proc/self/maps").read().split("\n")
nvrtc = sorted({line.split()[-1] for line in maps if "libnvrtc.so" in line})
print("astrai_jit", astrai_jit.__version__, "from", os.path.dirname(astrai_jit.__file__))
print("extension", os.path.basename(astrai_jit._C.__file__), "| AstrAI module", astrai_install.stand_in_path().name)
print("libnvrtc mapped from", ", ".join(nvrtc) or "nowhere")
if os.environ.get("SMOKE_EXPECT_NVRTC_UNDER"):
    assert nvrtc and all(p.startswith(os.environ["SMOKE_EXPECT_NVRTC_UNDER"]) for p in nvrtc), nvrtc
'
warm() {  # warm CACHE_DIR: one variant for sm_89, compiled by NVRTC without a GPU
  local output
  output=$("$work/venv/bin/astrai-jit" warm --arch sm_89 --kernels rotary_emb --head-dims 128 --jobs 1 \
    --cache-dir "$1" 2>&1) || { echo "$output" >&2; fail "astrai-jit warm"; }
  echo "$output" | grep 'warm:'
  echo "$output" | grep -q 'warm: 1 variant, 1 compiled' || { echo "$output" >&2; fail "warm compiled nothing"; }
}

"$work/venv/bin/python" -c "$check_import" || fail "import astrai_jit"
"$work/venv/bin/astrai-jit" --version || fail "astrai-jit --version"
"$work/venv/bin/astrai-jit" info | grep '^NVRTC' || fail "astrai-jit info"
warm "$work/cache"

toolkit=$(readlink -f /usr/local/cuda 2>/dev/null || true)
if [ -n "$toolkit" ] && [ -d "$toolkit" ] && unshare -m true 2>/dev/null; then
  say "again with the CUDA toolkit ($toolkit) hidden: NVRTC must come from the nvidia-cuda-nvrtc wheel"
  site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # An empty tmpfs over the toolkit in a private mount namespace; the loader's cache still names
  # the toolkit's libnvrtc, but the file is gone. No CUDA variables, no library path.
  # shellcheck disable=SC2016
  env -u LD_LIBRARY_PATH -u CUDA_HOME -u CUDA_PATH -u ASTRAI_JIT_NVRTC_DIR \
    SMOKE_EXPECT_NVRTC_UNDER="$site/nvidia/" SMOKE_CHECK="$check_import" \
    unshare -m --propagation private bash -c '
      set -e
      mount -t tmpfs -o ro,size=1k astrai-no-toolkit "$1"
      [ ! -e "$1/lib64/libnvrtc.so.13" ] && [ ! -e /usr/local/cuda/lib64/libnvrtc.so.13 ]
      "$2/venv/bin/python" -c "$SMOKE_CHECK"
      "$2/venv/bin/astrai-jit" info | grep "^NVRTC"
      "$2/venv/bin/astrai-jit" warm --arch sm_89 --kernels rotary_emb --head-dims 128 --jobs 1 --cache-dir "$2/cache-wheel-nvrtc" 2>&1 | grep "warm:"
    ' hidden "$toolkit" "$work" >"$work/hidden.log" 2>&1 || { cat "$work/hidden.log" >&2; fail "with the toolkit hidden"; }
  cat "$work/hidden.log"
  grep -q 'warm: 1 variant, 1 compiled' "$work/hidden.log" || fail "with the toolkit hidden, warm compiled nothing"
elif [ "${ASTRAI_WHEEL_REQUIRE_HIDDEN_TOOLKIT:-0}" = 1 ]; then
  fail "cannot hide the CUDA toolkit here (needs $toolkit and unshare -m, i.e. root)"
else
  say "NOT checked: NVRTC from the wheel with the toolkit hidden (needs unshare -m, i.e. root)"
fi
say "ok"
