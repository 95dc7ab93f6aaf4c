#!/usr/bin/env python3
"""MLA decode, astrai-jit beside FlashInfer's BatchMLAPagedAttentionWrapper on the same tensors in one run.

    python bench/mla_side_by_side.py [--backends fa3,fa2] [--no-flashinfer] [--fp8]

Rows (bf16 unless --fp8, DeepSeek-V3 shapes, pages of 64 tokens, one shuffled pool): B64 x 8192 with
128 heads and with 16, batch 1 x 8192 with 128 heads (latency), B32 x 4096 with 128 heads and two
new tokens a request (causal among them). astrai-jit reads q [..., 576] and the cache
[pages, 64, 576]; FlashInfer reads the same memory as its q_nope / q_pe and ckv / kpe views.
Ceilings in the same run: a device copy of 1 GiB (read + written) and the bytes each call must read
(the latent rows once, q, out). Timing: CUDA events around 20 back-to-back calls, median (min..max)
of 7 windows after warm-up. Outputs are checked against each other before they are timed, and
against a float64 reference of a few rows. FlashInfer's first call compiles its kernels (minutes);
MAX_JOBS bounds its nvcc jobs.
"""
from __future__ import annotations

import argparse
import math
import time

import torch

from timing import optional_flashinfer, timed  # bench/, the script's own directory

SCALE = 1.0 / math.sqrt(192)
SHAPES = [(64, 8192, 128, 1), (64, 8192, 16, 1), (1, 8192, 128, 1), (32, 4096, 128, 2)]


def row(name: str, t, bytes_moved: float, ceiling: float, flops: float, base: float = 0.0) -> None:
    median, low, high = t
    rate = bytes_moved / median / 1e6
    text = (f"{name:44s} {median:9.2f} us ({low:.2f}..{high:.2f})  {rate:5.2f} TB/s = {100 * rate / ceiling:5.1f}% "
            f"of copy  {flops / median / 1e6:6.1f} TFLOP/s")
    if base:
        text += f"  {base / median:5.2f}x astrai-jit's time"
    print(text, flush=True)


def reference_rows(q, cache, table, lens, b: int, heads) -> torch.Tensor:
    """float64 attention of request b's rows (its last token) over its keys."""
    page_size = cache.shape[1]
    n = int(lens[b])
    pos = torch.arange(n, device=q.device)
    rows = cache[table[b].long()[pos // page_size], pos % page_size].double()
    scores = q[b, -1, heads].double() @ rows.T * SCALE
    return torch.softmax(scores, dim=-1) @ rows[:, :512]


def case(batch: int, length: int, heads: int, q_len: int, fp8: bool, args, astrai_jit, flashinfer, ceiling) -> None:
    page_size = 64
    pages_each = length // page_size
    num_pages = batch * pages_each
    g = torch.Generator(device="cpu").manual_seed(batch * 7 + heads)
    table = torch.randperm(num_pages, generator=g).reshape(batch, pages_each).int().cuda()
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, q_len, heads, 576, device="cuda").to(torch.bfloat16)
    cache = torch.randn(num_pages, page_size, 576, device="cuda").to(torch.bfloat16)
    kv_scale = None
    if fp8:
        kv_scale = torch.tensor([0.25], device="cuda")
        cache = (cache.float() / kv_scale).to(torch.float8_e4m3fn)
    out = torch.empty(batch, q_len, heads, 512, dtype=torch.bfloat16, device="cuda")
    label = f"B{batch} x {length} H{heads}{f' q{q_len}' if q_len > 1 else ''}{' e4m3' if fp8 else ''}"
    kv_bytes = num_pages * page_size * 576 * cache.element_size() + out.numel() * 2 + q.numel() * 2
    flops = batch * q_len * heads * length * 2.0 * (576 + 512)

    fp8_args = {"kv_scale": kv_scale} if fp8 else {}

    def ours():
        astrai_jit.mla_decode(q, cache, table, lens, scale=SCALE, out=out, **fp8_args)

    ours()
    dequantized = cache.float() * kv_scale if fp8 else cache
    for b in (0, batch - 1):
        want = reference_rows(q, dequantized, table, lens, b, slice(0, heads, max(1, heads // 4)))
        got = out[b, -1, 0:heads:max(1, heads // 4)].double()
        print(f"check astrai-jit {label} b={b} vs float64: rel norm {((got - want).norm() / want.norm()).item():.2e}",
              flush=True)
    base = timed(ours)
    row(f"mla_decode astrai-jit {label}", base, kv_bytes, ceiling, flops)
    if flashinfer is None or fp8:
        return
    q_nope, q_pe = q.view(batch * q_len, heads, 576)[..., :512], q.view(batch * q_len, heads, 576)[..., 512:]
    ckv, kpe = cache[..., :512], cache[..., 512:]
    qo_indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * q_len
    kv_indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * pages_each
    kv_indices = table.reshape(-1)
    for backend in args.backends.split(","):
        for views in (True, False):  # FlashInfer on views of the same memory, else on copies of them
            if flashinfer_row(flashinfer, backend, views, q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices,
                              lens, heads, page_size, q_len, q, cache, out, label, kv_bytes, ceiling, flops, base):
                break


def flashinfer_row(flashinfer, backend, views, q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, lens, heads,
                   page_size, q_len, q, cache, out, label, kv_bytes, ceiling, flops, base) -> bool:
    if not views:
        q_nope, q_pe, ckv, kpe = (t.contiguous() for t in (q_nope, q_pe, ckv, kpe))
        label += " (contiguous copies)"
    try:
        workspace = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend=backend)
        started = time.perf_counter()
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, lens, heads, 512, 64, page_size, q_len > 1, SCALE,
                     q.dtype, cache.dtype)
        theirs = wrapper.run(q_nope, q_pe, ckv, kpe)
        torch.cuda.synchronize()
        print(f"flashinfer {backend} plan + first run (its JIT): {time.perf_counter() - started:.1f} s", flush=True)
        diff = (theirs.view_as(out).float() - out.float()).norm() / out.float().norm()
        print(f"check flashinfer {backend} {label} vs astrai-jit: rel norm {diff.item():.2e}", flush=True)
        theirs_out = torch.empty_like(q_nope)
        row(f"mla_decode flashinfer {backend} {label}",
            timed(lambda: wrapper.run(q_nope, q_pe, ckv, kpe, out=theirs_out)), kv_bytes, ceiling, flops, base[0])
        return True
    except Exception as error:  # noqa: BLE001 - report and go on with the other rows
        print(f"flashinfer {backend} {label} failed: {error!r}", flush=True)
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="fa3,fa2", help="FlashInfer MLA backends to run, comma-separated")
    parser.add_argument("--no-flashinfer", action="store_true")
    parser.add_argument("--fp8", action="store_true", help="also the e4m3 cache rows (astrai-jit alone)")
    args = parser.parse_args()
    import astrai_jit

    flashinfer = optional_flashinfer(args.no_flashinfer, "mla")
    print(f"device {torch.cuda.get_device_name()}", flush=True)
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    copy = timed(lambda: dst.copy_(src), calls=5)
    ceiling = 2 * src.numel() * 2 / copy[0] / 1e6
    print(f"copy ceiling {ceiling:.2f} TB/s", flush=True)
    del src, dst
    for shape in SHAPES:
        case(*shape, False, args, astrai_jit, flashinfer, ceiling)
    if args.fp8:
        for shape in SHAPES:
            case(*shape, True, args, astrai_jit, flashinfer, ceiling)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
