# Shared by the CLI test scripts (sourced): the binary, a private work directory and cache, and
# the run / expect_* helpers. Sets BIN, WORK, OUT, ERR, RC, START.
BIN=${ASTRAI_CLI_BIN:-}
if [[ -z "$BIN" || ! -x "$BIN" ]]; then
  echo "FAIL: set ASTRAI_CLI_BIN to the astrai-jit binary (got '${BIN}')" >&2
  exit 1
fi

# Only the variables set below may influence the tool.
while IFS= read -r name; do
  unset "$name"
done < <(compgen -e | grep '^ASTRAI_JIT_' || true)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/astrai-cli-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export ASTRAI_JIT_CACHE_DIR="$WORK/cache"
OUT="$WORK/stdout"
ERR="$WORK/stderr"
RC=0
START=$SECONDS

check() { echo "check: $*"; }

fail() {
  echo "FAIL: $*" >&2
  echo "----- stdout of the last command -----" >&2
  cat "$OUT" >&2 || true
  echo "----- stderr of the last command -----" >&2
  cat "$ERR" >&2 || true
  exit 1
}

# Runs the tool, keeping stdout, stderr and the exit code; never stops the script.
run() {
  set +e
  "$BIN" "$@" >"$OUT" 2>"$ERR"
  RC=$?
  set -e
}

expect_rc() {
  [[ "$RC" -eq "$1" ]] || fail "expected exit code $1, got $RC"
}

expect_out() {
  grep -qE -- "$1" "$OUT" || fail "stdout does not match /$1/"
}

expect_err() {
  grep -qE -- "$1" "$ERR" || fail "stderr does not match /$1/"
}

expect_no_out() {
  if grep -qE -- "$1" "$OUT"; then fail "stdout unexpectedly matches /$1/"; fi
}

expect_count() {  # expect_count PATTERN N: stdout lines matching PATTERN
  local n
  n=$(grep -cE -- "$1" "$OUT" || true)
  [[ "$n" -eq "$2" ]] || fail "expected $2 stdout lines matching /$1/, got $n"
}

# start_redis: a redis-server on 127.0.0.1 at a free port, in $WORK, stopped on exit; sets
# REDIS_PID and PORT (stop_redis stops it early). Exits 77 (skipped) when redis-server is absent,
# 1 instead under ASTRAI_REQUIRE_SERVERS=1.
REDIS_PID=""
stop_redis() { if [[ -n "$REDIS_PID" ]]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; REDIS_PID=""; fi; }
start_redis() {
  local redis
  redis=$(command -v redis-server || true)
  if [[ -z "$redis" ]]; then
    if [[ "${ASTRAI_REQUIRE_SERVERS:-}" == 1 ]]; then
      echo "FAIL: ASTRAI_REQUIRE_SERVERS=1 and redis-server is not installed" >&2
      exit 1
    fi
    echo "skipped: redis-server is not installed (Debian package redis-server)"
    exit 77
  fi
  trap 'stop_redis; rm -rf "$WORK"' EXIT
  # A free port is found by trying: redis-server exits at once when the port is taken.
  for attempt in 1 2 3 4 5 6 7 8; do
    PORT=$(( 20000 + RANDOM % 40000 ))
    "$redis" --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
      >"$WORK/redis.log" 2>&1 &
    REDIS_PID=$!
    for _ in $(seq 50); do
      grep -q "Ready to accept connections" "$WORK/redis.log" && break
      kill -0 "$REDIS_PID" 2>/dev/null || break
      sleep 0.1
    done
    grep -q "Ready to accept connections" "$WORK/redis.log" && return 0
    stop_redis
  done
  cat "$WORK/redis.log" >&2
  fail "redis-server did not start"
}
