#!/usr/bin/env python3
"""MLA decode at small batch against its split count: the default plan's time, then the time with a
caller workspace sized for at most N splits (the plan takes fewer, longer splits to fit it), with
each output's relative difference from the default plan's. DeepSeek shapes: 128 heads, pages of 64.

    python bench/mla_split_sweep.py [--splits 16,24,32,40,48,56,64]

Each split CTA writes 64 rows x 512 f32 of partials that the combine reads back; the sweep shows
where they stop paying for the SMs the extra CTAs fill (docs/decisions/0028). Timing: bench/timing.py.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import timed  # noqa: E402

import astrai_jit  # noqa: E402

SHAPES = ((1, 8192), (1, 32768), (4, 8192), (8, 4096))
HEADS, PAGE, ROWS_PER_CTA = 128, 64, 64


def aligned(n: int) -> int:
    return (n + 255) // 256 * 256


def workspace_bytes(splits: int, batch: int) -> int:
    """The split workspace of `splits` splits: partial rows of 512 f32 and one LSE each."""
    rows = splits * batch * HEADS
    return aligned(rows * 512 * 4) + aligned(rows * 4) + 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", default="16,24,32,40,48,56,64", help="split caps to time, comma-separated")
    caps = [int(x) for x in parser.parse_args().splits.split(",")]
    scale = 1.0 / math.sqrt(192)
    for batch, length in SHAPES:
        pages = length // PAGE
        table = torch.randperm(batch * pages, device="cuda").int().reshape(batch, pages)
        lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, HEADS, 576, device="cuda").bfloat16()
        cache = torch.randn(batch * pages, PAGE, 576, device="cuda").bfloat16()
        want = astrai_jit.mla_decode(q, cache, table, lens, scale=scale).float()
        median, low, high = timed(lambda: astrai_jit.mla_decode(q, cache, table, lens, scale=scale))
        print(f"B{batch} x {length}: default plan {median:8.2f} us ({low:.2f}..{high:.2f})", flush=True)
        for cap in caps:
            ws = torch.empty(workspace_bytes(cap, batch), dtype=torch.uint8, device="cuda")
            got = astrai_jit.mla_decode(q, cache, table, lens, scale=scale, workspace=ws).float()
            diff = ((got - want).norm() / want.norm()).item()
            median, low, high = timed(lambda: astrai_jit.mla_decode(q, cache, table, lens, scale=scale, workspace=ws))
            print(f"  workspace for <= {cap:3d} splits: {median:8.2f} us ({low:.2f}..{high:.2f})  rel diff {diff:.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
