#!/usr/bin/env bash
# End-to-end checks of the astrai-jit command-line tool.
#
#   ASTRAI_CLI_BIN=build/tools/astrai-jit bash tests/cli/test_cli.sh
#
# Runs without a GPU or driver. Uses a fresh cache directory and compiles only a few small
# variants (a couple of seconds of NVRTC time). Stops at the first failed check.
set -euo pipefail

# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

PAGED=paged_decode.bf16.hd128.ps16.g4.sm_89
ROTARY=rotary_emb.bf16.hd64.sm_89

# --------------------------------------------------------------------------------------------
check "--help of the tool exits 0 and names the verbs and exit codes"
run --help
expect_rc 0
for word in warm cache info "Exit codes"; do expect_out "$word"; done

check "warm --help names every warm flag"
run warm --help
expect_rc 0
for flag in --arch --kernels --dtypes --head-dims --page-sizes --group-sizes --manifest --jobs \
            --no-mma --dry-run --cache-dir; do
  expect_out "$flag"
done

check "cache --help names the cache verbs"
run cache --help
expect_rc 0
for verb in list stats verify prune clear; do expect_out "$verb"; done

for verb in list stats verify prune clear; do
  check "cache $verb --help exits 0 and names --cache-dir"
  run cache "$verb" --help
  expect_rc 0
  expect_out --cache-dir
done
check "cache verify --help names --no-repair; cache prune --help names --max-size"
run cache verify --help
expect_out --no-repair
run cache prune --help
expect_out --max-size

check "info --help exits 0"
run info --help
expect_rc 0
expect_out "info"

# --------------------------------------------------------------------------------------------
check "warm --dry-run with no shape selection lists the documented 6 default variants"
run warm --arch sm_80 --dry-run
expect_rc 0
expect_out "^warm: 6 variants"
for name in paged_decode.bf16.hd64.ps1.g6.sm_80 paged_decode.bf16.hd64.ps16.g6.sm_80 \
            paged_decode.bf16.hd128.ps1.g4.sm_80 paged_decode.bf16.hd128.ps16.g4.sm_80 \
            rotary_emb.bf16.hd64.sm_80 rotary_emb.bf16.hd128.sm_80; do
  expect_out "^${name//./\\.}( |$)"
done
expect_count '^(paged_decode|rotary_emb)\.' 6
[[ ! -d "$ASTRAI_JIT_CACHE_DIR/v1" ]] || [[ -z "$(find "$ASTRAI_JIT_CACHE_DIR/v1" -name '*.cubin')" ]] \
  || fail "--dry-run wrote cache entries"

check "warm --dry-run takes the cross product of given lists and dedupes"
run warm --dry-run --arch sm_89 --kernels paged_decode,rotary_emb --head-dims 64,128,64 \
    --group-sizes 4 --page-sizes 1,16
expect_rc 0
expect_out "^warm: 6 variants"   # paged: 2 head dims x 1 group x 2 page sizes; rotary: 2
expect_count '^paged_decode\.' 4
expect_count '^rotary_emb\.' 2

check "warm --dry-run on sm_90a pairs each variant the Hopper kernels serve with its .wgmma or .tma variant"
run warm --dry-run --arch sm_90a --kernels prefill,paged_prefill --head-dims 96,128 --group-sizes 4 \
    --page-sizes 1,16
expect_rc 0
expect_out "^warm: 10 variants"   # prefill 2 + 2 wgmma (hd128, both tilings); paged 4 + 2 (hd128, ps16)
expect_out '^prefill\.bf16\.hd128\.g4\.wgmma\.sm_90a( |$)'
expect_out '^prefill\.bf16\.hd128\.g4\.wgmma\.wide\.sm_90a( |$)'
expect_out '^paged_prefill\.bf16\.hd128\.ps16\.g4\.wgmma\.sm_90a( |$)'
expect_out '^paged_prefill\.bf16\.hd128\.ps16\.g4\.wgmma\.wide\.sm_90a( |$)'
expect_count '\.wgmma\.' 4
expect_count '\.wide\.' 2
for tiles in narrow wide; do
  run warm --dry-run --arch sm_90a --kernels prefill --head-dims 64,128 --group-sizes 4 --hopper --prefill-tiles $tiles
  expect_rc 0
  expect_out "^warm: 2 variants"   # hd64's one tiling, hd128's named one
  expect_count '\.wide\.' $([ $tiles = wide ] && echo 1 || echo 0)
done
ASTRAI_JIT_PREFILL_TILES=narrow run warm --dry-run --arch sm_90a --kernels prefill --head-dims 128 --group-sizes 4 --hopper
expect_rc 0
expect_count '\.wide\.' 0
run warm --dry-run --arch sm_90a --kernels prefill --head-dims 128 --group-sizes 4 --prefill-tiles 192
expect_rc 2
expect_err "--prefill-tiles.*192"
run warm --dry-run --arch sm_90a --kernels paged_decode,decode --head-dims 96,128 --group-sizes 4 --page-sizes 1,16
expect_rc 0
expect_out "^warm: 8 variants"   # paged 4 + 1 tma (hd128, ps16); decode 2 + 1 tma (hd128)
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.tma\.sm_90a( |$)'
expect_out '^decode\.bf16\.hd128\.g4\.tma\.sm_90a( |$)'
expect_count '\.tma\.' 2
run warm --dry-run --arch sm_90a --kernels paged_decode,prefill --head-dims 128 --group-sizes 4 --page-sizes 16 \
    --hopper
