#!/usr/bin/env bash
# One device call for the Hopper (sm_90a) path on an H100/H200:
#   1. the GPU suite: the whole suite on the default path (Hopper prefill kernels), and the
#      prefill suites with ASTRAI_JIT_NO_WGMMA=1 (portable mma.sync) and ASTRAI_JIT_NO_MMA=1
#      (CUDA cores), in parallel;
#   2. compute-sanitizer memcheck, racecheck and synccheck over the prefill suites (default
#      path) and over astrai-sm90-check --small, in parallel;
#   3. alone on the GPU: astrai-sm90-check (GEMM and prefill checks, timings beside the portable
#      kernel), PyTorch's cuDNN and FA2 on the same shapes (bench/torch_reference.py), and the
#      benchmark's prefill rows (ceilings measured, GEMM included).
# Usage: scripts/gpu/run_sm90.sh BUILD_DIR. Logs under $OUT (or ./sm90-logs). Environment:
# ASTRAI_TEST_SWEEP (default 20), SAN_SWEEP (default 3), STEP_TIMEOUT (seconds, default 240),
# SKIP_SUITES=1 and SKIP_SANITIZERS=1 leave out steps 1 and 2.
set -uo pipefail
build=${1:-build}
out=${OUT:-sm90-logs}
mkdir -p "$out"
tests="$build/tests/astrai_gpu_tests"
check="$build/bench/astrai-sm90-check"
limit=${STEP_TIMEOUT:-240}
export ASTRAI_JIT_CACHE_DIR=${ASTRAI_JIT_CACHE_DIR:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,temperature.gpu --format=csv,noheader
status=0

run_parallel() {  # name=command ... ; each line "name: exit N after S s" and the doctest totals
  local names=() pids=()
  for job in "$@"; do
    local name=${job%%=*} command=${job#*=}
    ( start=$SECONDS; eval "$command" > "$out/$name.log" 2>&1; rc=$?
      echo "exit $rc after $((SECONDS - start)) s" >> "$out/$name.log"; exit $rc ) &
    names+=("$name"); pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || status=1
    echo "== ${names[$i]}: $(tail -n 1 "$out/${names[$i]}.log")"
    grep -E "^\[doctest\] (test cases|assertions)|ERROR SUMMARY|RACECHECK SUMMARY|ERROR:|FAIL|failure" \
      "$out/${names[$i]}.log" | head -12
  done
}

sweep=${ASTRAI_TEST_SWEEP:-20}
san=${SAN_SWEEP:-3}
suites=--test-suite=prefill,paged_prefill
[ "${SKIP_SUITES:-0}" = 1 ] || run_parallel \
  "gpu_default=ASTRAI_TEST_SWEEP=$sweep timeout $limit $tests" \
  "gpu_nowgmma=ASTRAI_TEST_SWEEP=$sweep ASTRAI_JIT_NO_WGMMA=1 timeout $limit $tests $suites" \
  "gpu_nomma=ASTRAI_TEST_SWEEP=$sweep ASTRAI_JIT_NO_MMA=1 timeout $limit $tests $suites"
jobs=()
for tool in memcheck racecheck synccheck; do
  jobs+=("${tool}_suite=ASTRAI_TEST_SWEEP=$san timeout $limit compute-sanitizer --tool $tool --error-exitcode 9 $tests $suites")
  jobs+=("${tool}_check=timeout $limit compute-sanitizer --tool $tool --error-exitcode 9 $check --small")
done
[ "${SKIP_SANITIZERS:-0}" = 1 ] || run_parallel "${jobs[@]}"

timeout "$limit" "$check" > "$out/sm90-check.txt" 2>&1 || status=1
grep -E "FAIL|TIME|failure|NVRTC" "$out/sm90-check.txt"
PYTHONUNBUFFERED=1 timeout "$limit" python3 bench/torch_reference.py 2>&1 | tee "$out/torch-reference.txt"
timeout "$limit" "$build/bench/astrai-bench" --filter '^(prefill|paged_prefill)/' --reps 10 \
  > "$out/bench-prefill.txt" 2>&1 || status=1
grep -E "GEMM|streaming|prefill" "$out/bench-prefill.txt" | head -30
exit $status
