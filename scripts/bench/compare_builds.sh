#!/usr/bin/env bash
# Times two builds against each other in one device call, passes interleaved (A B B A by default)
# so that clock and temperature drift weigh on both alike, then prints each row's mean per build
# and B's change against A (scripts/bench/compare_summary.py). Each build directory holds the binaries
# it needs, flat: astrai-sm90-check for the Hopper prefill timings, astrai-bench for bench rows.
#
#   scripts/bench/compare_builds.sh DIR_A DIR_B
#
# Environment: PASSES (default "A B B A"); SM90=1 runs `astrai-sm90-check --timings-only --reps
# 20 --sustained ${SUSTAINED:-1}` (burst and sustained rows), with `--filter $SM90_FILTER` when
# that is set (both builds then need the option, main from 60c8a25 on); BENCH=REGEX runs
# `astrai-bench --reps 30 --filter REGEX` (its JSON kept per pass). Raw output under $OUT (or
# ./compare-logs).
set -uo pipefail
if [ $# -ne 2 ] || [ ! -d "$1" ] || [ ! -d "$2" ]; then
  echo "usage: scripts/bench/compare_builds.sh DIR_A DIR_B (two directories of binaries)" >&2
  exit 2
fi
if [ "${SM90:-0}" != 1 ] && [ -z "${BENCH:-}" ]; then
  echo "compare_builds.sh: nothing to time: set SM90=1 and/or BENCH=REGEX" >&2
  exit 2
fi
declare -A dirs=([A]=$1 [B]=$2)
out=${OUT:-compare-logs}
mkdir -p "$out"
export ASTRAI_JIT_CACHE_DIR=${ASTRAI_JIT_CACHE_DIR:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
status=0
pass=0
for build in ${PASSES:-A B B A}; do
  dir=${dirs[$build]:?PASSES names only A and B}
  pass=$((pass + 1))
  echo "== pass $pass: $build ($dir)"
  if [ "${SM90:-0}" = 1 ]; then
    # The whole output is kept: a failed check (a compile log, say) is what to read when a pass
    # gives no timing lines. grep -a: a log may hold bytes that would make grep call it binary.
    filter=()
    [ -n "${SM90_FILTER:-}" ] && filter=(--filter "$SM90_FILTER")
    timeout 300 "$dir/astrai-sm90-check" --timings-only --reps 20 --sustained "${SUSTAINED:-1}" "${filter[@]}" \
      > "$out/sm90-$build-$pass.log" 2>&1 || status=1
    grep -a -E "^(TIME|SUSTAINED) prefill" "$out/sm90-$build-$pass.log" >> "$out/sm90-$build.txt" || status=1
    grep -a -E "FAIL|failure" "$out/sm90-$build-$pass.log" | head -5
  fi
  if [ -n "${BENCH:-}" ]; then
    timeout 300 "$dir/astrai-bench" --reps 30 --filter "$BENCH" --json "$out/bench-$build-$pass.json" \
      > /dev/null 2>> "$out/bench.log" || status=1
  fi
done
python3 "$here/compare_summary.py" "$out" || status=1
exit $status