expect_rc 0
expect_out "^warm: 3 variants"   # tma, and wgmma in both tilings
expect_count '\.(tma|wgmma)\.' 3
for flag in --no-hopper --no-wgmma --no-mma; do
  run warm --dry-run --arch sm_90a --kernels prefill,paged_decode --head-dims 128 --group-sizes 4 --page-sizes 16 $flag
  expect_rc 0
  expect_count '\.(wgmma|tma)\.' 0
done

check "warm --features selects feature variants (prefill with its Hopper pair on sm_90a) and keeps rotary_emb plain"
run warm --dry-run --arch sm_90a --kernels paged_decode,rotary_emb,prefill --head-dims 128 --group-sizes 4 \
    --page-sizes 16 --features none,cap
expect_rc 0
expect_out "^warm: 11 variants"   # paged_decode 2 + 2 tma, rotary_emb 1, prefill 2 + 4 wgmma (two tilings)
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.cap\.sm_90a( |$)'
expect_out '^prefill\.bf16\.hd128\.g4\.cap\.sm_90a( |$)'
expect_out '^prefill\.bf16\.hd128\.g4\.cap\.wgmma\.sm_90a( |$)'
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.cap\.tma\.sm_90a( |$)'
expect_count '\.wgmma\.' 4
expect_count '\.cap\.' 5   # the wide tiling's .cap variant too
run warm --dry-run --arch sm_89 --kernels decode --head-dims 64 --group-sizes 6 --features cap --no-mma
expect_rc 0
expect_out '^decode\.bf16\.hd64\.g6\.cap\.nomma\.sm_89( |$)'

check "warm --features takes the FP8 KV cache for paged_decode, decode and paged_prefill only"
run warm --dry-run --arch sm_90a --kernels paged_decode,decode,paged_prefill --head-dims 128 --group-sizes 4 \
    --page-sizes 16 --features none,kv_e4m3,kv_e5m2+swa
expect_rc 0
expect_out "^warm: 19 variants"   # plain, kv_e4m3, kv_e5m2.swa per family, each with its Hopper pair; prefill's plain wide tiling
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.kv_e4m3\.sm_90a( |$)'
expect_out '^decode\.bf16\.hd128\.g4\.kv_e5m2\.swa\.sm_90a( |$)'
expect_out '^paged_prefill\.bf16\.hd128\.ps16\.g4\.kv_e4m3\.sm_90a( |$)'
expect_count '\.wgmma\.' 4   # both tilings of the plain variant, one of each FP8 variant
expect_out '^paged_prefill\.bf16\.hd128\.ps16\.g4\.kv_e4m3\.wgmma\.sm_90a( |$)'
expect_count '\.kv_e[45]m[23].*\.wide\.' 0
expect_count '\.tma\.' 6   # the decodes' FP8 caches too (head dim 128)
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.kv_e4m3\.tma\.sm_90a( |$)'
run warm --dry-run --arch sm_90a --kernels paged_decode --head-dims 64,192 --group-sizes 4 --page-sizes 16 --features kv_e4m3
expect_rc 0
expect_count '\.tma\.' 2   # head dim 64's rows of 64 bytes too, in both tilings; 192 keeps the direct path
expect_out '^paged_decode\.bf16\.hd64\.ps16\.g4\.kv_e4m3\.tma\.sm_90a( |$)'
expect_out '^paged_decode\.bf16\.hd64\.ps16\.g4\.kv_e4m3\.tma\.wide\.sm_90a( |$)'
run warm --dry-run --arch sm_90a --kernels prefill --head-dims 128 --group-sizes 4 --features kv_e4m3
expect_rc 2
expect_err "--features kv_e4m3: prefill does not support kv_e4m3 \(supported: swa, cap, sink, qkv_e4m3, p_fp16, alibi\)"
run warm --dry-run --arch sm_90a --kernels paged_decode --features kv_e4m3+kv_e5m2
expect_rc 2
expect_err "--features 'kv_e4m3\+kv_e5m2': the features kv_e4m3 and kv_e5m2 exclude each other"

check "warm --features refuses unknown or repeated features by name"
run warm --dry-run --arch sm_90a --features cap+cap
expect_rc 2
expect_err "--features 'cap\+cap' is not a feature set \(allowed: none, or distinct features joined by "\
"'\+': kv_e4m3, kv_e5m2, swa, cap, sink, qkv_e4m3, p_fp16, alibi"
run warm --dry-run --arch sm_90a --features softcap
expect_rc 2
expect_err "--features 'softcap' is not a feature set"

check "warm --features takes the multi-token q2..q8 for paged_decode only, at most one"
run warm --dry-run --arch sm_90a --kernels paged_decode,rotary_emb --head-dims 128 --group-sizes 4 \
    --page-sizes 16 --features none,q4,kv_e4m3+swa+q8
expect_rc 0
expect_out "^warm: 7 variants"   # three of paged_decode and their Hopper pairs, rotary_emb's plain one
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.q4\.sm_90a( |$)'
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.q4\.tma\.sm_90a( |$)'
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.kv_e4m3\.swa\.q8\.sm_90a( |$)'
run warm --dry-run --arch sm_90a --kernels decode --head-dims 128 --group-sizes 4 --features q2
expect_rc 2
expect_err "--features q2: decode does not support q2 \(supported: kv_e4m3, kv_e5m2, swa, cap, sink, alibi\)"
for bad in q9 q1 q0 q2+q4 q3+q3; do
  run warm --dry-run --arch sm_90a --features "$bad"
  expect_rc 2
  expect_err "--features '${bad//+/\\+}' is not a feature set \(allowed: none, or distinct features joined by '\+': .*, q2\.\.q8; at most one of q2\.\.q8\)"
