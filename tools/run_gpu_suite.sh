#!/usr/bin/env bash
# Runs the GPU suite on a machine with a GPU: the tensor-core path (on sm_90a: the Hopper prefill
# kernels), the CUDA-core path (ASTRAI_JIT_NO_MMA=1), on sm_90a the portable prefill kernels
# (ASTRAI_JIT_NO_WGMMA=1), then compute-sanitizer's memcheck, racecheck and initcheck over the
# whole suite on both paths (random sweeps cut to SAN_SWEEP extra cases, default 10, to bound
# the time). The two plain runs, and then the six sanitizer runs, go in parallel, spread over
# the visible GPUs; all share one cache directory, warmed by the plain runs.
# Logs go to $OUT (or ./gpu-logs). Usage: run_gpu_suite.sh BUILD_DIR
# Environment: ASTRAI_TEST_SWEEP (plain runs' sweep size, default 60), SAN_SWEEP,
# SAN_TIMEOUT (seconds per sanitizer run, default 420), SKIP_SANITIZERS=1.
set -uo pipefail
build=${1:-build}
out=${OUT:-gpu-logs}
mkdir -p "$out"
bin="$build/tests/astrai_gpu_tests"
export ASTRAI_JIT_CACHE_DIR=${ASTRAI_JIT_CACHE_DIR:-$(mktemp -d)}
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$gpus" -ge 1 ] || gpus=1
status=0
names=()
pids=()
next_gpu=0

start_job() {  # name, env assignments..., -- command...
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local gpu=$((next_gpu % gpus)); next_gpu=$((next_gpu + 1))
  ( start=$SECONDS
    env CUDA_VISIBLE_DEVICES=$gpu "${envs[@]}" "$@" > "$out/$name.log" 2>&1
    rc=$?
    echo "exit $rc after $((SECONDS - start)) s on GPU $gpu" >> "$out/$name.log"
    exit $rc ) &
  names+=("$name"); pids+=($!)
}

wait_jobs() {
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    local rc=$?
    echo "== ${names[$i]}: $(tail -n 1 "$out/${names[$i]}.log")"
    grep -E "^\[doctest\] (test cases|assertions)|worst errors|^  (paged|rotary|decode|prefill)|ERROR SUMMARY|RACECHECK SUMMARY|FAILED|ERROR:|CRASH" \
      "$out/${names[$i]}.log" | head -40
    [ $rc -eq 0 ] || status=1
  done
  names=(); pids=()
}

start_job gpu_mma ASTRAI_TEST_SWEEP=${ASTRAI_TEST_SWEEP:-60} -- "$bin"
start_job gpu_nomma ASTRAI_TEST_SWEEP=${ASTRAI_TEST_SWEEP:-60} ASTRAI_JIT_NO_MMA=1 -- "$bin"
# On sm_90a the default path runs the Hopper prefill kernels; this one the portable mma.sync ones.
if nvidia-smi --query-gpu=compute_cap --format=csv,noheader | grep -q '^9\.0'; then
  start_job gpu_nowgmma ASTRAI_TEST_SWEEP=${ASTRAI_TEST_SWEEP:-60} ASTRAI_JIT_NO_WGMMA=1 -- "$bin" \
    --test-suite=prefill,paged_prefill
fi
wait_jobs

if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  san_timeout=${SAN_TIMEOUT:-420}
  for tool in memcheck racecheck initcheck; do
    for path in mma nomma; do
      nomma=0; [ $path = nomma ] && nomma=1
      start_job "${tool}_${path}" ASTRAI_TEST_SWEEP=${SAN_SWEEP:-10} ASTRAI_JIT_NO_MMA=$nomma -- \
        timeout "$san_timeout" compute-sanitizer --tool "$tool" --error-exitcode 1 "$bin"
    done
  done
  wait_jobs
fi
exit $status
