#!/usr/bin/env bash
# Runs the whole GPU suite on a machine with a GPU, every kernel path and compute-sanitizer, in
# one parallel phase sized for one device call: each path's suites are split into jobs of about
# equal time (the decode suites in two), so that no one job sets the whole. The suites' time goes
# mostly to NVRTC compiles of fresh variants, so the jobs run at once, spread over the visible
# GPUs, and share one cache directory. Jobs (each under `timeout STEP_TIMEOUT`; logs $OUT/NAME.log):
#   default_decode, default_decode_more  the decode and paged_decode suites, and the kv_fp8,
#                    multi_token and mla_decode suites, on the default path (tensor cores; on
#                    sm_90a the TMA decode), ASTRAI_TEST_SWEEP random cases;
#   default_prefill  prefill, paged_prefill, rotary_emb, merge_states, cascade and fp8_attention
#                    suites (on sm_90a the Hopper prefill, tilings chosen by grid size);
#   multi_gpu        the multi_gpu suite with every GPU visible, only where two or more are (else
#                    listed as NOT RUN in the verdicts, never as passed);
#   nomma_decode, nomma_decode_more, nomma_rest  the whole suite on CUDA cores
#                    (ASTRAI_JIT_NO_MMA=1), half the sweep: the decode suites in the two halves
#                    above, and every other suite but multi_gpu;
#   on sm_90a: narrow and wide_prefill (ASTRAI_JIT_PREFILL_TILES=narrow or wide: the prefill
#   suites on one tiling wherever it serves, half the sweep; the suites' grids are small, so the
#   default takes the narrow tiling for most of them), nowgmma_decode, nowgmma_decode_more and
#   nowgmma_prefill (ASTRAI_JIT_NO_WGMMA=1: the portable decode and prefill kernels, FP8 caches
#   included, 3/4 of the sweep), wide_decode (ASTRAI_JIT_DECODE_TILES=wide: the decode suites and
#   kv_fp8 on wide CTAs, half the sweep) and sm90_check
#   (astrai-sm90-check --check-only, when BUILD_DIR/bench has it);
#   memcheck, racecheck, synccheck and initcheck over the decode suites, over the prefill
#   suites and over kv_fp8, rotary_emb, merge_states, cascade, mla_decode and fp8_attention (the
#   FP8 append writes the cache; default path, SAN_SWEEP random cases), and on sm_90a racecheck and
#   synccheck with the wide decode CTAs and the wide prefill tiles forced.
# Nothing skips silently: ASTRAI_REQUIRE_GPU=1 turns a missing GPU (exit 77) and a filter that
# runs no test case into failures; every job's verdict says how many cases it compared; the data
# come from ASTRAI_TEST_SEED, new each run unless given, printed first (repeat a run with it).
# A job cut by its time limit reports TIMED OUT and fails the run, like a failed test. The last
# lines of the output list every job's verdict.
# Usage: scripts/gpu/run_gpu_suite.sh BUILD_DIR. Environment: OUT (default ./gpu-logs),
# ASTRAI_TEST_SWEEP (default 4), ASTRAI_TEST_SEED (default: drawn), SAN_SWEEP (default 1),
# STEP_TIMEOUT (seconds, default 480), SKIP_SANITIZERS=1, ONLY (an extended regex: only the jobs
# whose names match run; the others are listed as NOT RUN, and the run never counts as whole).
set -uo pipefail
build=${1:-build}
out=${OUT:-gpu-logs}
mkdir -p "$out"
bin="$build/tests/astrai_gpu_tests"
[ -x "$bin" ] || { echo "run_gpu_suite.sh: no test binary at $bin" >&2; exit 2; }
export ASTRAI_JIT_CACHE_DIR=${ASTRAI_JIT_CACHE_DIR:-$(mktemp -d)}
export ASTRAI_REQUIRE_GPU=1
export ASTRAI_TEST_SEED=${ASTRAI_TEST_SEED:-$(( (RANDOM << 15 | RANDOM) + 1 ))}
echo "ASTRAI_TEST_SEED=$ASTRAI_TEST_SEED" | tee "$out/seed.txt"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$gpus" -ge 1 ] || gpus=1
hopper=0
nvidia-smi --query-gpu=compute_cap --format=csv,noheader | grep -q '^9\.0' && hopper=1
sweep=${ASTRAI_TEST_SWEEP:-4}
half=$(( sweep / 2 > 0 ? sweep / 2 : 1 ))
three_quarters=$(( sweep * 3 / 4 > 0 ? sweep * 3 / 4 : 1 ))
san_sweep=${SAN_SWEEP:-1}
limit=${STEP_TIMEOUT:-480}
decode_suites=--test-suite=decode,paged_decode,kv_fp8,multi_token,mla_decode
# The decode suites in two halves of about equal time: the longest jobs, split.
decode_core=--test-suite=decode,paged_decode
decode_more=--test-suite=kv_fp8,multi_token,mla_decode
prefill_suites=--test-suite=prefill,paged_prefill,rotary_emb,merge_states,cascade,fp8_attention
status=0
names=()
pids=()
next_gpu=0

