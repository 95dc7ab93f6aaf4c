#!/usr/bin/env python3
"""Cascade attention and the state merge, astrai-jit beside FlashInfer on the same tensors in one run.

    python bench/cascade_side_by_side.py [--batch 64 --prefix 8192 --own 512] [--no-flashinfer]

Rows (bf16, 32/8 heads, head_dim 128, pages of 16 tokens):
- cascade: ``batch`` requests of one query token each over one shared prefix of ``prefix``
  tokens plus ``own`` tokens each: astrai-jit's ``cascade`` (two levels), FlashInfer's
  ``MultiLevelCascadeAttentionWrapper`` (two levels, planned once, its default backend), and
  astrai-jit's plain ``paged_decode`` of the same requests over the same pages (tables that
  repeat the prefix's pages) as the baseline the speedup is over.
- merge: two states of ``[16384, 32, 128]`` merged, astrai-jit's ``merge_state`` and
  FlashInfer's.
Ceiling in the same run: a device copy of 1 GiB (bytes read + written). Timing: CUDA events
around 20 back-to-back calls, median (min..max) of 7 windows after warm-up. The cascade's
outputs are checked against each other and against the plain decode before they are timed.
FlashInfer's first call compiles its kernels (minutes); MAX_JOBS bounds its nvcc jobs.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from timing import optional_flashinfer, timed  # bench/, the script's own directory


def row(name: str, t, bytes_moved: float = 0.0, ceiling: float = 0.0, base: float = 0.0) -> None:
    median, low, high = t
    text = f"{name:46s} {median:9.2f} us ({low:.2f}..{high:.2f})"
    if bytes_moved:
        rate = bytes_moved / median / 1e6
        text += f"  {rate:5.2f} TB/s"
        if ceiling:
            text += f" = {100 * rate / ceiling:5.1f}% of copy"
    if base:
        text += f"  {base / median:5.2f}x plain paged_decode"
    print(text, flush=True)


def compared(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    diff = (got.float() - want.float())
    rel = diff.norm() / want.float().norm()
    print(f"check {name:40s} max abs {diff.abs().max().item():.3e}  rel norm {rel.item():.3e}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=8192)
    parser.add_argument("--own", type=int, default=512)
    parser.add_argument("--no-flashinfer", action="store_true")
    args = parser.parse_args()

    import astrai_jit

    flashinfer = optional_flashinfer(args.no_flashinfer)
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), flush=True)
    torch.manual_seed(0)

    src = torch.empty(1 << 29, dtype=torch.bfloat16, device=dev).uniform_()
    dst = torch.empty_like(src)
    copy = timed(lambda: dst.copy_(src), calls=5)
    ceiling = 2 * src.numel() * 2 / copy[0] / 1e6
    print(f"copy ceiling {ceiling:.2f} TB/s", flush=True)
    del src, dst

    # --- merge ---
    tokens, heads, hd = 16384, 32, 128
    v_a, v_b = (torch.randn(tokens, heads, hd, dtype=torch.bfloat16, device=dev) for _ in range(2))
    s_a, s_b = (torch.randn(tokens, heads, dtype=torch.float32, device=dev) * 4 for _ in range(2))
    merge_bytes = 3 * v_a.numel() * 2 + 3 * s_a.numel() * 4
    row("merge_state astrai-jit hd128 T16384 H32", timed(lambda: astrai_jit.merge_state(v_a, s_a, v_b, s_b)),
        merge_bytes, ceiling)
    if flashinfer is not None:
        try:
            row("merge_state flashinfer", timed(lambda: flashinfer.merge_state(v_a, s_a, v_b, s_b)), merge_bytes, ceiling)
        except Exception as error:
            print(f"flashinfer merge_state failed: {error!r}", flush=True)
    del v_a, v_b, s_a, s_b

    # --- cascade ---
    ps, kv_heads, q_heads = 16, 8, 32
    batch, prefix, own = args.batch, args.prefix, args.own
    prefix_pages, own_pages = -(-prefix // ps), -(-own // ps)
    num_pages = prefix_pages + batch * own_pages
    physical = torch.randperm(num_pages, device=dev, dtype=torch.int32)
    shared = physical[:prefix_pages]
    owned = physical[prefix_pages:].view(batch, own_pages)
    k_cache = torch.randn(num_pages, ps, kv_heads, hd, dtype=torch.bfloat16, device=dev)
    v_cache = torch.randn(num_pages, ps, kv_heads, hd, dtype=torch.bfloat16, device=dev)
    q = torch.randn(batch, q_heads, hd, dtype=torch.bfloat16, device=dev)
    kv_bytes = (prefix + batch * own) * kv_heads * hd * 2 * 2 + 2 * q.numel() * 2
    i32 = dict(dtype=torch.int32, device=dev)

    levels = [
        astrai_jit.CascadeLevel(torch.tensor([0, batch], **i32), shared.view(1, -1), torch.tensor([prefix], **i32)),
        astrai_jit.CascadeLevel(torch.arange(batch + 1, **i32), owned.contiguous(), torch.full((batch,), own, **i32),
                                causal=True, max_q_len=1),
    ]
    whole_table = torch.cat([shared.expand(batch, -1), owned], dim=1).contiguous()
    whole_lens = torch.full((batch,), prefix + own, **i32)
    ours = astrai_jit.cascade(q, k_cache, v_cache, levels)
    plain = astrai_jit.paged_decode(q, k_cache, v_cache, whole_table, whole_lens)
    compared("astrai-jit cascade vs its paged_decode", ours, plain)
    base = timed(lambda: astrai_jit.paged_decode(q, k_cache, v_cache, whole_table, whole_lens))
    label = f"B{batch}.P{prefix}.U{own}"
    row(f"paged_decode astrai-jit {label} (baseline)", base, kv_bytes, ceiling)
    row(f"cascade astrai-jit {label}", timed(lambda: astrai_jit.cascade(q, k_cache, v_cache, levels)), kv_bytes,
        ceiling, base[0])

    if flashinfer is not None:
        try:
            workspace = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
            wrapper = flashinfer.MultiLevelCascadeAttentionWrapper(2, workspace, "NHD")
            last = lambda n: torch.tensor([n - (-(-n // ps) - 1) * ps], **i32)  # noqa: E731
            started = time.perf_counter()
            wrapper.plan([torch.tensor([0, batch], **i32), torch.arange(batch + 1, **i32)],
                         [torch.tensor([0, prefix_pages], **i32), torch.arange(batch + 1, **i32) * own_pages],
                         [shared.contiguous(), owned.reshape(-1).contiguous()],
                         [last(prefix), last(own).expand(batch).contiguous()],
                         q_heads, kv_heads, hd, ps, causal=False, q_data_type=torch.bfloat16,
                         kv_data_type=torch.bfloat16)
            theirs = wrapper.run(q, (k_cache, v_cache))
            torch.cuda.synchronize()
            print(f"flashinfer cascade plan + first run (its JIT): {time.perf_counter() - started:.1f} s", flush=True)
            compared("flashinfer cascade vs astrai-jit paged_decode", theirs, plain)
            row(f"cascade flashinfer {label}", timed(lambda: wrapper.run(q, (k_cache, v_cache))), kv_bytes, ceiling,
                base[0])
        except Exception as error:
            print(f"flashinfer cascade failed: {error!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
