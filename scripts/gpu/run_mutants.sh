#!/usr/bin/env bash
# Runs each deliberately broken kernel's GPU tests (built by scripts/gpu/build_mutants.sh) and
# fails unless every mutant is caught: its binary must exit non-zero with failed assertions on
# the cases its patch names (`# caught-by:`), with the sweeps at their default size.
#
#   scripts/gpu/run_mutants.sh DIR     (logs under $OUT, else DIR; STEP_TIMEOUT seconds a mutant)
set -uo pipefail
dir=${1:?usage: scripts/gpu/run_mutants.sh DIR}
out=${OUT:-$dir}
export ASTRAI_REQUIRE_GPU=1
export ASTRAI_JIT_CACHE_DIR=${ASTRAI_JIT_CACHE_DIR:-$(mktemp -d)}
survived=0
names=()
# The mutants run at once: their time goes mostly to NVRTC compiles of their own variants.
for patch in "$dir"/*.patch; do
  name=$(basename "$patch" .patch)
  filter=$(sed -n 's/^# caught-by: //p' "$patch")
  binary=$dir/astrai_gpu_tests.$name
  [ -x "$binary" ] || { echo "mutant $name: no binary $binary"; survived=1; continue; }
  names+=("$name")
  ( start=$SECONDS
    timeout "${STEP_TIMEOUT:-300}" "$binary" -tc="$filter" --duration=false > "$out/mutant-$name.log" 2>&1
    echo "exit $? after $((SECONDS - start)) s" >> "$out/mutant-$name.log" ) &
done
wait
for name in "${names[@]}"; do
  log=$out/mutant-$name.log
  rc=$(tail -n 1 "$log" | sed -n 's/^exit \([0-9]*\) .*/\1/p')
  failed=$(grep -a -c -E "ERROR: (CHECK|REQUIRE)" "$log")
  summary="$(grep -a "test cases:" "$log" | tail -n 1); $(tail -n 1 "$log")"
  # A timed-out or crashed run is no proof that the suite sees the fault: only failed checks are.
  if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$failed" -gt 0 ]; then
    echo "mutant $name: caught, $failed failed checks; $summary"
    grep -a -m 2 -A 3 -E "ERROR: (CHECK|REQUIRE)" "$log" | sed 's/^/    /'
  else
    echo "mutant $name: SURVIVED ($failed failed checks); $summary"
    survived=1
  fi
done
[ ${#names[@]} -gt 0 ] || { echo "run_mutants: no mutants under $dir"; exit 1; }
exit "$survived"