done
run warm --arch sm_80 --kernels paged_decode --head-dims 64 --group-sizes 8 --page-sizes 1 --features swa+q4 --jobs 1 \
    --cache-dir "$WORK/multi-token-cache"
expect_rc 0
expect_out '^\[1/1\] paged_decode\.bf16\.hd64\.ps1\.g8\.swa\.q4\.sm_80 [0-9.]+ s$'

check "warm --dry-run accepts repeated flags, arch spellings and --no-mma"
run warm --dry-run --arch sm_80 --arch 8.9 --kernels rotary_emb --head-dims 64 --no-mma
expect_rc 0
expect_out "^warm: 2 variants"
expect_out '^rotary_emb\.bf16\.hd64\.nomma\.sm_80'
expect_out '^rotary_emb\.bf16\.hd64\.nomma\.sm_89'

check "warm --arch takes compute_ targets (PTX) and never pairs them with a Hopper variant"
run warm --dry-run --arch compute_80,COMPUTE_90a --kernels paged_decode,prefill --head-dims 128 --group-sizes 4 \
    --page-sizes 16
expect_rc 0
expect_out "^warm: 4 variants"
expect_out '^paged_decode\.bf16\.hd128\.ps16\.g4\.compute_80( |$)'
expect_out '^prefill\.bf16\.hd128\.g4\.compute_90a( |$)'
expect_count '\.wgmma\.' 0
set +e
ASTRAI_JIT_ARCH=compute_80 "$BIN" warm --dry-run --kernels rotary_emb --head-dims 64 >"$OUT" 2>"$ERR"
RC=$?
set -e
expect_rc 0
expect_out '^rotary_emb\.bf16\.hd64\.compute_80( |$)'
run warm --dry-run --arch compute_70
expect_rc 2
expect_err "--arch 'compute_70' is not supported \(allowed: sm_75 or newer, or compute_75 or newer"
run warm --dry-run --arch compute_8.0
expect_rc 2
expect_err "--arch 'compute_8\.0' is not a valid target \(allowed: auto, or sm_XY, XY or X\.Y .*compute_XY"

check "the strict-mode hint of every family warms exactly the missed variant"
# The commands KernelSpec::warm_command() prints (pinned per family in test_kernel_family.cpp).
while read -r variant flags; do
  run warm --dry-run $flags </dev/null
  expect_rc 0
  expect_out "^warm: 1 variant,"
  expect_out "^${variant//./\\.}( |$)"
done <<'HINTS'
paged_decode.fp16.hd64.ps16.g6.sm_90a --arch sm_90a --kernels paged_decode --dtypes fp16 --head-dims 64 --page-sizes 16 --group-sizes 6 --no-hopper
paged_decode.bf16.hd128.ps16.g4.tma.sm_90a --arch sm_90a --kernels paged_decode --dtypes bf16 --head-dims 128 --page-sizes 16 --group-sizes 4 --hopper
rotary_emb.fp16.hd64.sm_90a --arch sm_90a --kernels rotary_emb --dtypes fp16 --head-dims 64
merge_states.fp16.hd64.sm_90a --arch sm_90a --kernels merge_states --dtypes fp16 --head-dims 64
merge_states.bf16.hd1024.sm_80 --arch sm_80 --kernels merge_states --dtypes bf16 --head-dims 1024
decode.fp16.hd64.g6.sm_90a --arch sm_90a --kernels decode --dtypes fp16 --head-dims 64 --group-sizes 6 --no-hopper
prefill.fp16.hd64.g6.sm_90a --arch sm_90a --kernels prefill --dtypes fp16 --head-dims 64 --group-sizes 6 --no-hopper
paged_prefill.fp16.hd64.ps16.g6.sm_90a --arch sm_90a --kernels paged_prefill --dtypes fp16 --head-dims 64 --page-sizes 16 --group-sizes 6 --no-hopper
prefill.bf16.hd128.g4.wgmma.sm_90a --arch sm_90a --kernels prefill --dtypes bf16 --head-dims 128 --group-sizes 4 --hopper --prefill-tiles narrow
paged_prefill.bf16.hd128.ps16.g4.wgmma.wide.sm_90a --arch sm_90a --kernels paged_prefill --dtypes bf16 --head-dims 128 --page-sizes 16 --group-sizes 4 --hopper --prefill-tiles wide
paged_prefill.fp16.hd80.ps16.g6.sm_90a --arch sm_90a --kernels paged_prefill --dtypes fp16 --head-dims 80 --page-sizes 16 --group-sizes 6
paged_decode.bf16.hd128.ps1.g4.nomma.sm_90a --arch sm_90a --kernels paged_decode --dtypes bf16 --head-dims 128 --page-sizes 1 --group-sizes 4 --no-mma
prefill.bf16.hd128.g4.cap.sm_90a --arch sm_90a --kernels prefill --dtypes bf16 --head-dims 128 --group-sizes 4 --features cap --no-hopper
paged_decode.bf16.hd64.ps16.g6.cap.sink.sm_90a --arch sm_90a --kernels paged_decode --dtypes bf16 --head-dims 64 --page-sizes 16 --group-sizes 6 --features cap+sink --no-hopper
paged_prefill.fp16.hd128.ps16.g4.swa.sink.sm_90a --arch sm_90a --kernels paged_prefill --dtypes fp16 --head-dims 128 --page-sizes 16 --group-sizes 4 --features swa+sink --no-hopper
paged_prefill.bf16.hd128.ps16.g4.kv_e4m3.sm_90a --arch sm_90a --kernels paged_prefill --dtypes bf16 --head-dims 128 --page-sizes 16 --group-sizes 4 --features kv_e4m3 --no-hopper
paged_prefill.bf16.hd128.ps16.g4.kv_e4m3.wgmma.sm_90a --arch sm_90a --kernels paged_prefill --dtypes bf16 --head-dims 128 --page-sizes 16 --group-sizes 4 --features kv_e4m3 --hopper
decode.fp16.hd64.g6.kv_e5m2.cap.sm_89 --arch sm_89 --kernels decode --dtypes fp16 --head-dims 64 --group-sizes 6 --features kv_e5m2+cap
HINTS

