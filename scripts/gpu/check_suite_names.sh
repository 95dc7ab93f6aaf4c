#!/usr/bin/env bash
# Every GPU test runs in some job of run_gpu_suite.sh: each tests/gpu file with a test case puts
# them in a TEST_SUITE, and each suite's name is one the suite script passes to a job. (A test
# outside every suite ran only in the job that turns tensor cores off; a suite no job names
# never ran.) Usage: check_suite_names.sh [SOURCE_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
script="$root/scripts/gpu/run_gpu_suite.sh"
status=0
for file in "$root"/tests/gpu/test_*.cpp; do
  grep -q 'TEST_CASE(' "$file" || continue
  if ! grep -q 'TEST_SUITE("' "$file"; then
    echo "check_suite_names: $file has test cases outside every TEST_SUITE"; status=1; continue
  fi
  for suite in $(grep -o 'TEST_SUITE("[a-z0-9_]*")' "$file" | sed 's/TEST_SUITE("\(.*\)")/\1/' | sort -u); do
    if ! grep -Eq -- "--test-suite=([a-z0-9_]+,)*$suite(,|\$| |\")" "$script"; then
      echo "check_suite_names: suite $suite ($file) is in no job of $script"; status=1
    fi
  done
done
[ $status -eq 0 ] && echo "check_suite_names: every GPU test suite runs in a job"
exit $status
