#!/usr/bin/env bash
# Proves a separate CMake project can use astrai::jit through find_package (after install, and
# from the build tree) and through add_subdirectory. Usage: run_consumer_test.sh SOURCE_DIR WORK_DIR CMAKE BUILD_DIR
set -euo pipefail
source_dir=$1
work=$2
cmake=${3:-cmake}
build_dir=$4
rm -rf "$work"
mkdir -p "$work"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

echo "== install the library from $build_dir"
"$cmake" --install "$build_dir" --prefix "$work/prefix" >/dev/null

echo "== find_package consumer"
"$cmake" -S "$source_dir/tests/consumer" -B "$work/find" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
"$cmake" --build "$work/find" >/dev/null
"$work/find/consumer"

echo "== build-tree consumer (find_package from $build_dir, no install)"
"$cmake" -S "$source_dir/tests/consumer" -B "$work/tree" "${generator[@]}" \
  -Dastrai_jit_DIR="$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
"$cmake" --build "$work/tree" >/dev/null
"$work/tree/consumer"

# This one compiles the library again, from source: unoptimized (-O0, no debug info), since it
# checks the CMake usage requirements and the exported symbols, not speed (about half the
# compile time of -O3).
echo "== add_subdirectory consumer (shared library: only the exported API is visible)"
"$cmake" -S "$source_dir/tests/consumer" -B "$work/sub" "${generator[@]}" \
  -DUSE_SUBDIRECTORY=ON -DASTRAI_SOURCE_DIR="$source_dir" -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DBUILD_SHARED_LIBS=ON >/dev/null
"$cmake" --build "$work/sub" >/dev/null
"$work/sub/consumer"
echo "consumer test passed"