check "warm --dry-run --arch auto (the default) resolves to a target"
run warm --dry-run --kernels rotary_emb --head-dims 64
expect_rc 0
expect_out '^rotary_emb\.bf16\.hd64\.(sm|compute)_[0-9]+a?'

# --------------------------------------------------------------------------------------------
check "warm of one paged_decode variant fills an empty cache (and ASTRAI_JIT_RECORD records it)"
set +e
ASTRAI_JIT_RECORD="$WORK/recorded.txt" "$BIN" warm --arch sm_89 --kernels paged_decode \
    --head-dims 128 --group-sizes 4 --page-sizes 16 --jobs 2 >"$OUT" 2>"$ERR"
RC=$?
set -e
expect_rc 0
expect_out "^\[1/1\] ${PAGED//./\\.} [0-9]+\.[0-9]+ s$"
expect_out "^warm: 1 variant, 1 compiled \([1-9][0-9]* bytes\), 0 already cached, 0 failed, [0-9.]+ s wall$"
grep -qx "$PAGED" "$WORK/recorded.txt" || fail "ASTRAI_JIT_RECORD file does not list $PAGED"

check "a second warm of the same variant compiles nothing"
run warm --arch sm_89 --kernels paged_decode --head-dims 128 --group-sizes 4 --page-sizes 16 \
    --jobs 2
expect_rc 0
expect_out "^\[1/1\] ${PAGED//./\\.} cached$"
expect_out "^warm: 1 variant, 0 compiled, 1 already cached, 0 failed, [0-9.]+ s wall$"

check "warm --dry-run marks the cached variant"
run warm --dry-run --arch sm_89 --kernels paged_decode --head-dims 128 --group-sizes 4 \
    --page-sizes 16
expect_rc 0
expect_out "^${PAGED//./\\.} cached$"

# --------------------------------------------------------------------------------------------
check "warm --manifest warms exactly the listed variants"
{
  echo "# variants recorded by ASTRAI_JIT_RECORD, plus one more"
  cat "$WORK/recorded.txt"
  echo ""
  echo "$ROTARY   # trailing comment"
} >"$WORK/manifest.txt"
run warm --manifest "$WORK/manifest.txt" --jobs 2
expect_rc 0
expect_out "^warm: 2 variants, 1 compiled \([1-9][0-9]* bytes\), 1 already cached, 0 failed, "
expect_count '^\[[0-9]+/2\] ' 2
expect_out "^\[[12]/2\] ${ROTARY//./\\.} [0-9]+\.[0-9]+ s$"
expect_out "^\[[12]/2\] ${PAGED//./\\.} cached$"

check "a malformed manifest line exits 2 naming file:line"
printf '%s\n# fine so far\npaged_decode.bf16.hd128.sm_89\n' "$ROTARY" >"$WORK/bad_manifest.txt"
run warm --manifest "$WORK/bad_manifest.txt"
expect_rc 2
expect_err "bad_manifest\.txt:3: "
expect_no_out '^\['

# --------------------------------------------------------------------------------------------
check "cache list shows both entries and a total"
run cache list
expect_rc 0
expect_count '[0-9a-f]{32}  (paged_decode|rotary_emb)\.' 2
expect_out "[0-9a-f]{32}  ${PAGED//./\\.}$"
expect_out "[0-9a-f]{32}  ${ROTARY//./\\.}$"
expect_out '[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z'
expect_out '^total: 2 entries'

check "cache stats counts them"
run cache stats
expect_rc 0
expect_out "^directory: ${ASTRAI_JIT_CACHE_DIR}$"
expect_out '^mode: rw$'
expect_out '^entries: 2$'
expect_out '^total bytes: [1-9][0-9]* '
expect_out '^cap: unlimited$'

check "cache verify passes on an intact cache"
run cache verify
expect_rc 0
expect_out '2 entries checked, 0 damaged'

# Keep a copy for the --cache-dir and clear checks below.
cp -a "$ASTRAI_JIT_CACHE_DIR" "$WORK/copy"

