#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, fill the kernel cache with
# `astrai-jit warm` (for the local GPU, or sm_90a when there is none), then, if a GPU is
# present, run a short paged_decode demo that checks its result against a CPU reference.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
export PATH=/usr/local/cuda/bin:$PATH
"$root/tools/install_deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target astrai-jit astrai-demo
"$build/tools/astrai-jit" warm
status=0
"$build/tools/astrai-demo" || status=$?
if [ $status -eq 77 ]; then
  echo "bootstrap: no GPU here, demo skipped (the cache above was warmed for sm_90a)"
  status=0
fi
exit $status
