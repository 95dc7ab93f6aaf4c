#!/usr/bin/env bash
# `astrai-bench --list` (no GPU needed): the serving-feature rows are listed next to their plain
# rows, with their feature arguments.
#
#   bash tests/cli/test_bench_list.sh build/bench/astrai-bench
set -euo pipefail

BIN=${1:-}
if [[ -z "$BIN" || ! -x "$BIN" ]]; then
  echo "FAIL: pass the astrai-bench binary (got '${BIN}')" >&2
  exit 1
fi
OUT=$(mktemp "${TMPDIR:-/tmp}/astrai-bench-list.XXXXXX")
trap 'rm -f "$OUT"' EXIT

fail() {
  echo "FAIL: $*" >&2
  cat "$OUT" >&2
  exit 1
}

# expect_row NAME FEATURES: one line for NAME, ending in FEATURES ("" for a plain row).
expect_row() {
  local line
  line=$(grep -E "^${1//./\\.} " "$OUT" || true)
  [[ -n "$line" ]] || fail "no row $1"
  [[ $(grep -cE "^${1//./\\.} " "$OUT") -eq 1 ]] || fail "row $1 listed more than once"
  if [[ -n "$2" ]]; then
    [[ "$line" == *" $2" ]] || fail "row $1 does not end in '$2': $line"
  fi
}

"$BIN" --list >"$OUT" || fail "--list exited $?"
expect_row paged_decode/hd128.ps16.B32xL4096 ""
expect_row paged_decode/hd128.ps16.B64xL8192 ""
expect_row prefill/hd128.causal.B2x8192 ""
expect_row paged_decode/hd128.ps16.B32xL4096.swa "window_left=1024"
expect_row paged_decode/hd128.ps16.B64xL8192.swa "window_left=1024"
expect_row paged_decode/hd128.ps16.B32xL4096.cap "logit_cap=30"
expect_row paged_decode/hd128.ps16.B32xL4096.sink "sinks"
expect_row paged_decode/hd128.ps16.B32xL4096.swa.sink "window_left=1024 sinks"
expect_row prefill/hd128.causal.B2x8192.swa "window_left=1024"
expect_row prefill/hd128.causal.B2x8192.cap "logit_cap=30"
expect_row prefill/hd64.h24kv4.causal.B16x1024 ""
expect_row paged_decode/hd128.ps16.B64xL8192.kv_e4m3 ""
expect_row paged_decode/hd64.h24kv4.ps16.B32xL4096.inorder ""
expect_row paged_decode/hd128.ps16.B32xL4096.inorder ""

"$BIN" --list --filter '\.(swa|cap|sink)' >"$OUT" || fail "--list --filter exited $?"
[[ $(wc -l <"$OUT") -eq 7 ]] || fail "expected 7 feature rows"
echo "bench --list: ok"
