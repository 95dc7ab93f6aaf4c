#!/usr/bin/env bash
# What a newcomer meets first: the version, help that fits a screen, one error prefix, counts
# spelled right, progress, and the traps of `warm` and of the cache verbs (issue 50).
#
#   ASTRAI_CLI_BIN=build/tools/astrai-jit ASTRAI_SOURCE_DIR=. bash tests/cli/test_first_use.sh
#
# ASTRAI_CMAKE and ASTRAI_BUILD_DIR (optional) also check the installed tool: `cmake --install
# --component cli`, as scripts/ci/bootstrap.sh does. Needs no GPU; compiles two small variants.
set -euo pipefail

# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

SOURCE=${ASTRAI_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
ROTARY=rotary_emb.bf16.hd64.sm_89

expect_no_err() {
  if grep -qE -- "$1" "$ERR"; then fail "stderr unexpectedly matches /$1/"; fi
}

# --------------------------------------------------------------------------------------------
check "--version names the version of CMakeLists.txt and pyproject.toml, and NVRTC's"
cmake_version=$(sed -nE 's/^project\(astrai_jit VERSION ([0-9.]+).*/\1/p' "$SOURCE/CMakeLists.txt")
py_version=$(sed -nE 's/^version = "([^"]+)"/\1/p' "$SOURCE/pyproject.toml")
[[ -n "$cmake_version" && "$cmake_version" == "$py_version" ]] ||
  fail "CMakeLists.txt says '$cmake_version', pyproject.toml '$py_version'"
run --version
expect_rc 0
expect_out "^astrai-jit ${cmake_version//./\\.} \(NVRTC [0-9]+\.[0-9]+\)$"

check "info starts with the version"
run info
expect_rc 0
[[ "$(head -n 1 "$OUT")" == "astrai-jit: $cmake_version" ]] || fail "info's first line is not the version"

# --------------------------------------------------------------------------------------------
check "every help fits a screen: at most 30 lines of at most 100 columns"
for verb in "" warm cache "cache list" "cache stats" "cache verify" "cache prune" "cache clear" \
            "cache export" "cache import" info; do
  # shellcheck disable=SC2086
  run $verb --help
  expect_rc 0
  lines=$(wc -l <"$OUT")
  width=$(awk '{ if (length > m) m = length } END { print m + 0 }' "$OUT")
  [[ "$lines" -le 30 ]] || fail "'astrai-jit $verb --help' has $lines lines (at most 30)"
  [[ "$width" -le 100 ]] || fail "'astrai-jit $verb --help' has a line of $width columns (at most 100)"
done

check "warm --help shows the defaults of the shape lists and no CLI11 Excludes line"
run warm --help
expect_out '^  --head-dims LIST +Head dims \[default: 64,128\]$'
expect_out '^  --group-sizes LIST +.*\[default: hd64 6, hd128 4; 4,6 with --head-dims\]$'
expect_out '^  --page-sizes LIST +.*\[default: 1,16\]$'
expect_out '^  -j,--jobs N +.*\[default: [0-9]+'
expect_no_out 'Excludes'
expect_no_out ' \.\.\.'

check "the exit-code rules are in the tool's help, not repeated in full under every verb"
run --help
expect_out 'refused entries'
for verb in warm "cache verify" info; do
  # shellcheck disable=SC2086
  run $verb --help
  expect_no_out 'refused entries'
  expect_out '^Exit codes: 0 success'
done

# --------------------------------------------------------------------------------------------
check "every usage error has the one prefix and points at the verb's help"
for args in "warm --bogus" "warm --jobs 0" "cache" "cache prune --max-size" "cache export" \
            "info extra" "warm --hopper --no-hopper --arch sm_90a" ""; do
  # shellcheck disable=SC2086
  run $args
  expect_rc 2
  [[ -s "$ERR" ]] || fail "'astrai-jit $args' said nothing on stderr"
  if grep -vq '^astrai-jit: error: ' "$ERR"; then fail "'astrai-jit $args': a line without the prefix"; fi
done
run warm --bogus
expect_err "^astrai-jit: error: .*--bogus \(run 'astrai-jit warm --help'\)$"
run cache export
expect_err "\(run 'astrai-jit cache export --help'\)$"

# --------------------------------------------------------------------------------------------
check "warm --arch sm_90 warns that a Hopper GPU loads sm_90a variants, and still warms sm_90"
run warm --arch sm_90 --kernels rotary_emb --head-dims 64 --dry-run
expect_rc 0
expect_err '^astrai-jit: warning: --arch sm_90: a Hopper GPU loads sm_90a variants.*use --arch sm_90a$'
expect_out '^rotary_emb\.bf16\.hd64\.sm_90$'
run warm --arch sm_90a --kernels rotary_emb --head-dims 64 --dry-run
expect_no_err 'warning'

check "warm --arch sm_90 --hopper warms the sm_90a Hopper variants, saying so"
run warm --arch sm_90 --hopper --kernels paged_decode --head-dims 128 --group-sizes 4 --page-sizes 16 --dry-run
expect_rc 0
expect_err '^astrai-jit: note: --arch sm_90 with --hopper: warming sm_90a'
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.tma\.sm_90a$'
expect_count '^paged_decode\.' 1

check "warm --manifest with only --hopper, --no-hopper, --no-mma or --prefill-tiles is an error naming the flag"
printf 'paged_decode.bf16.hd128.ps16.g4.sm_90a\n' >"$WORK/one.manifest"
for flag in --hopper --no-hopper --no-mma "--prefill-tiles wide"; do
  # shellcheck disable=SC2086
  run warm --manifest "$WORK/one.manifest" $flag --dry-run
  expect_rc 2
  expect_err "^astrai-jit: error: ${flag%% *} would not change what --manifest warms"
done
run warm --manifest "$WORK/one.manifest" --dry-run
expect_rc 0

check "warm --hopper on a target without Hopper variants is an error naming it"
for arch in sm_89 sm_89,sm_90a compute_90a; do
  run warm --arch "$arch" --hopper --dry-run
  expect_rc 2
  expect_err "^astrai-jit: error: --hopper: .*(sm_89|compute_90a).* no Hopper variants \(they exist for sm_90a only\)"
  expect_no_out '^(paged_decode|rotary_emb)\.'
done
set +e
ASTRAI_JIT_NO_WGMMA=1 "$BIN" warm --arch sm_90a --hopper --dry-run >"$OUT" 2>"$ERR"
RC=$?
set -e
expect_rc 2
expect_err 'ASTRAI_JIT_NO_WGMMA'
run warm --arch sm_90a --hopper --kernels paged_decode --head-dims 128 --group-sizes 4 --page-sizes 16 --dry-run
expect_rc 0
expect_count '^paged_decode\.' 1
expect_out '\.tma\.sm_90a$'

check "warm --dry-run creates no directory and writes no record"
set +e
ASTRAI_JIT_RECORD="$WORK/record.txt" "$BIN" warm --dry-run --arch sm_89 \
    --cache-dir "$WORK/fresh/cache" >"$OUT" 2>"$ERR"
RC=$?
set -e
expect_rc 0
expect_out '^warm: 6 variants, 0 already cached \(dry run, nothing compiled\)$'
[[ ! -e "$WORK/fresh" ]] || fail "warm --dry-run created $WORK/fresh"
[[ ! -e "$WORK/record.txt" ]] || fail "warm --dry-run wrote the ASTRAI_JIT_RECORD file"

# --------------------------------------------------------------------------------------------
check "warm says where it compiles before the first compile ends, and counts in the singular"
run warm --arch sm_89 --kernels rotary_emb --head-dims 64 --jobs 4
expect_rc 0
[[ "$(head -n 1 "$OUT")" == "warm: 1 variant into $ASTRAI_JIT_CACHE_DIR, 1 job" ]] ||
  fail "the first line is not the progress line"
expect_out "^\[1/1\] ${ROTARY//./\\.} [0-9]+\.[0-9]+ s$"
expect_out '^warm: 1 variant, 1 compiled \([1-9][0-9]* bytes\), 0 already cached, 0 failed, [0-9.]+ s wall$'

check "a warm that finds everything cached reports no byte count"
run warm --arch sm_89 --kernels rotary_emb --head-dims 64
expect_rc 0
expect_out '^warm: 1 variant, 0 compiled, 1 already cached, 0 failed, [0-9.]+ s wall$'
expect_no_out 'bytes'
run warm --arch sm_89 --kernels rotary_emb --head-dims 64 --dry-run
expect_out '^warm: 1 variant, 1 already cached'

check "the cache verbs count one entry in the singular"
run cache list
expect_out '^total: 1 entry, '
run cache verify
expect_out '^verify: 1 entry checked, 0 damaged$'
run cache export -o "$WORK/one.astrai"
expect_out '^export: 1 entry, '
run cache import "$WORK/one.astrai" --cache-dir "$WORK/other"
expect_out '^import: 1 entry, '
run cache prune --max-size 1G
expect_out '; 1 entry, [0-9]+ bytes remain'
run cache clear --cache-dir "$WORK/other"
expect_out '^clear: removed 1 entry from '

# --------------------------------------------------------------------------------------------
check "a missing cache directory: info says it is not created yet; list and stats show it empty"
run info --cache-dir "$WORK/absent"
expect_rc 0
expect_out '^  state: not created yet'
for verb in list stats; do
  run cache "$verb" --cache-dir "$WORK/absent"
  expect_rc 0
  expect_err "^astrai-jit: note: cache $verb: no cache at $WORK/absent yet"
done
[[ ! -e "$WORK/absent" ]] || fail "info or a cache verb created the directory"

check "a path that is not a usable cache exits 2 for every cache verb, list and stats included"
echo "not a directory" >"$WORK/a-file"
for verb in list stats verify clear "prune --max-size 0" "export -o $WORK/x.astrai"; do
  # shellcheck disable=SC2086
  run cache $verb --cache-dir "$WORK/a-file"
  expect_rc 2
  expect_err "^astrai-jit: error: cache ${verb%% *}: $WORK/a-file is not a usable cache"
done
run info --cache-dir "$WORK/a-file"
expect_rc 0
expect_out '^  state: not usable'
[[ "$(cat "$WORK/a-file")" == "not a directory" ]] || fail "a cache verb changed the file"

# --------------------------------------------------------------------------------------------
if [[ -n "${ASTRAI_CMAKE:-}" && -n "${ASTRAI_BUILD_DIR:-}" ]]; then
  check "the installed tool (component cli, as scripts/ci/bootstrap.sh installs it) runs alone"
  "$ASTRAI_CMAKE" --install "$ASTRAI_BUILD_DIR" --component cli --prefix "$WORK/prefix" >"$OUT" 2>"$ERR" ||
    fail "cmake --install --component cli failed"
  [[ "$(find "$WORK/prefix" -type f | wc -l)" -eq 1 ]] || fail "component cli installs more than the tool"
  BIN="$WORK/prefix/bin/astrai-jit"
  run --version
  expect_rc 0
  expect_out "^astrai-jit ${cmake_version//./\\.} "
fi

echo "PASS: all first-use checks ($((SECONDS - START)) s)"
