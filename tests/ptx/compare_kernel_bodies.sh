#!/usr/bin/env bash
# Says how the PTX of two builds differs, variant by variant, where scripts/bench/compare_plain_ptx.sh
# reports DIFFERS: NVVM writes a `.global` definition for every namespace-scope constant and
# every static constexpr member a kernel's templates instantiate, unreferenced or not, so moving
# code into new structs or files changes that list without changing an instruction.
#   tests/ptx/compare_kernel_bodies.sh OLD NEW MANIFEST
# OLD and NEW are astrai-jit binaries (each warms the manifest into a fresh cache with
# ASTRAI_JIT_DUMP set) or directories such a warm already dumped into (only the manifest's
# variants are compared).
# Each variant is reported as
#   SAME       byte-identical PTX
#   BODY-SAME  identical apart from the `.global` constant definitions, none of them referenced
#   RENAMED    the same instructions in the same order and the same data flow, apart from the
#              numbering of virtual registers and labels, the order of the two sources of a
#              commutative operation, and the way round of a comparison (a >= b as b <= a)
#              (with the line count that differs before normalizing)
#   SASS-SAME  the PTX differs (reordered or renamed instructions), but ptxas made the same
#              machine code of it: every kernel's .text section, its .nv.info attributes and its
#              shared and constant-bank sizes are byte-identical in the two cubins
#   DIFFERS    instructions differ (the count of differing lines after normalizing)
# Exit 0 when nothing DIFFERS, 1 otherwise, 2 on usage errors.
set -uo pipefail
if [ $# -ne 3 ] || [ ! -e "$1" ] || [ ! -e "$2" ] || [ ! -f "$3" ]; then
  echo "usage: $0 OLD NEW MANIFEST (each of OLD, NEW an astrai-jit binary or a dump directory)" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in old new; do
  source=$1
  [ "$side" = new ] && source=$2
  if [ -d "$source" ]; then
    ln -s "$(cd "$source" && pwd)" "$work/$side"
  elif ! ASTRAI_JIT_DUMP="$work/$side" "$source" warm --manifest "$3" --cache-dir "$work/cache-$side" \
      > "$work/$side.log" 2>&1; then
    echo "$side: warm failed:" >&2
    tail -n 5 "$work/$side.log" >&2
    exit 1
  fi
done
# The PTX without its constant definitions; fails when an instruction names one of them.
body() {
  local ptx
  ptx=$(tr -d '\000' < "$1")
  local names
  names=$(grep -oE '^\.global \.align [0-9]+ \.[a-z0-9]+ [A-Za-z0-9_]+' <<< "$ptx" | awk '{print $5}')
  local name
  for name in $names; do
    if grep -v '^\.global ' <<< "$ptx" | grep -qF -- "$name"; then
      echo "REFERENCED $name"
    fi
  done
  grep -v '^\.global \.align' <<< "$ptx"
}
# A comparison written either way round (a >= b as b <= a) in one form: the greater-than kinds
# as their mirrored less-than kinds with the sources swapped, the symmetric kinds with them sorted.
# Then virtual registers and labels renamed in order of first appearance (so that data flow must
# match, not only the instruction sequence), and the two sources of commutative operations sorted.
normalize() {
  python3 -c '
import re, sys
names = {}
def rename(m):
    key = m.group(0)
    if key not in names:
        kind = re.match(r"%[a-z]+|[$]L__BB", key).group(0)
        names[key] = "%s#%d" % (kind, sum(1 for k in names if k.startswith(kind)))
    return names[key]
token = re.compile(r"%(?:rd|rs|fd|r|p|f)[0-9]+|[$]L__BB[0-9_]+")
commutative = re.compile(r"^(\s*(?:add|mul|and|or|xor|min|max)[.a-z0-9]*\s+[^,]+,\s*)([^,]+),\s*([^,;]+);$")
compare = re.compile(r"^(\s*setp\.)([a-z]+)(\.[a-z0-9]+\s+[^,]+,\s*)([^,]+),\s*([^,;]+);$")
mirrored = {"gt": "lt", "ge": "le", "hi": "lo", "hs": "ls", "gtu": "ltu", "geu": "leu"}
symmetric = {"eq", "ne", "equ", "neu", "num", "nan"}
for line in sys.stdin:
    line = re.sub(r"%(r|rd|p|f|rs|fd)<[0-9]+>", r"%\1<N>", line.rstrip("\n"))
    m = compare.match(line)
    if m and m.group(2) in mirrored:
        line = "%s%s%s%s, %s;" % (m.group(1), mirrored[m.group(2)], m.group(3), m.group(5).strip(), m.group(4).strip())
    line = token.sub(rename, line)
    m = compare.match(line)
    if m and m.group(2) in symmetric:
        a, b = sorted([m.group(4).strip(), m.group(5).strip()])
        line = "%s%s%s%s, %s;" % (m.group(1), m.group(2), m.group(3), a, b)
    m = commutative.match(line)
    if m:
        a, b = sorted([m.group(2).strip(), m.group(3).strip()])
        line = "%s%s, %s;" % (m.group(1), a, b)
    print(line)
'
}
# The machine code of a cubin: each kernel section's name with the digest of its bytes (the size
# of a NOBITS section, which has none), listed by readelf.
machine_code() {
  readelf -SW "$1" 2>/dev/null | sed -n 's/^ *\[ *[0-9]*\] //p' |
    awk '$1 ~ /^\.(text|nv\.info|nv\.shared|nv\.constant0)\./ {print $1, $2, $4, $5}' |
    while read -r section type offset size; do
      if [ "$type" = NOBITS ]; then
        echo "$section nobits $size"
      else
        echo "$section $(tail -c +$((0x$offset + 1)) "$1" | head -c $((0x$size)) | sha256sum | cut -c1-16)"
      fi
    done
}
same_machine_code() {
  [ -f "$1" ] && [ -f "$2" ] && [ -n "$(machine_code "$1")" ] && [ "$(machine_code "$1")" = "$(machine_code "$2")" ]
}
status=0
count=0
for name in $(sed 's/#.*//' "$3"); do
  ptx="$work/old/$name.ptx"
  other="$work/new/$name.ptx"
  count=$((count + 1))
  if [ ! -f "$ptx" ] || [ ! -f "$other" ]; then
    echo "MISSING    $name"
    status=1
  elif cmp -s "$ptx" "$other"; then
    echo "SAME       $name"
  elif diff -q <(body "$ptx") <(body "$other") > /dev/null; then
    echo "BODY-SAME  $name"
  else
    raw=$(diff <(body "$ptx") <(body "$other") | grep -c '^[<>]')
    changed=$(diff <(body "$ptx" | normalize) <(body "$other" | normalize) | grep -c '^[<>]')
    if [ "$changed" -eq 0 ]; then
      echo "RENAMED    $name ($raw lines before normalizing)"
    elif same_machine_code "$work/old/$name.cubin" "$work/new/$name.cubin"; then
      echo "SASS-SAME  $name ($changed instruction lines of PTX differ)"
    else
      echo "DIFFERS    $name ($changed instruction lines)"
      status=1
    fi
  fi
done
echo "$count variants compared"
exit $status
