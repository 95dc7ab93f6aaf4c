#!/usr/bin/env bash
# Set-up on a fresh machine: install the build dependencies, build the `astrai-jit` tool and the
# demo (CMake preset `release`: the tree scripts/ci/run_tests.sh then builds on), install the tool on
# the PATH, fill the kernel cache with `astrai-jit warm` (for the local GPU, or sm_90a when there
# is none) and, with a GPU, run a short paged_decode demo checked against a CPU reference.
#
# Usage: scripts/ci/bootstrap.sh
#   BUILD_DIR      the build tree (default: build/)
#   ASTRAI_PREFIX  where the tool is installed, as PREFIX/bin/astrai-jit (default: ~/.local,
#                  /usr/local as root); `none` leaves it in the build tree only
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
if [ "$(id -u)" -eq 0 ]; then default_prefix=/usr/local; else default_prefix=$HOME/.local; fi
prefix=${ASTRAI_PREFIX:-$default_prefix}
export PATH=/usr/local/cuda/bin:$PATH
began=$SECONDS
step() { echo "bootstrap: [$1/5] $2"; }

step 1 "build dependencies (Debian packages; apt runs only for missing ones)"
"$root/scripts/ci/install_deps.sh"

step 2 "building astrai-jit and astrai-demo in $build (about a minute on 2 cores)"
cmake -S "$root" --preset release -B "$build" >/dev/null
cmake --build "$build" -j "$(nproc)" --target astrai-jit astrai-demo
cli=$build/tools/astrai-jit

if [ "$prefix" = none ]; then
  step 3 "install skipped (ASTRAI_PREFIX=none): the tool is $cli"
else
  step 3 "installing the tool as $prefix/bin/astrai-jit"
  cmake --install "$build" --component cli --prefix "$prefix" >/dev/null
  cli=$prefix/bin/astrai-jit
fi

step 4 "warming the kernel cache (a few seconds a variant)"
"$cli" warm

step 5 "paged_decode demo against a CPU reference (needs a GPU)"
status=0
"$build/examples/astrai-demo" || status=$?
if [ $status -eq 77 ]; then
  echo "bootstrap: no GPU here, demo skipped (the cache above was warmed for sm_90a)"
  status=0
fi
[ $status -eq 0 ] || exit $status

echo "bootstrap: done in $((SECONDS - began)) s. Left behind: the build tree $build" \
  "($(du -sh "$build" | cut -f1)), the kernel cache (astrai-jit cache stats), and $cli."
case ":$PATH:" in
  *":$(dirname "$cli"):"*) echo "bootstrap: try: astrai-jit --version; astrai-jit info" ;;
  *) echo "bootstrap: $(dirname "$cli") is not on your PATH: add it with" \
       "export PATH=\"$(dirname "$cli"):\$PATH\" (or run $cli)" ;;
esac