check "cache verify --no-repair reports a damaged entry and keeps it"
entry=$(find "$ASTRAI_JIT_CACHE_DIR/v1" -name "*.${PAGED}.cubin" -type f)
[[ -n "$entry" && -f "$entry" ]] || fail "no cache entry file for $PAGED"
size=$(wc -c <"$entry")
printf '\xde\xad\xbe\xef\xde\xad\xbe\xef' | dd of="$entry" bs=1 seek=$((size / 2)) conv=notrunc status=none
run cache verify --no-repair
expect_rc 1
expect_out "damaged: [0-9a-f]{32} ${PAGED//./\\.}"
[[ -f "$entry" ]] || fail "--no-repair removed the damaged entry"

check "cache verify exits 1 on the damaged entry and removes it"
run cache verify
expect_rc 1
expect_out "damaged: [0-9a-f]{32} ${PAGED//./\\.} \(.*\): checksum mismatch - removed$"
expect_out '2 entries checked, 1 damaged'
[[ ! -e "$entry" ]] || fail "verify did not remove the damaged entry $entry"

check "the next cache verify passes"
run cache verify
expect_rc 0
expect_out '1 entry checked, 0 damaged'

check "cache export writes the sound entries; import into an empty cache serves them"
run cache export -o "$WORK/kernels.astrai"
expect_rc 0
expect_out "^export: 1 entry, .* to $WORK/kernels\.astrai$"
run cache import "$WORK/kernels.astrai" --cache-dir "$WORK/imported"
expect_rc 0
expect_out "^import: 1 entry, .* into $WORK/imported$"
[[ "$(stat -c %a "$WORK/imported")" == 700 ]] || fail "the imported cache is not private (0700)"
echo "$ROTARY" >"$WORK/rotary_manifest.txt"
run warm --manifest "$WORK/rotary_manifest.txt" --cache-dir "$WORK/imported"
expect_rc 0
expect_out "^warm: 1 variant, 0 compiled, 1 already cached, 0 failed, "

check "a read-only layer (ASTRAI_JIT_CACHE_PATH) serves warm and is never written"
before=$(find "$WORK/imported" | sort | xargs ls -ld --time-style=+%s.%N)
set +e
ASTRAI_JIT_CACHE_PATH="$WORK/imported" "$BIN" warm --manifest "$WORK/rotary_manifest.txt" \
    --cache-dir "$WORK/layered" >"$OUT" 2>"$ERR"
RC=$?
set -e
expect_rc 0
expect_out "^warm: 1 variant, 0 compiled, 1 already cached, 0 failed, "
[[ "$(find "$WORK/imported" | sort | xargs ls -ld --time-style=+%s.%N)" == "$before" ]] \
  || fail "the read-only layer changed"
set +e
ASTRAI_JIT_CACHE_PATH="$WORK/imported" "$BIN" info >"$OUT" 2>"$ERR"
RC=$?
set -e
expect_rc 0
expect_out "^  read-only layer: $WORK/imported$"
expect_out '^  trust: owner only$'

check "cache export --manifest names the variants it could not find and exits 1"
printf '%s\n%s\n' "$ROTARY" "$PAGED" >"$WORK/both_manifest.txt"
run cache export --manifest "$WORK/both_manifest.txt" -o "$WORK/partial.astrai"
expect_rc 1
expect_out "^export: 1 entry,"
expect_err "not in the cache: ${PAGED//./\\.}"

check "cache import of a file that is not an archive exits 1; of a directory exits 2"
echo "hello" >"$WORK/not-an-archive"
run cache import "$WORK/not-an-archive" --cache-dir "$WORK/imported"
expect_rc 1
expect_err "not a sound archive: "
run cache import "$WORK" --cache-dir "$WORK/imported"
expect_rc 2
expect_err "is not a regular file"

check "cache clear of a cache whose v1 is a symbolic link exits 2 and deletes nothing"
mkdir -p "$WORK/linked"
ln -s "$WORK/imported/v1" "$WORK/linked/v1"
chmod 700 "$WORK/linked"
before=$(find "$WORK/imported" -type f | sort | xargs sha1sum)
for verb in clear verify "prune --max-size 0"; do
  # shellcheck disable=SC2086
  run cache $verb --cache-dir "$WORK/linked"
  expect_rc 2
  expect_err "symbolic link"
done
[[ "$(find "$WORK/imported" -type f | sort | xargs sha1sum)" == "$before" ]] \
  || fail "maintenance followed the symbolic link"

check "a trailing /. or /.. after a linked cache root does not get the link followed"
ln -s "$WORK/imported" "$WORK/root-link"
mkdir -p "$WORK/imported/sub"
before=$(find "$WORK/imported" -type f | sort | xargs sha1sum)
for dir in "$WORK/root-link/." "$WORK/root-link/sub/.."; do
  for verb in clear verify "prune --max-size 0"; do
    # shellcheck disable=SC2086
    run cache $verb --cache-dir "$dir"
    expect_rc 2
    expect_err "symbolic link"
  done
  set +e
  ASTRAI_JIT_CACHE_DIR="$dir" "$BIN" cache clear >"$OUT" 2>"$ERR"
  RC=$?
  set -e
  expect_rc 2
  expect_err "root-link: a symbolic link"
done
[[ "$(find "$WORK/imported" -type f | sort | xargs sha1sum)" == "$before" ]] \
  || fail "a maintenance verb followed the linked root"
rmdir "$WORK/imported/sub"
rm "$WORK/root-link"

