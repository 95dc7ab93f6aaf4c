#!/usr/bin/env bash
# On a GPU machine whose python3 already has PyTorch (and pytest): installs a prebuilt astrai-jit
# wheel into a directory on PYTHONPATH (a venv made from a venv's python would not see the
# PyTorch of that venv), runs the Python suite (GPU tests included) and the host-overhead
# benchmark. Logs go to $OUT when set. ASTRAI_REQUIRE_GPU=1: a torch that cannot reach CUDA, or a
# run in which no GPU test ran, fails (python/tests/conftest.py); ASTRAI_TEST_SEED (default: drawn
# each run, printed) seeds the data.
# ASTRAI_CHECKOUTS: paths of AstrAI checkouts at the pinned commits (scripts/astrai/harness.py); for
# each, AstrAI's own kernels are built (unless already there), its tests run with them and with
# astrai-jit's, and every test that passes with AstrAI's must pass with ours (logs in $OUT/astrai-*).
# Usage: scripts/gpu/run_python_gpu_suite.sh WHEEL_DIR [pytest args...]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
wheels=${1:?usage: scripts/gpu/run_python_gpu_suite.sh WHEEL_DIR [pytest args...]}
shift
out=${OUT:-/tmp/python-gpu-out}
site=${SITE:-$(mktemp -d)}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-deps --no-index --target "$site" "$wheels"/astrai_jit-*.whl || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export ASTRAI_JIT_CACHE_DIR=${ASTRAI_JIT_CACHE_DIR:-$(mktemp -d)}
export ASTRAI_REQUIRE_GPU=1
export ASTRAI_TEST_SEED=${ASTRAI_TEST_SEED:-$(( (RANDOM << 15 | RANDOM) + 1 ))}
echo "ASTRAI_TEST_SEED=$ASTRAI_TEST_SEED"
cd "$out"
python3 -m pytest "$root/python/tests" -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$out/pytest.txt"
status=${PIPESTATUS[0]}
python3 "$root/python/bench/host_overhead.py" 2>&1 | tee "$out/host_overhead.txt"
for checkout in ${ASTRAI_CHECKOUTS:-}; do
  commit=$(python3 "$root/scripts/astrai/harness.py" identify "$checkout") || { status=1; continue; }
  log=$out/astrai-$commit
  if ! ls "$checkout"/astrai/extension/lib/attn_decode.*.so* >/dev/null 2>&1; then
    python3 "$root/scripts/astrai/harness.py" build-own "$checkout" >"$log-build.log" 2>&1 ||
      { echo "AstrAI $commit: its own build failed ($log-build.log)"; status=1; continue; }
  fi
  for kernels in own jit; do
    python3 "$root/scripts/astrai/harness.py" test "$checkout" $kernels "$log-$kernels.xml" >"$log-$kernels.log" 2>&1
    tail -n 3 "$log-$kernels.log"
  done
  python3 "$root/scripts/astrai/harness.py" compare "$log-own.xml" "$log-jit.xml" | tee "$log-compare.txt" ||
    status=1
done
exit "$status"
