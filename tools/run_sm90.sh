#!/usr/bin/env bash
# One device call for the Hopper bring-up: astrai-sm90-check (compile, float64 checks, timings
# beside the portable prefill), PyTorch's cuDNN/FA2 on the same shapes, then compute-sanitizer
# on the small checks. Usage: tools/run_sm90.sh BUILD_DIR (logs under $OUT when set).
set -uo pipefail
build=${1:-build}
out=${OUT:-/tmp/sm90-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
export ASTRAI_JIT_CACHE_DIR=$(mktemp -d)
timeout 300 "$build/bench/astrai-sm90-check" 2>&1 | tee "$out/sm90-check.txt"
PYTHONUNBUFFERED=1 timeout 300 python3 bench/torch_reference.py 2>&1 | tee "$out/torch-reference.txt"
for tool in memcheck racecheck synccheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 "$build/bench/astrai-sm90-check" --small \
    >"$out/sanitizer-$tool.txt" 2>&1
  echo "compute-sanitizer $tool: exit $? ($(grep -cE '^PASS' "$out/sanitizer-$tool.txt") PASS lines," \
       "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer-$tool.txt" | tail -1))"
done