start_job() {  # name, env assignments..., -- command... (JOB_ALL_GPUS=1 start_job ...: every GPU visible)
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && ! [[ $name =~ ^($ONLY)$ ]]; then
    not_run+=("$name: NOT RUN (ONLY=$ONLY)"); return
  fi
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local gpu=$((next_gpu % gpus)); next_gpu=$((next_gpu + 1))
  local visible=(CUDA_VISIBLE_DEVICES=$gpu)
  if [ "${JOB_ALL_GPUS:-0}" = 1 ]; then gpu=all; visible=(); fi
  ( start=$SECONDS
    env "${visible[@]}" "${envs[@]}" timeout "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    echo "exit $rc after $((SECONDS - start)) s on GPU $gpu" >> "$out/$name.log"
    exit $rc ) &
  names+=("$name"); pids+=($!)
}

# What a job ran, from its log: the suite's case and test-case counts, or the check tool's.
job_counts() {
  local log=$1
  local cases tests checks
  cases=$(grep -a -m1 -oE '^cases run: [0-9]+' "$log" | grep -oE '[0-9]+$')
  tests=$(grep -a -m1 -oE '^test cases run: [0-9]+' "$log" | grep -oE '[0-9]+$')
  checks=$(grep -a -cE '^(PASS|FAIL) ' "$log")
  if [ -n "$cases" ]; then echo "$cases cases in ${tests:-?} test cases"
  elif [ "$checks" -gt 0 ]; then echo "$checks checks"
  else echo "no cases counted"; fi
}

wait_jobs() {
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    local rc=$?
    local verdict=passed
    [ $rc -eq 124 ] && verdict="TIMED OUT after ${limit} s"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && verdict="FAILED (exit $rc)"
    local counts
    counts=$(job_counts "$out/${names[$i]}.log")
    # A job that compared nothing proved nothing.
    [ $rc -eq 0 ] && [ "$counts" = "no cases counted" ] && { verdict="FAILED (no case ran)"; rc=1; }
    echo "== ${names[$i]}: $verdict, $counts; $(tail -n 1 "$out/${names[$i]}.log")"
    verdicts+=("${names[$i]}: $verdict, $counts")
    # The sanitizers' own reports too (which kernel, at which offsets): a device run returns
    # only a few log files, so what names a failure must be in this output.
    grep -a -E "^\[doctest\] (test cases|assertions)|^NOT RUN|^ASTRAI_TEST_SEED|worst errors|^  (paged|rotary|decode|prefill)|ERROR SUMMARY|RACECHECK SUMMARY|FAILED|ERROR:|CRASH|^[0-9]+ failure|=+ +(Error|Warning|Barrier|Invalid|and (Read|Write) access)" \
      "$out/${names[$i]}.log" | head -40
    [ $rc -eq 0 ] || status=1
  done
  names=(); pids=()
}

