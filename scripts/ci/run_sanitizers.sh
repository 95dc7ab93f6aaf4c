#!/usr/bin/env bash
# Unit tests under sanitizers (Debug -O0 -g1, tools off):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (build-asan): the CTest entry `unit`,
#         that is the whole doctest binary except the kernel compile sweeps, which
#         tests/CMakeLists.txt lists once (ASTRAI_UNIT_SWEEPS_A/B) for both this run and CTest.
#   tsan  ThreadSanitizer (build-tsan): astrai_concurrency_tests, the suites whose cases run
#         threads or processes against shared state (the cache, the file lock, the JIT engine,
#         cache sharing; tests/CMakeLists.txt lists them), every case of them; and the remote
#         tier's tests (astrai_remote_tests, against real redis-server and nginx) but the case of
#         a forked child: TSan cannot follow a process that starts threads after a multi-threaded
#         fork (it dies there), so that case runs in the Release and ASan trees only.
# Why the sweeps are left out: they compile every family over archs, head dims, page sizes and
# features (about 250 of the suite's 270 s in a Release build, 180 of 220 s under ASan, nearly
# all of it inside NVRTC). NVRTC is not instrumented, so under ASan they repeat the same host
# path with other template arguments and find nothing the remaining tests do not: every compile
# path of our code (the NVRTC wrapper, PTX output, compile errors with their log, the engine,
# the cache) still runs under ASan through test_kernel_compile's other cases, test_jit_engine and
# test_cache_trust_*. The Release CTest run (scripts/ci/run_tests.sh) runs the sweeps.
# Usage: scripts/ci/run_sanitizers.sh [asan|tsan|all (default)]
# Environment: CXX picks the compiler (default: the system c++); ASTRAI_SAN_BUILD_ROOT puts
# the build directories elsewhere (default: the repository root).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
what=${1:-all}
build_root=${ASTRAI_SAN_BUILD_ROOT:-$root}
export PATH=/usr/local/cuda/bin:$PATH

# --as-needed: Debian's gcc drops it when sanitizing, and the stub libcuda that CUDA::nvrtc
# brings along must not become a load-time dependency (the driver is loaded with dlopen).
# -O0 -g1 (line tables: reports still name file and line): on the 2-core development machine
# the ASan tree built in 240 s against 531 s with -O1 -g and the whole script took 375 s against
# 743 (so the TSan tree about 91 s against 140), while the tests ran 49 s against 43 and 21-24 s
# against 23.
configure_and_build() {  # dir flags target...
  local dir=$1 flags=$2
  shift 2
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" -DCMAKE_UNITY_BUILD=ON \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags -Wl,--as-needed" \
    -DASTRAI_JIT_BUILD_TOOLS=OFF -DASTRAI_JIT_INSTALL=OFF -DASTRAI_JIT_BUILD_TESTS=ON >/dev/null
  cmake --build "$dir" --target "$@" -j "$(nproc)"
}

status=0
run() {  # label command...
  local label=$1
  shift
  local start=$(date +%s)
  if "$@"; then
    echo "run_sanitizers: $label: clean ($(($(date +%s) - start)) s)"
  else
    echo "run_sanitizers: $label: FAILED" >&2
    status=1
  fi
}

if [ "$what" = asan ] || [ "$what" = all ]; then
  dir=$build_root/build-asan
  configure_and_build "$dir" "-fsanitize=address,undefined -fno-sanitize-recover=undefined" astrai_unit_tests
  run "asan+ubsan unit tests" env \
    ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$dir" -R '^unit$' -V
fi

if [ "$what" = tsan ] || [ "$what" = all ]; then
  dir=$build_root/build-tsan
  configure_and_build "$dir" "-fsanitize=thread" astrai_concurrency_tests astrai_remote_tests
  run "tsan concurrency tests" env \
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "$dir/tests/astrai_concurrency_tests"
  run "tsan remote tier tests" env \
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "$dir/tests/astrai_remote_tests" "-tce=*forked child*"
fi
exit $status
