#!/usr/bin/env bash
# Runs astrai-bench on a machine with a GPU (builds nothing). The table goes to
# $OUT/bench.txt, the JSON to $OUT/bench.json, progress and library messages to
# $OUT/bench.log; the table is printed last. Extra arguments go to astrai-bench, e.g.
#   BUILD=build OUT=bench-out tools/run_bench.sh --filter 'paged_decode|rotary' --reps 50
set -uo pipefail
build=${BUILD:-build}
out=${OUT:-bench-out}
bin="$build/bench/astrai-bench"
if [ ! -x "$bin" ]; then
  echo "run_bench.sh: $bin not found; build the astrai-bench target first (BUILD=<build dir>)" >&2
  exit 2
fi
mkdir -p "$out"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv > "$out/gpu.txt" 2>&1
fi
"$bin" --json "$out/bench.json" "$@" > "$out/bench.txt" 2> "$out/bench.log"
rc=$?
if [ $rc -ne 0 ]; then
  echo "== astrai-bench exited with $rc; last lines of $out/bench.log:"
  tail -n 20 "$out/bench.log"
fi
[ -s "$out/gpu.txt" ] && cat "$out/gpu.txt"
cat "$out/bench.txt"
exit $rc
