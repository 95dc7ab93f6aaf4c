#!/usr/bin/env bash
# Compares the PTX two builds give for the same variants (no GPU needed): each astrai-jit binary
# warms the variants into a fresh cache with ASTRAI_JIT_DUMP set, then the PTX files are
# diffed. Lines declaring a kernel's params size are reported apart: a params struct that grew
# at its end changes only them, and the kernels' instructions are then the same.
#   scripts/bench/compare_plain_ptx.sh OLD_ASTRAI_JIT NEW_ASTRAI_JIT [MANIFEST]
# MANIFEST (one variant name a line) defaults to plain and feature variants of paged_decode
# and decode on sm_75, sm_80, sm_89, sm_90a and .nomma. Exit 0 when every PTX matches apart
# from params sizes, 1 otherwise, 2 on usage errors.
set -uo pipefail
if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
  echo "usage: $0 OLD_ASTRAI_JIT NEW_ASTRAI_JIT [MANIFEST]" >&2
  exit 2
fi
old=$1
new=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
manifest=${3:-$work/manifest.txt}
if [ $# -lt 3 ]; then
  for target in sm_75 sm_80 sm_89 sm_90a nomma.sm_90a; do
    for variant in bf16.hd128.ps16.g4 fp16.hd64.ps1.g6 bf16.hd80.ps16.g20 bf16.hd128.ps16.g4.swa.cap.sink \
                   bf16.hd128.ps16.g4.kv_e4m3 fp16.hd64.ps1.g6.kv_e5m2.swa.sink; do
      echo "paged_decode.$variant.$target"
    done
    echo "decode.bf16.hd128.g4.$target"
    echo "decode.bf16.hd128.g4.kv_e4m3.swa.$target"
  done > "$manifest"
fi
for side in old new; do
  bin=${!side}
  if ! ASTRAI_JIT_DUMP="$work/$side" "$bin" warm --manifest "$manifest" --cache-dir "$work/cache-$side" \
      > "$work/$side.log" 2>&1; then
    echo "$side: warm failed:" >&2
    tail -n 5 "$work/$side.log" >&2
    exit 1
  fi
done
status=0
# The params-size line: `.param .align 8 .b8 <kernel>_param_0[336]`.
size_line='^[<>][[:space:]]*\.param \.align [0-9]* \.b8 [A-Za-z0-9_]*_param_0\[[0-9]*\]$'
for ptx in "$work"/old/*.ptx; do
  name=$(basename "$ptx" .ptx)
  other="$work/new/$name.ptx"
  if [ ! -f "$other" ]; then
    echo "MISSING  $name"
    status=1
    continue
  fi
  changes=$(diff <(tr -d '\000' < "$ptx") <(tr -d '\000' < "$other") | grep '^[<>]')
  sizes=$(grep -c -- "$size_line" <<< "$changes")
  others=$(grep -vc -- "$size_line" <<< "$changes")
  [ -z "$changes" ] && sizes=0 && others=0
  if [ "$others" -ne 0 ]; then
    echo "DIFFERS  $name ($others changed lines besides params sizes)"
    status=1
  elif [ "$sizes" -ne 0 ]; then
    echo "SAME     $name (params size changed)"
  else
    echo "SAME     $name"
  fi
done
exit $status
