#!/usr/bin/env bash
# Multi-GPU checks (needs 2+ GPUs; exits 77 with fewer):
#   1. one process drives every GPU at once (the `multi_gpu` GPU test suite);
#   2. two processes, one GPU each (CUDA_VISIBLE_DEVICES), share one fresh cache directory and
#      run the same tests at the same time: every variant must be compiled exactly once across
#      both (the per-key lock), both must pass, `astrai-jit cache verify` must find every entry
#      valid; then a second pair over the same cache must compile nothing.
# Logs go to $OUT (or ./multi-gpu-logs). Usage: run_multi_gpu.sh BUILD_DIR
set -uo pipefail
build=${1:-build}
out=${OUT:-multi-gpu-logs}
mkdir -p "$out"
tests="$build/tests/astrai_gpu_tests"
cli="$build/tools/astrai-jit"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then
  echo "run_multi_gpu.sh: $gpus GPU(s) visible, needs 2"
  exit 77
fi
status=0
fail() { echo "FAIL: $*"; status=1; }

echo "== one process, $gpus GPUs"
ASTRAI_JIT_CACHE_DIR=$(mktemp -d) "$tests" -ts=multi_gpu -s > "$out/one_process.log" 2>&1 || fail "multi_gpu suite"
grep -E "multi-GPU case|^\[doctest\] (test cases|assertions)" "$out/one_process.log"

cache=$(mktemp -d)
filter='paged_decode,decode,rotary_emb'
for round in 1 2; do
  echo "== two processes on GPUs 0 and 1, shared cache, round $round"
  pids=()
  for gpu in 0 1; do
    CUDA_VISIBLE_DEVICES=$gpu ASTRAI_JIT_CACHE_DIR=$cache ASTRAI_JIT_LOG=info ASTRAI_TEST_SWEEP=20 \
      "$tests" -ts="$filter" > "$out/round${round}_gpu${gpu}.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}" || fail "round $round, process on GPU $i"; done
  for gpu in 0 1; do
    echo "   GPU $gpu: $(grep -E '^\[doctest\] test cases' "$out/round${round}_gpu${gpu}.log")"
  done
  compiled=$(cat "$out/round${round}_gpu0.log" "$out/round${round}_gpu1.log" |
             sed -n 's/.*compiled \([^ ]*\) in .*/\1/p' | sort)
  total=$(printf '%s\n' "$compiled" | grep -c . || true)
  twice=$(printf '%s\n' "$compiled" | uniq -d | grep -c . || true)
  echo "   variants compiled: $total, compiled more than once: $twice"
  [ "$twice" -eq 0 ] || fail "round $round: variants compiled twice: $(printf '%s\n' "$compiled" | uniq -d | tr '\n' ' ')"
  if [ "$round" = 1 ] && [ "$total" -eq 0 ]; then fail "round 1 compiled nothing (log level?)"; fi
  if [ "$round" = 2 ] && [ "$total" -ne 0 ]; then fail "round 2 recompiled $total variants"; fi
  "$cli" cache verify --cache-dir "$cache" > "$out/verify_round${round}.log" 2>&1 || fail "cache verify, round $round"
  tail -n 1 "$out/verify_round${round}.log"
done
exit $status