check "cache export writes a private archive; an archive damaged after its entries imports nothing"
[[ "$(stat -c %a "$WORK/kernels.astrai")" == 600 ]] || fail "the exported archive is not 0600"
head -c -16 "$WORK/kernels.astrai" >"$WORK/damaged.astrai"
echo "garbage instead of the end marker" >>"$WORK/damaged.astrai"
run cache import "$WORK/damaged.astrai" --cache-dir "$WORK/import-damaged"
expect_rc 1
expect_err "missing or wrong end marker; nothing imported"
[[ -z "$(find "$WORK/import-damaged" -type f)" ]] || fail "a damaged archive left files behind"

check "every cache verb takes a missing directory as an empty cache: exit 0, a note, nothing created"
for verb in list stats verify clear "prune --max-size 0" "export -o $WORK/empty.astrai"; do
  # shellcheck disable=SC2086
  run cache $verb --cache-dir "$WORK/no-such-cache"
  expect_rc 0
  expect_err "^astrai-jit: note: cache ${verb%% *}: no cache at $WORK/no-such-cache yet"
done
[[ ! -e "$WORK/no-such-cache" ]] || fail "a cache verb created the cache directory"

check "a cache writable by others is refused: verify exits 2"
cp -a "$WORK/imported" "$WORK/open"
chmod 777 "$WORK/open"
run cache verify --cache-dir "$WORK/open"
expect_rc 2
expect_err "writable by others"

check "a manifest that is a directory, or has an overlong line, exits 2 with the text cut short"
run warm --manifest "$WORK"
expect_rc 2
expect_err "is not a regular file"
head -c 5000 /dev/zero | tr '\0' 'A' >"$WORK/long_manifest.txt"
run warm --manifest "$WORK/long_manifest.txt"
expect_rc 2
expect_err "long_manifest\.txt:1: line longer than 1024 characters"
[[ $(wc -c <"$ERR") -lt 600 ]] || fail "the overlong line was echoed in full"

check "ASTRAI_JIT_ARCH is validated like --arch"
set +e
ASTRAI_JIT_ARCH=sm_70 "$BIN" warm --dry-run >"$OUT" 2>"$ERR"
RC=$?
set -e
expect_rc 2
expect_err 'ASTRAI_JIT_ARCH=sm_70 is not supported'

check "cache prune without a size (no --max-size, no ASTRAI_JIT_MAX_CACHE_SIZE) exits 2"
run cache prune
expect_rc 2
expect_err 'max-size|ASTRAI_JIT_MAX_CACHE_SIZE'

check "cache prune --max-size bogus exits 2"
run cache prune --max-size 12 parsecs
expect_rc 2
run cache prune --max-size 12parsecs
expect_rc 2
expect_err '12parsecs'

check "cache prune --max-size 1 empties the cache"
run cache prune --max-size 1
expect_rc 0
expect_out '^prune: freed [1-9][0-9]* bytes'
run cache stats
expect_out '^entries: 0$'

check "cache stats --cache-dir reads another directory"
run cache stats --cache-dir "$WORK/copy"
expect_rc 0
expect_out "^directory: $WORK/copy$"
expect_out '^entries: 2$'

check "cache clear --cache-dir removes everything there"
run cache clear --cache-dir "$WORK/copy"
expect_rc 0
expect_out '^clear: removed 2 entries'
run cache list --cache-dir "$WORK/copy"
expect_rc 0
expect_out '^total: 0 entries'
[[ -z "$(find "$WORK/copy" -type f)" ]] || fail "cache clear left files behind"

# --------------------------------------------------------------------------------------------
check "warm --arch sm_xx exits 2 naming the value"
run warm --arch sm_xx
expect_rc 2
expect_err 'sm_xx'

check "warm --head-dims 72 for paged_decode exits 2 naming 72"
run warm --head-dims 72 --arch sm_89 --kernels paged_decode
expect_rc 2
expect_err '72'
expect_no_out '^\['

check "warm --kernels bogus and --jobs 0 exit 2"
run warm --kernels bogus --arch sm_89
expect_rc 2
expect_err 'bogus'
run warm --jobs 0 --arch sm_89
expect_rc 2

check "an unknown verb exits 2"
run frobnicate
expect_rc 2
expect_err 'frobnicate'
run cache frobnicate
expect_rc 2
expect_err 'frobnicate'

check "an unknown flag exits 2"
run warm --no-such-flag
expect_rc 2

check "keygen writes an owner-only secret and a public key, and never overwrites them"
run keygen --out "$WORK/release"
expect_rc 0
expect_out '^keygen: key [0-9a-f]{16} written'
expect_out '^public key: ed25519:[0-9a-f]{16}:'
[[ "$(stat -c %a "$WORK/release.secret")" == 600 ]] || fail "the secret key is not 0600"
grep -qE '^ed25519:[0-9a-f]{16}:[A-Za-z0-9+/=]+$' "$WORK/release.pub" || fail "bad public key file"
run keygen --out "$WORK/release"
expect_rc 1
expect_err 'release\.secret'
run keygen --out "$WORK/stranger"
expect_rc 0

check "verify reports signature state; with trusted keys an unsigned entry fails it and warm recompiles it"
run cache import "$WORK/kernels.astrai" --cache-dir "$WORK/signed"
expect_rc 0
run cache verify --cache-dir "$WORK/signed"
expect_rc 0
expect_out '^signatures: 0 signed, 1 unsigned \(ASTRAI_JIT_TRUSTED_KEYS not set'
ASTRAI_JIT_TRUSTED_KEYS="$WORK/release.pub" run cache verify --cache-dir "$WORK/signed"
expect_rc 1
expect_out "^signature refused: .*$ROTARY.*: unsigned"
expect_out '^signatures: 0 signed, 1 unsigned, 1 refused by ASTRAI_JIT_TRUSTED_KEYS \(1 key\)'
ASTRAI_JIT_TRUSTED_KEYS="$WORK/release.pub" run warm --manifest "$WORK/rotary_manifest.txt" \
  --cache-dir "$WORK/signed"
