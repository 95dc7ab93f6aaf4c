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
# ASTRAI_BENCH=1: then, for each, the side-by-side bench of AstrAI's kernels and ours
# (bench/astrai_side_by_side.py), and at 75304d0 AstrAI's engine end to end with its kernels, ours
# and its torch backend (bench/astrai_e2e.py; tokens compared, not required to match).
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
  [ "${ASTRAI_BENCH:-0}" = 1 ] || continue
  # AstrAI's own modules back in place: the side-by-side loads them by file, the engine by name.
  python3 -m astrai_jit.astrai_install --astrai "$checkout" --uninstall > /dev/null
  (cd "$root/bench" && python3 astrai_side_by_side.py "$checkout" --commit "$commit" --json "$log-sbs.json") \
    2>&1 | tee "$log-sbs.txt"
  [ "$commit" = 75304d0 ] || continue
  for kernels in own jit torch; do
    backend=cuda
    case $kernels in
      jit) python3 -m astrai_jit.astrai_install --astrai "$checkout" > /dev/null ;;
      torch) backend=torch ;;
    esac
    (cd "$checkout" && PYTHONPATH="$checkout:$PYTHONPATH" python3 "$root/bench/astrai_e2e.py" --backend $backend \
      --json "$log-e2e-$kernels.json") 2>&1 | tail -n 1
  done
  python3 -m astrai_jit.astrai_install --astrai "$checkout" --uninstall > /dev/null
  # Greedy tokens of two correct bf16 kernel sets may part at near-ties (bench/astrai_e2e.py): reported, not failed.
  python3 "$root/bench/astrai_e2e.py" --compare "$log-e2e-own.json" "$log-e2e-jit.json" "$log-e2e-torch.json" |
    tee "$log-e2e.txt"
done
exit "$status"
