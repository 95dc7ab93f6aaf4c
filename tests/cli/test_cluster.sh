#!/usr/bin/env bash
# The remote tier as a cluster uses it: CLUSTER_PROCS processes (default 32) of CLUSTER_THREADS
# warm threads (default 8), each process on a fresh local cache, warm the same variants against
# one redis-server at once. Each variant must be compiled once in the whole cluster (the others
# wait on its lease, then fetch it). A second wave of fresh processes, the remote now warm,
# compiles nothing. Prints each wave's per-process wall times (p50, p99). Exits 77 (skipped) when
# redis-server is absent, 1 instead under ASTRAI_REQUIRE_SERVERS=1.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

start_redis
export ASTRAI_JIT_REMOTE="redis://127.0.0.1:$PORT/0"
# Waiters must outlast a compile on a loaded machine; a lease that ran out would let a second
# node compile, which is what this test counts.
export ASTRAI_JIT_REMOTE_LEASE_MS=120000
PROCS=${CLUSTER_PROCS:-32}
THREADS=${CLUSTER_THREADS:-8}
printf '%s\n' rotary_emb.bf16.hd64.sm_89 rotary_emb.fp16.hd64.sm_89 rotary_emb.bf16.hd128.sm_89 \
  rotary_emb.fp16.hd128.sm_89 paged_decode.bf16.hd64.ps16.g4.sm_89 paged_decode.fp16.hd128.ps16.g4.sm_89 \
  decode.bf16.hd128.g4.sm_89 prefill.bf16.hd64.g4.sm_89 >"$WORK/manifest.txt"
VARIANTS=$(wc -l <"$WORK/manifest.txt")

# wave NAME: PROCS warms at once; sets COMPILED (their sum) and TIMES (each one's wall seconds).
wave() {
  local name=$1 pids=() i
  for i in $(seq "$PROCS"); do
    ASTRAI_JIT_CACHE_DIR="$WORK/$name-$i" "$BIN" warm --manifest "$WORK/manifest.txt" --jobs "$THREADS" \
      >"$WORK/$name-$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { cat "$WORK/$name-$((i + 1)).out" >&2; fail "$name process $((i + 1)) failed"; }
  done
  COMPILED=0
  TIMES=()
  for i in $(seq "$PROCS"); do
    local line
    line=$(grep -E '^warm: ' "$WORK/$name-$i.out") || { cat "$WORK/$name-$i.out" >&2; fail "no warm summary"; }
    [[ "$line" =~ ,\ ([0-9]+)\ compiled.*\ 0\ failed,\ ([0-9.]+)\ s\ wall ]] ||
      fail "$name process $i: unexpected summary '$line'"
    COMPILED=$((COMPILED + BASH_REMATCH[1]))
    TIMES+=("${BASH_REMATCH[2]}")
  done
}

# percentile P over TIMES (nearest rank)
percentile() {
  printf '%s\n' "${TIMES[@]}" | sort -g | awk -v p="$1" '{ v[NR] = $1 } END { r = int((p * NR + 99) / 100); if (r < 1) r = 1; print v[r] }'
}

check "$PROCS processes x $THREADS threads on fresh caches, one Redis: each of $VARIANTS variants compiled once"
wave cold
echo "cold wave: $COMPILED compiles in the cluster; per process p50 $(percentile 50) s, p99 $(percentile 99) s"
[[ "$COMPILED" -eq "$VARIANTS" ]] || fail "expected $VARIANTS compiles in the cluster, got $COMPILED"

check "a second wave of $PROCS fresh processes fetches everything: nothing compiled"
wave warm
echo "warm wave: $COMPILED compiles; per process (start, $VARIANTS fetches, exit) p50 $(percentile 50) s, p99 $(percentile 99) s"
[[ "$COMPILED" -eq 0 ]] || fail "expected no compile with the remote warm, got $COMPILED"

echo "cluster tests passed in $((SECONDS - START)) s"
