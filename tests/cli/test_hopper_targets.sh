#!/usr/bin/env bash
# scripts/bench/hopper_targets.py on hand-made runs (no GPU): every target met, one missed, one not
# measured, prefill without cuDNN's sustained figures, and input it cannot read.
#
#   bash tests/cli/test_hopper_targets.sh [scripts/bench/hopper_targets.py]
set -euo pipefail

TOOL=${1:-$(dirname "$0")/../../scripts/bench/hopper_targets.py}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hopper-targets.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

fail() {
  echo "FAIL: $*" >&2
  [[ -f "$WORK/out.md" ]] && cat "$WORK/out.md" >&2
  exit 1
}

# bench_json FILE [NAME=US ...]: a bench run whose cases take these times (us a call); prefill
# rates are set from the time so that their ratios are known.
bench_json() {
  local file=$1
  shift
  python3 - "$file" "$@" <<'EOF'
import json, sys
path, pairs = sys.argv[1], sys.argv[2:]
cases = []
for pair in pairs:
    name, value = pair.split("=")
    kind, field = name.split(":") if ":" in name else (name, "us")
    case = {"name": kind, "status": "ok", "us_per_call": {"median": 1.0}}
    if field == "us":
        case["us_per_call"]["median"] = float(value)
    else:
        case[field] = float(value)
    cases.append(case)
json.dump({"ceilings": {"gemm": {"status": "measured", "tflops": 650.0}}, "cases": cases}, open(path, "w"))
EOF
}

cat > "$WORK/reference.txt" <<'EOF'
TIME torch-cudnn prefill hd128 B4 L4096 causal0: 0.800 ms 680.0 TFLOP/s
SUSTAINED torch-cudnn prefill hd128 B4 L4096 causal0: 0.900 ms 600.0 TFLOP/s over 1 s
TIME torch-cudnn prefill hd128 B2 L8192 causal1: 0.800 ms 640.0 TFLOP/s
SUSTAINED torch-cudnn prefill hd128 B2 L8192 causal1: 0.900 ms 560.0 TFLOP/s over 1 s
SUSTAINED torch-cudnn prefill hd64 B2 L8192 causal1: 0.900 ms 430.0 TFLOP/s over 1 s
SUSTAINED torch-cudnn prefill hd256 B2 L8192 causal1: 0.900 ms 620.0 TFLOP/s over 1 s
TIME torch-cudnn decode hd128 h32kv8 B64 L8192: 509.3 us 4.22 TB/s
TIME torch-cudnn decode hd128 h32kv8 B16 L32768: 505.8 us 4.25 TB/s
TIME torch-cudnn decode hd128 h32kv8 B32 L4096: 147.6 us 3.64 TB/s
SKIP torch-flash2 decode hd64 h24kv4 B32 L4096: not supported
EOF

met=(prefill/hd128.causal.B2x8192:rate=600 prefill/hd128.full.B4x4096:rate=640
     prefill/hd64.causal.B2x8192:rate=450 prefill/hd256.causal.B2x8192:rate=630
     paged_prefill/hd128.ps16.causal.B2x8192:rate=580
     paged_decode/hd128.ps16.B64xL8192=498.6 paged_decode/hd128.ps16.B16xL32768=501.9
     paged_decode/hd128.ps16.B32xL4096=128.6 paged_decode/hd64.h24kv4.ps16.B32xL4096:percent_of_ceiling=86.0
     paged_decode/hd128.ps16.B1xL1024=5.7)

# Every target met: exit 0, eleven rows, each "yes".
bench_json "$WORK/met.json" "${met[@]}"
python3 "$TOOL" --bench "$WORK/met.json" --reference "$WORK/reference.txt" > "$WORK/out.md" || fail "all met: exit $?"
[[ $(grep -c '| yes |$' "$WORK/out.md") -eq 11 ]] || fail "all met: expected 11 rows met"
grep -q '| prefill/hd128.full.B4x4096 | 640.0 TFLOP/s | cuDNN sustained 600.0 TFLOP/s | 1.07x |' "$WORK/out.md" ||
  fail "non-causal prefill row: ours over cuDNN's sustained figure"
grep -q '| paged_decode/hd128.ps16.B64xL8192 | 498.6 us | cuDNN 509.3 us | 1.02x |' "$WORK/out.md" ||
  fail "decode row: cuDNN's time over ours"

# hd64 under 85% and batch 1 over 6 us: "no", exit 1.
missed=("${met[@]}")
missed[8]=paged_decode/hd64.h24kv4.ps16.B32xL4096:percent_of_ceiling=83.0
missed[9]=paged_decode/hd128.ps16.B1xL1024=6.1
bench_json "$WORK/missed.json" "${missed[@]}"
if python3 "$TOOL" --bench "$WORK/missed.json" --reference "$WORK/reference.txt" > "$WORK/out.md"; then
  fail "missed targets: exit 0"
fi
grep -q '| paged_decode/hd64.h24kv4.ps16.B32xL4096 | 83.0% of read | - | - | >= 85% of read | no |' "$WORK/out.md" ||
  fail "hd64 row not 'no'"
grep -q '| paged_decode/hd128.ps16.B1xL1024 | 6.10 us | - | - | <= 6 us | no |' "$WORK/out.md" || fail "B1 row not 'no'"

# A case the run lacks, and prefill with burst figures only: "not measured", never "yes".
bench_json "$WORK/partial.json" "${met[@]:1}"
grep -v '^SUSTAINED torch-cudnn prefill hd64' "$WORK/reference.txt" > "$WORK/burst-only.txt"
if python3 "$TOOL" --bench "$WORK/partial.json" --reference "$WORK/burst-only.txt" > "$WORK/out.md"; then
  fail "partial run: exit 0"
fi
grep -q '| prefill/hd128.causal.B2x8192 | - | cuDNN sustained 560.0 TFLOP/s | - | >= 1.05x cuDNN | not measured |' \
  "$WORK/out.md" || fail "missing case not 'not measured'"
grep -q '| paged_prefill/hd128.ps16.causal.B2x8192 | 580.0 TFLOP/s | - | - | >= 0.95x prefill | not measured |' \
  "$WORK/out.md" || fail "paged prefill without its contiguous row not 'not measured'"
grep -q '| prefill/hd64.causal.B2x8192 | 450.0 TFLOP/s | - | - | >= 1.00x cuDNN | not measured |' "$WORK/out.md" ||
  fail "prefill without cuDNN's sustained figure not 'not measured'"

# No reference at all: the rows that need it are not measured; the others still judged.
python3 "$TOOL" --bench "$WORK/met.json" > "$WORK/out.md" && fail "no reference: exit 0"
[[ $(grep -c '| not measured |$' "$WORK/out.md") -eq 7 ]] || fail "no reference: expected 7 rows not measured"

# Input it cannot read: exit 2 with a message naming the problem.
echo '{not json' > "$WORK/broken.json"
set +e
python3 "$TOOL" --bench "$WORK/broken.json" > "$WORK/out.md" 2> "$WORK/err.txt"
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "broken JSON: exit $rc, expected 2"
grep -q 'cannot read the run' "$WORK/err.txt" || fail "broken JSON: no message"
echo "hopper_targets: ok"
