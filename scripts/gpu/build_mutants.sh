#!/usr/bin/env bash
# Builds one GPU test binary per deliberately broken kernel (tests/mutants/*.patch), for
# scripts/gpu/run_mutants.sh to show that the GPU suite fails on each. The patches apply to a copy
# of the tree (the checkout is never touched); one build directory serves them all, so that only
# the embedded kernel sources are compiled again between mutants.
#
#   scripts/gpu/build_mutants.sh OUT_DIR     astrai_gpu_tests.NAME and NAME.patch for every mutant
#   scripts/gpu/build_mutants.sh --check     only checks that every patch still applies (CI)
#
# Extra CMake options (a compiler launcher, say) come from ASTRAI_MUTANT_CMAKE_ARGS.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/gpu/build_mutants.sh OUT_DIR | --check}
patches=("$root"/tests/mutants/*.patch)
[ -e "${patches[0]}" ] || { echo "build_mutants: no patches under tests/mutants" >&2; exit 1; }

if [ "$out" = --check ]; then
  for patch in "${patches[@]}"; do
    grep -q '^# caught-by: .' "$patch" || { echo "build_mutants: $patch names no caught-by filter" >&2; exit 1; }
    patch -d "$root" -p1 --dry-run --silent < "$patch" > /dev/null ||
      { echo "build_mutants: $(basename "$patch") no longer applies to kernel_src" >&2; exit 1; }
  done
  echo "build_mutants: ${#patches[@]} mutants apply"
  exit 0
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The tree as committed plus what is staged or changed, without build directories.
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$work" --one-top-level=src
read -r -a extra <<< "${ASTRAI_MUTANT_CMAKE_ARGS:-}"
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${extra[@]}" > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
for patch in "${patches[@]}"; do
  name=$(basename "$patch" .patch)
  patch -d "$work/src" -p1 --silent < "$patch"
  cmake --build "$work/build" --target astrai_gpu_tests > "$work/build-$name.log" 2>&1 ||
    { tail -n 30 "$work/build-$name.log"; exit 1; }
  cp "$work/build/tests/astrai_gpu_tests" "$out/astrai_gpu_tests.$name"
  cp "$patch" "$out/$name.patch"
  patch -d "$work/src" -p1 -R --silent < "$patch"
  echo "build_mutants: $name"
done
