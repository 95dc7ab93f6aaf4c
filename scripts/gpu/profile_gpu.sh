#!/usr/bin/env bash
# Nsight Compute profiles of the kernels that set our ratios, on the GPU machine: one launch each
# of the Hopper prefill (hd128 causal B2 x 8192 and non-causal B4 x 4096, through astrai-bench),
# cuDNN's prefill on the causal shape (bench/torch_reference.py), the paged decode B64 x 8192,
# the hd64 24/4 paged decode B32 x 4096 and the contiguous decode of that shape, the batch-1
# paged decode B1 x 1024 and its split combine, the FP8 paths and the MLA decode (astrai-bench).
# For each: the full section set as text, and for ours the per-SASS instruction stall samples as
# CSV. Clocks are left alone (--clock-control none).
# Usage: scripts/gpu/profile_gpu.sh BUILD_DIR. Output under $OUT (or ./profile-logs). PROFILES: the
# names to run, comma-separated (default all: prefill_causal, prefill_full, cudnn_causal,
# paged_decode, paged_decode_hd64, decode_hd64, paged_decode_b1, split_combine_b1,
# paged_decode_hd64_e4m3, split_combine_hd64_e4m3, paged_decode_hd128_e4m3, paged_prefill,
# paged_prefill_kv_e4m3, prefill_qkv_e4m3,
# mla_decode_h128, mla_decode_h16).
set -uo pipefail
build=${1:-build}
out=${OUT:-profile-logs}
mkdir -p "$out"
reports=$(mktemp -d)
export ASTRAI_JIT_CACHE_DIR=${ASTRAI_JIT_CACHE_DIR:-$(mktemp -d)}
bench="$build/bench/astrai-bench"
status=0

# profile NAME KERNEL_REGEX SASS(0|1) COMMAND...
profile() {
  local name=$1 kernel=$2 sass=$3
  shift 3
  case ",${PROFILES:-$name}," in *",$name,"*) ;; *) return ;; esac
  echo "== $name: $*"
  timeout 300 ncu --clock-control none --set full --import-source no -k "regex:$kernel" -c 1 -f \
    -o "$reports/$name" "$@" > "$reports/$name.log" 2>&1 || { status=1; tail -n 20 "$reports/$name.log"; return; }
  ncu -i "$reports/$name.ncu-rep" --page details --print-details all > "$out/$name.txt" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Issue Slots Busy|No Eligible" \
    "$out/$name.txt" | head -12
  [ "$sass" = 1 ] && ncu -i "$reports/$name.ncu-rep" --page source --print-source sass --csv \
    > "$out/$name.sass.csv" 2>&1
}

profile prefill_causal prefill_sm90 1 "$bench" --filter '^prefill/hd128.causal' --reps 1
profile prefill_full prefill_sm90 0 "$bench" --filter '^prefill/hd128.full' --reps 1
profile cudnn_causal 'sdpa|fmha|flash|cudnn' 0 python3 bench/torch_reference.py \
  --filter 'cudnn prefill hd128 B2' --reps 1
profile paged_decode 'paged_decode' 1 "$bench" --filter '^paged_decode/hd128.ps16.B64xL8192$' --reps 1
profile paged_decode_hd64 'paged_decode' 1 "$bench" --filter '^paged_decode/hd64.h24kv4.ps16.B32xL4096$' --reps 1
# The contiguous decode runs the same kernel template without page lookups (kPageSize 0).
profile decode_hd64 'paged_decode' 1 "$bench" --filter '^decode/hd64.h24kv4.B32xL4096$' --reps 1
# Batch 1: the decode kernel and its split combine, each alone (ncu serializes the launches).
profile paged_decode_b1 'paged_decode' 1 "$bench" --filter '^paged_decode/hd128.ps16.B1xL1024$' --reps 1
profile split_combine_b1 'split_combine' 1 "$bench" --filter '^paged_decode/hd128.ps16.B1xL1024$' --reps 1
# The FP8 paths short of their targets (decision 0029, 0030, 0031): the TMA decode over an e4m3
# cache at AstrAI's hd64 heads and at hd128, the wgmma paged prefill over one, FP8 attention.
profile paged_decode_hd64_e4m3 'paged_decode_sm90' 1 "$bench" \
  --filter '^paged_decode/hd64.h24kv4.ps16.B32xL4096.kv_e4m3$' --reps 1
# Its split combine, a launch of its own when a split runs a CTA (narrow tiles forced: the plan
# takes wide CTAs, with no combine, at this shape).
profile split_combine_hd64_e4m3 'split_combine' 1 env ASTRAI_JIT_DECODE_TILES=narrow "$bench" \
  --filter '^paged_decode/hd64.h24kv4.ps16.B32xL4096.kv_e4m3$' --reps 1
profile paged_decode_hd128_e4m3 'paged_decode_sm90' 1 "$bench" --filter '^paged_decode/hd128.ps16.B64xL8192.kv_e4m3$' \
  --reps 1
# The bf16 paged prefill the FP8-cache one is held against (issue: >= 0.95x its TFLOP/s).
profile paged_prefill prefill_sm90 1 "$bench" --filter '^paged_prefill/hd128.ps16.causal.B2x8192$' --reps 1
profile paged_prefill_kv_e4m3 prefill_sm90 1 "$bench" --filter '^paged_prefill/hd128.ps16.causal.B2x8192.kv_e4m3$' \
  --reps 1
profile prefill_qkv_e4m3 prefill_sm90 1 "$bench" --filter '^prefill/hd128.causal.B2x8192.qkv_e4m3$' --reps 1
# MLA decode (decision 0028): 128 heads (a GEMM's share of the tensor cores) and 16 (the read).
profile mla_decode_h128 'mla_decode_sm90' 1 "$bench" --filter '^mla_decode/B64.L8192.H128$' --reps 1
profile mla_decode_h16 'mla_decode_sm90' 1 "$bench" --filter '^mla_decode/B64.L8192.H16$' --reps 1
exit $status
