#!/usr/bin/env bash
# scripts/gpu/pack_build.sh: the packed binaries load the packed libraries (through their own
# search path, with no LD_LIBRARY_PATH), and the packed CLI runs.
# Usage: test_pack_build.sh PACK_BUILD_SH BUILD_DIR
set -euo pipefail
pack=$1 build=$2
dest=$(realpath "$(mktemp -d)")
trap 'rm -rf "$dest"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$pack" "$build" "$dest/p"
for b in tests/astrai_gpu_tests bench/astrai-bench bench/astrai-sm90-check tools/astrai-jit; do
  [ -x "$dest/p/$b" ] || fail "$b not packed"
  rpath=$(readelf -d "$dest/p/$b" | grep -E '\((RPATH|RUNPATH)\)' || true)
  [[ $rpath == *'(RPATH)'*'[$ORIGIN/../lib'* ]] || fail "$b: search path is '$rpath', not \$ORIGIN/../lib first"
  # hiredis, libsodium and libcurl are not in a GPU machine's image: each must come from the pack.
  for lib in libhiredis libsodium libcurl; do
    where=$(env -u LD_LIBRARY_PATH ldd "$dest/p/$b" | awk -v l="$lib" 'index($1, l) == 1 {print $3}')
    [ -z "$where" ] || where=$(realpath "$where")
    [[ $where == "$dest/p/lib/"* ]] || fail "$b loads $lib from '$where', not from the pack"
  done
  env -u LD_LIBRARY_PATH ldd "$dest/p/$b" | grep -q "not found" && fail "$b has unresolved libraries"
done
# A library that libcurl loads (not the binary itself) resolves from the pack too: DT_RPATH.
where=$(env -u LD_LIBRARY_PATH ldd "$dest/p/tools/astrai-jit" | awk 'index($1, "libnghttp2") == 1 {print $3}')
[ -z "$where" ] || where=$(realpath "$where")
[ -z "$where" ] || [[ $where == "$dest/p/lib/"* ]] || fail "libcurl's libnghttp2 loads from '$where'"
env -u LD_LIBRARY_PATH "$dest/p/tools/astrai-jit" --version > /dev/null || fail "the packed CLI does not run"
# A missing binary is refused by name.
mkdir -p "$dest/empty"
out=$("$pack" "$dest/empty" "$dest/q" 2>&1) && fail "an empty build tree was packed"
[[ $out == *"tests/astrai_gpu_tests is not built"* ]] || fail "unclear refusal: $out"
echo "pack_build: ok"
