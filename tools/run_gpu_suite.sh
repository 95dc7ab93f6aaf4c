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
  grep -E "^\[doctest\] (test cases|assertions)|worst errors|^  (paged|rotary|decode|prefill)|ERROR SUMMARY|RACECHECK SUMMARY|FAILED|ERROR|CRASH" "$out/$name.log" | head -40
  [ $rc -eq 0 ] || status=1
}

ASTRAI_TEST_SWEEP=${ASTRAI_TEST_SWEEP:-60} run gpu_mma "$bin"
ASTRAI_JIT_NO_MMA=1 run gpu_nomma "$bin"
# Representative subsets: every kernel, masks, append, graphs, strides, edge lengths.
mem='*graph*,*all-empty*,*splits long*,*strided*,*fused append*,*masks*,*zero tokens*,*tile edges*,*in bounds*,*edge lengths*'
race='*graph*,*fused append*,*strided*,*masks, strided*,*tile edges*,*zero tokens*'
init='*graph*,*fused append*,*padded strides*,*all-empty*,*tile edges*,*in bounds*'
run memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$bin" -tc="$mem"
run racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$bin" -tc="$race"
run initcheck compute-sanitizer --tool initcheck --error-exitcode 1 "$bin" -tc="$init"
ASTRAI_JIT_NO_MMA=1 run memcheck_nomma compute-sanitizer --tool memcheck --error-exitcode 1 "$bin" -tc="$mem"
ASTRAI_JIT_NO_MMA=1 run racecheck_nomma compute-sanitizer --tool racecheck --error-exitcode 1 "$bin" -tc="$race"
exit $status
