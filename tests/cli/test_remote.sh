#!/usr/bin/env bash
# `astrai-jit cache push` and `cache pull` against a real redis-server on 127.0.0.1, and the
# warm of a fresh node reading through the remote. Exits 77 (skipped) when redis-server is absent,
# 1 instead under ASTRAI_REQUIRE_SERVERS=1.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

start_redis
REMOTE="redis://127.0.0.1:$PORT/0"

ROTARY=rotary_emb.bf16.hd64.sm_89
ROTARY2=rotary_emb.fp16.hd32.sm_89
printf '%s\n%s\n' "$ROTARY" "$ROTARY2" >"$WORK/manifest.txt"
printf '%s\n' "$ROTARY" >"$WORK/one.txt"

check "push without a remote exits 2 and says how to name one"
run cache push
expect_rc 2
expect_err "no remote cache: give --remote URLS or set ASTRAI_JIT_REMOTE"

check "a malformed --remote exits 2 naming what is allowed"
run cache push --remote "ftp://x"
expect_rc 2
expect_err "--remote is not valid: item 1: unknown scheme 'ftp' \(allowed: a comma-separated list"

check "warm two variants, then push exactly one of them by manifest"
run warm --manifest "$WORK/manifest.txt" --jobs 1
expect_rc 0
run cache push --remote "$REMOTE" --manifest "$WORK/one.txt"
expect_rc 0
expect_out "^push: 1 entry, .* to redis://127\.0\.0\.1:$PORT/0$"

check "push of everything"
ASTRAI_JIT_REMOTE="$REMOTE" run cache push
expect_rc 0
expect_out "^push: 2 entries, "

check "pull into a fresh cache fetches both, checked; a second pull finds them cached"
export ASTRAI_JIT_CACHE_DIR="$WORK/node2"
run cache pull --remote "$REMOTE" --manifest "$WORK/manifest.txt"
expect_rc 0
expect_out "^pull: 2 entries, .* into $WORK/node2 from redis://127\.0\.0\.1:$PORT/0; 0 already cached$"
run cache verify
expect_rc 0
expect_out "^verify: 2 entries checked, 0 damaged"
run cache pull --remote "$REMOTE" --manifest "$WORK/manifest.txt"
expect_rc 0
expect_out "^pull: 0 entries, .*; 2 already cached$"

check "a variant the remote lacks is named and exits 1"
printf '%s\n' rotary_emb.bf16.hd48.sm_89 >"$WORK/absent.txt"
run cache pull --remote "$REMOTE" --manifest "$WORK/absent.txt"
expect_rc 1
expect_err "rotary_emb\.bf16\.hd48\.sm_89 is not on the remote"

check "a fresh node's warm reads through the remote: nothing compiled"
export ASTRAI_JIT_CACHE_DIR="$WORK/node3"
ASTRAI_JIT_REMOTE="$REMOTE" run warm --manifest "$WORK/manifest.txt" --jobs 1
expect_rc 0
expect_out "^warm: 2 variants, 0 compiled"

if command -v redis-cli >/dev/null; then
  check "a Redis with a password: the URL's password is sent, a wrong one is named by Redis"
  redis-cli -p "$PORT" CONFIG SET requirepass s3cret >/dev/null
  run cache push --remote "redis://:wrong@127.0.0.1:$PORT/1"
  expect_rc 1
  expect_err "WRONGPASS"
  run cache push --remote "redis://:s3cret@127.0.0.1:$PORT/1"
  expect_rc 0
  expect_out "^push: 2 entries, .* to redis://127\.0\.0\.1:$PORT/1$"
fi

check "a remote that is down: pull says so and exits 1, quickly"
stop_redis
export ASTRAI_JIT_CACHE_DIR="$WORK/node4"
run cache pull --remote "$REMOTE" --manifest "$WORK/manifest.txt"
expect_rc 1
expect_err "remote kernel cache redis://127\.0\.0\.1:$PORT/0 is unavailable \(.*\); working from the local cache"
expect_err "redis://127\.0\.0\.1:$PORT/0 is unavailable: nothing more pulled"

echo "remote CLI tests passed in $((SECONDS - START)) s"
