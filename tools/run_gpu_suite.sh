#!/usr/bin/env bash
# Runs the GPU suite on a machine with a GPU: the tensor-core path, the CUDA-core path
# (ASTRAI_JIT_NO_MMA=1), then compute-sanitizer's memcheck, racecheck and initcheck on a
# representative subset. Logs go to $OUT (or ./gpu-logs). Usage: run_gpu_suite.sh BUILD_DIR
set -uo pipefail
build=${1:-build}
out=${OUT:-gpu-logs}
mkdir -p "$out"
bin="$build/tests/astrai_gpu_tests"
export ASTRAI_JIT_CACHE_DIR=$(mktemp -d)
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"

run() {  # name, command...
  local name=$1; shift
  local start=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc, $((SECONDS - start)) s"
  grep -E "^\[doctest\] (test cases|assertions)|Status:|worst errors|^  (paged|rotary)|ERROR SUMMARY|RACECHECK SUMMARY|FAILED|ERROR" "$out/$name.log" | head -30
  [ $rc -eq 0 ] || status=1
}

run gpu_mma "$bin"
ASTRAI_JIT_NO_MMA=1 run gpu_nomma "$bin"
subset='*graph*,*all-empty*,*splits long*,*strided*,*fp16*,*zero tokens*'
run memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$bin" -tc="$subset"
run racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$bin" -tc="*graph*,*strided*,*fp16*"
run initcheck compute-sanitizer --tool initcheck --error-exitcode 1 "$bin" -tc="*graph*,*strided*,*all-empty*"
ASTRAI_JIT_NO_MMA=1 run memcheck_nomma compute-sanitizer --tool memcheck --error-exitcode 1 "$bin" -tc="*graph*,*strided*,*fp16*"
ASTRAI_JIT_NO_MMA=1 run racecheck_nomma compute-sanitizer --tool racecheck --error-exitcode 1 "$bin" -tc="*strided*"
exit $status