expect_rc 0
expect_out '^warm: 1 variant, 1 compiled \([0-9]+ bytes\), 0 already cached'
expect_err 'not using kernel cache entry .*: unsigned'

check "cache sign signs every entry; then a process trusting the key loads it"
run cache sign --key "$WORK/release.secret" --cache-dir "$WORK/signed"
expect_rc 0
expect_out '^sign: 1 entry signed by [0-9a-f]{16} in '
ASTRAI_JIT_TRUSTED_KEYS="$WORK/release.pub" run cache verify --cache-dir "$WORK/signed"
expect_rc 0
expect_out '^signatures: 1 signed, 0 unsigned, 0 refused'
ASTRAI_JIT_TRUSTED_KEYS="$WORK/release.pub" run warm --manifest "$WORK/rotary_manifest.txt" \
  --cache-dir "$WORK/signed"
expect_rc 0
expect_out '^warm: 1 variant, 0 compiled, 1 already cached'
ASTRAI_JIT_TRUSTED_KEYS="$WORK/stranger.pub" run cache verify --cache-dir "$WORK/signed"
expect_rc 1
expect_out 'a key not in ASTRAI_JIT_TRUSTED_KEYS'

check "export --sign signs the archive's entries; an import with trusted keys refuses unsigned ones"
run cache export --sign "$WORK/release.secret" -o "$WORK/signed.astrai" --cache-dir "$WORK/imported"
expect_rc 0
expect_out '^export: 1 entry, .*, signed by [0-9a-f]{16}$'
ASTRAI_JIT_TRUSTED_KEYS="$WORK/release.pub" run cache verify --cache-dir "$WORK/imported"
expect_out '^signatures: 0 signed, 1 unsigned'   # the cache itself is not changed
ASTRAI_JIT_TRUSTED_KEYS="$(cat "$WORK/release.pub")" run cache import "$WORK/signed.astrai" \
  --cache-dir "$WORK/signed-import"
expect_rc 0
expect_out '^import: 1 entry'
ASTRAI_JIT_TRUSTED_KEYS="$(cat "$WORK/release.pub")" run cache import "$WORK/kernels.astrai" \
  --cache-dir "$WORK/unsigned-import"
expect_rc 1
expect_err 'unsigned'
run cache list --cache-dir "$WORK/unsigned-import"
expect_out '^total: 0 entries'

check "bad keys are refused by name: a loose secret key file, a malformed ASTRAI_JIT_TRUSTED_KEYS"
chmod 644 "$WORK/release.secret"
run cache sign --key "$WORK/release.secret" --cache-dir "$WORK/signed"
expect_rc 2
expect_err '--key .*release\.secret: not a usable secret key: mode 0644'
ASTRAI_JIT_SIGNING_KEY="$WORK/release.secret" run cache stats
expect_rc 2
expect_err 'ASTRAI_JIT_SIGNING_KEY=.* is not usable'
chmod 600 "$WORK/release.secret"
ASTRAI_JIT_TRUSTED_KEYS="ed25519:nothex:AAAA" run cache stats
expect_rc 2
expect_err 'ASTRAI_JIT_TRUSTED_KEYS=ed25519:nothex:AAAA is not valid'

check "info names the trusted keys and the signing key"
ASTRAI_JIT_TRUSTED_KEYS="$WORK/release.pub" ASTRAI_JIT_SIGNING_KEY="$WORK/release.secret" run info
expect_rc 0
expect_out '^  signatures: required, trusted keys [0-9a-f]{16}$'
expect_out '^  signing key: [0-9a-f]{16} '
run info
expect_out '^  signatures: not required'

check "cache stats --json is one JSON object with the directory's figures and the process counters"
run cache stats --json --cache-dir "$WORK/signed"
expect_rc 0
python3 - "$OUT" <<'PY' || fail "cache stats --json is not the expected JSON"
import json, sys
stats = json.load(open(sys.argv[1]))
assert stats["entries"] == 1 and stats["total_bytes"] > 0, stats
assert set(stats["process"]["tiers"]) == {"memory", "layer", "disk", "remote"}, stats
assert stats["process"]["compiles"] == 0
PY
run cache stats --help
expect_out '--json'
run cache sign --help
expect_out '--key'
run cache export --help
expect_out '--sign'

# --------------------------------------------------------------------------------------------
check "ASTRAI_JIT_CACHE=bogus info exits 2 naming the value"
set +e
ASTRAI_JIT_CACHE=bogus "$BIN" info >"$OUT" 2>"$ERR"
RC=$?
set -e
expect_rc 2
expect_err 'ASTRAI_JIT_CACHE=bogus'

# --------------------------------------------------------------------------------------------
check "info exits 0, shows NVRTC, the driver state, the cache and the variables set"
set +e
ASTRAI_JIT_MAX_CACHE_SIZE=1G ASTRAI_JIT_TYPO=1 "$BIN" info >"$OUT" 2>"$ERR"
RC=$?
set -e
expect_rc 0
expect_out '^NVRTC: [0-9]+\.[0-9]+$'
expect_out 'supported archs: .*sm_[0-9]+'
if grep -q '^driver: not available' "$OUT"; then
  expect_out '^devices: none \(no CUDA driver or GPU available'
