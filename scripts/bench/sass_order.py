#!/usr/bin/env python3
"""Prints the order of the instructions that shape a wgmma pipeline in a kernel's SASS: wgmma
(HGMMA), its fences and waits (WARPGROUP.*), exp2 (MUFU.EX2), barriers and mbarrier operations
(BAR, SYNCS), shared stores, branches and local-memory spills. Runs of the same opcode print as
one line with a count. Where ptxas moved a wait shows at a glance (docs/performance.md).

    ASTRAI_JIT_DUMP=/tmp/dump astrai-jit warm --arch sm_90a --kernels prefill --head-dims 128 --hopper
    cuobjdump -sass /tmp/dump/prefill.bf16.hd128.g4.wgmma.sm_90a.cubin | scripts/bench/sass_order.py

cuobjdump comes with the CUDA toolkit (or the nvidia-cuda-cuobjdump wheel from PyPI)."""
import re
import sys

KEYS = ("HGMMA", "WARPGROUP", "MUFU.EX2", "BAR.", "SYNCS", "STS", "STL", "LDL", "BRA", "EXIT")
LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def main() -> int:
    previous_key, count, first = None, 0, None
    for text in sys.stdin:
        match = LINE.match(text)
        if not match:
            continue
        address, instruction = match.groups()
        key = next((k for k in KEYS if k in instruction), None)
        if key is None:
            continue
        if key == previous_key and key in ("HGMMA", "MUFU.EX2"):
            count += 1
            continue
        if first:
            print(f"{first[0]}  {f'{count}x ' if count > 1 else ''}{first[1]}")
        previous_key, count, first = key, 1, (address, instruction)
    if first:
        print(f"{first[0]}  {f'{count}x ' if count > 1 else ''}{first[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