not_run=()
start_job default_decode ASTRAI_TEST_SWEEP=$sweep -- "$bin" $decode_core
start_job default_decode_more ASTRAI_TEST_SWEEP=$sweep -- "$bin" $decode_more
start_job default_prefill ASTRAI_TEST_SWEEP=$sweep -- "$bin" $prefill_suites
start_job nomma_decode ASTRAI_TEST_SWEEP=$half ASTRAI_JIT_NO_MMA=1 -- "$bin" $decode_core
start_job nomma_decode_more ASTRAI_TEST_SWEEP=$half ASTRAI_JIT_NO_MMA=1 -- "$bin" $decode_more
start_job nomma_rest ASTRAI_TEST_SWEEP=$half ASTRAI_JIT_NO_MMA=1 -- "$bin" \
  --test-suite-exclude=multi_gpu,${decode_suites#--test-suite=}
if [ "$gpus" -ge 2 ]; then
  JOB_ALL_GPUS=1 start_job multi_gpu -- "$bin" --test-suite=multi_gpu
else
  not_run+=("multi_gpu: NOT RUN ($gpus GPU visible, needs 2)")
fi
if [ $hopper = 1 ]; then
  start_job narrow ASTRAI_TEST_SWEEP=$half ASTRAI_JIT_PREFILL_TILES=narrow -- "$bin" \
    --test-suite=prefill,paged_prefill
  start_job nowgmma_decode ASTRAI_TEST_SWEEP=$three_quarters ASTRAI_JIT_NO_WGMMA=1 -- "$bin" \
    $decode_core
  start_job nowgmma_decode_more ASTRAI_TEST_SWEEP=$three_quarters ASTRAI_JIT_NO_WGMMA=1 -- "$bin" \
    $decode_more
  start_job nowgmma_prefill ASTRAI_TEST_SWEEP=$three_quarters ASTRAI_JIT_NO_WGMMA=1 -- "$bin" \
    --test-suite=prefill,paged_prefill,cascade
  # The Hopper decode's wide CTAs (a request's splits merged in one CTA) wherever they serve,
  # and the two sanitizers that watch their named barriers.
  start_job wide_decode ASTRAI_TEST_SWEEP=$half ASTRAI_JIT_DECODE_TILES=wide -- "$bin" \
    --test-suite=decode,paged_decode,multi_token,kv_fp8
  start_job wide_prefill ASTRAI_TEST_SWEEP=$half ASTRAI_JIT_PREFILL_TILES=wide -- "$bin" \
    --test-suite=prefill,paged_prefill
  # The Hopper prefill's every tiling (the alternatives the runtime does not pick) against the
  # reference, when the build has the check tool.
  check="$build/bench/astrai-sm90-check"
  [ -x "$check" ] && start_job sm90_check -- "$check" --check-only
fi
if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    start_job "${tool}_decode" ASTRAI_TEST_SWEEP=$san_sweep -- \
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin" --test-suite=decode,paged_decode,multi_token
    start_job "${tool}_prefill" ASTRAI_TEST_SWEEP=$san_sweep -- \
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin" --test-suite=prefill,paged_prefill
    start_job "${tool}_fp8_rotary_merge" ASTRAI_TEST_SWEEP=$san_sweep -- \
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin" --test-suite=kv_fp8,rotary_emb,merge_states,cascade,mla_decode,fp8_attention
  done
  if [ $hopper = 1 ]; then
    for tool in racecheck synccheck; do
      start_job "${tool}_wide_decode" ASTRAI_TEST_SWEEP=$san_sweep ASTRAI_JIT_DECODE_TILES=wide -- \
        compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin" --test-suite=decode,paged_decode,kv_fp8
      start_job "${tool}_wide_prefill" ASTRAI_TEST_SWEEP=$san_sweep ASTRAI_JIT_PREFILL_TILES=wide -- \
        compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin" --test-suite=prefill,paged_prefill
    done
  fi
fi
verdicts=()
wait_jobs
# One line a job last, so that the tail of the output alone gives every verdict.
echo "== verdicts (ASTRAI_TEST_SEED=$ASTRAI_TEST_SEED)"
printf '%s\n' "${verdicts[@]}"
[ ${#not_run[@]} -eq 0 ] || printf '%s\n' "${not_run[@]}"
[ -n "${ONLY:-}" ] && echo "a partial run (ONLY=$ONLY): not a verdict on the whole suite"
exit $status
