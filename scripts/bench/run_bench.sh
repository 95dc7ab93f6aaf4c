#!/usr/bin/env bash
# Runs astrai-bench on a machine with a GPU (builds nothing). The table goes to
# $OUT/bench.txt, the JSON to $OUT/bench.json, progress and library messages to
# $OUT/bench.log; the table is printed last. Extra arguments go to astrai-bench, e.g.
#   BUILD=build OUT=bench-out scripts/bench/run_bench.sh --filter 'paged_decode|rotary' --reps 50
# With REFERENCE=1 (the default when no arguments are given) and PyTorch importable, PyTorch's
# cuDNN attention then runs on the same shapes (bench/torch_reference.py --filter cudnn
# --sustained 1, into $OUT/reference.txt) and scripts/bench/hopper_targets.py prints issue 9's target
# table from the two ($OUT/targets.md), so that every ratio is read from one run.
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
here=$(cd "$(dirname "$0")" && pwd)
if [ "${REFERENCE:-$([ $# -eq 0 ] && echo 1 || echo 0)}" = 1 ] && [ $rc -eq 0 ]; then
  rm -f "$out/reference.txt"
  if python3 -c 'import torch' > /dev/null 2>&1; then
    python3 "$here/../../bench/torch_reference.py" --filter cudnn --sustained 1 > "$out/reference.txt" 2>&1 ||
      echo "== bench/torch_reference.py failed; see $out/reference.txt"
  else
    echo "== no PyTorch here: the target table's reference rows stay unmeasured"
  fi
  python3 "$here/hopper_targets.py" --bench "$out/bench.json" \
    $([ -s "$out/reference.txt" ] && echo --reference "$out/reference.txt") > "$out/targets.md"
  echo "== issue 9's targets ($out/targets.md)"
  cat "$out/targets.md"
fi
exit $rc