else
  expect_out '^driver: CUDA [0-9]+\.[0-9]+'
  expect_out '^  device 0: '
fi
expect_out "^  directory: ${ASTRAI_JIT_CACHE_DIR}$"
expect_out '^  cap: 1\.0 GiB'
expect_out '^  ASTRAI_JIT_MAX_CACHE_SIZE=1G$'
expect_out '^  ASTRAI_JIT_TYPO=1 +\(unknown'
expect_err 'unknown environment variable ASTRAI_JIT_TYPO'

check "info --variables lists every variable with its value; --markdown is the README's table"
ASTRAI_JIT_LOG=info run info --variables
expect_rc 0
expect_out '^ASTRAI_JIT_LOG=info$'
expect_out '^ASTRAI_JIT_FORCE_COMPILE \(not set\)$'
expect_out '^ASTRAI_JIT_NVRTC_DIR'
run info --variables --markdown
expect_rc 0
readme="$(dirname "$0")/../../README.md"
sed -n '/^<!-- env-table:/,/^<!-- env-table end -->/p' "$readme" | sed '1d;$d' >"$WORK/readme-table.md"
if ! diff -u "$WORK/readme-table.md" "$OUT" >"$WORK/table.diff"; then
  cat "$WORK/table.diff" >&2
  fail "the README's variable table differs from 'astrai-jit info --variables --markdown' (regenerate it)"
fi
[ "$(grep -c '^| `ASTRAI_JIT_' "$OUT")" -ge 17 ] || fail "the variable table lists fewer than 17 variables"
run info --markdown
expect_rc 2
expect_err 'goes with --variables'
# The Python loader's variable is known, so it draws no unknown-variable warning.
ASTRAI_JIT_NVRTC_DIR=/nonexistent run info
expect_rc 0
if grep -q 'unknown environment variable ASTRAI_JIT_NVRTC_DIR' "$ERR"; then fail "ASTRAI_JIT_NVRTC_DIR warned as unknown"; fi

check "plan shows the implementation, the variant and why a faster one was passed over"
run plan paged_decode --arch sm_90a --sms 132 --batch 64 --heads 32 --kv-heads 8 --kv-len 8192
expect_rc 0
expect_out '^implementation: sm90_tma_decode$'
expect_out '^variant: paged_decode\.bf16\.hd128\.ps16\.g4\.tma\.sm_90a$'
run plan prefill --arch sm_90a --sms 132 --q-len 4096 --batch 2 --mask
expect_rc 0
expect_out '^implementation: portable_prefill$'
expect_out '^passed over: sm90_wgmma_prefill: a mask is not served$'
run plan paged_decode --arch sm_89 --sms 128 --features kv_e4m3 --batch 1 --kv-len 32768
expect_rc 0
expect_out '^variant: paged_decode\.bf16\.hd128\.ps16\.g1\.kv_e4m3\.sm_89$'
expect_out '^split-KV: [0-9]+ splits'
expect_out '^warm it with: astrai-jit warm --arch sm_89 --kernels paged_decode'
run plan prefill --features kv_e4m3 --arch sm_90a
expect_rc 2
run plan rotary_emb --arch sm_90a
expect_rc 2
expect_err 'is not an attention call'
run plan mla_decode --arch sm_90a --sms 132 --batch 1 --heads 16 --q-len 2 --page-size 64 --kv-len 32768
expect_rc 0
expect_out '^implementation: sm90_wgmma_mla_decode$'
expect_out '^variant: mla_decode\.bf16\.hd576\.ps64\.g16\.q2\.wgmma\.sm_90a$'
expect_out '^tiling: 64 query rows a CTA, blocks of 64 keys$'
expect_out '^split-KV: [0-9]+ splits'
ASTRAI_JIT_NO_WGMMA=1 run plan mla_decode --arch sm_90a --sms 132 --batch 1 --heads 16 --q-len 2 --page-size 64 --kv-len 32768
expect_rc 0
expect_out '^implementation: portable_mla_decode$'
expect_out '^variant: mla_decode\.bf16\.hd576\.ps64\.g16\.q2\.sm_90a$'
expect_out '^tiling: 32 query rows a CTA, blocks of 32 keys$'
expect_out '^passed over: sm90_wgmma_mla_decode: ASTRAI_JIT_NO_WGMMA is set$'
run plan mla_decode --arch sm_90a --sms 132 --batch 4 --heads 128 --page-size 1 --kv-len 4096
expect_rc 0
expect_out '^implementation: portable_mla_decode$'
expect_out '^passed over: sm90_wgmma_mla_decode: pages are under 16 tokens$'
run plan mla_decode --arch sm_89 --sms 128 --batch 64 --heads 128 --kv-len 8192 --page-size 64
expect_rc 0
expect_out '^tiling: 32 query rows a CTA, blocks of 16 keys$'
run plan mla_decode --arch sm_90a --heads 256
expect_rc 2
expect_err 'group size 256 is not supported'
run plan mla_decode --arch sm_75
expect_rc 2
expect_err 'needs tensor cores'

echo "PASS: all astrai-jit CLI checks ($((SECONDS - START)) s)"
