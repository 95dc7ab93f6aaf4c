#!/usr/bin/env python3
"""FP8 attention prefill, astrai-jit beside FlashInfer's fa3 backend on the same tensors in one run.

    python bench/fp8_attention_side_by_side.py [--batch 2 --len 8192] [--no-flashinfer]

Rows (causal, 32/8 heads, head_dim 128, per-head scales, bf16 output), each ``batch`` prompts of
``len`` tokens:
- astrai-jit ``prefill`` on bf16 q, k and v (the 16-bit baseline);
- astrai-jit ``prefill`` on float8_e4m3fn q, k and v (FP8 attention, P in e4m3), and with
  ``p_dtype=torch.float16`` (P kept in f16);
- FlashInfer's ``single_prefill_with_kv_cache(..., backend="fa3")`` on the same e4m3 tensors and
  scales, one call a prompt (``batch`` calls a timed step).
TFLOP/s counts the causal scores and P V (2 x 2 x head_dim a query and key it sees). The outputs
are checked against a float32 reference from the dequantized inputs (one prompt's first 1024
queries, every key they see) before anything is timed. Timing: CUDA events around 20
back-to-back steps, median (min..max) of 7 windows after warm-up. FlashInfer's first call
compiles its kernels (minutes); MAX_JOBS bounds its nvcc jobs.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from timing import optional_flashinfer, timed  # bench/, the script's own directory

E4M3 = torch.float8_e4m3fn


def row(name: str, t, flops: float, base: float = 0.0) -> None:
    median, low, high = t
    text = f"{name:52s} {median:10.2f} us ({low:.2f}..{high:.2f})  {flops / median / 1e6:7.1f} TFLOP/s"
    if base:
        text += f"  {base / median:5.2f}x bf16"
    print(text, flush=True)


def quantize(x: torch.Tensor):
    """x [B, L, H, D] as e4m3 codes and per-head f32 scales (each head's largest |x| on 448)."""
    amax = x.abs().amax(dim=(0, 1, 3)).float()
    scales = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (x / scales[None, None, :, None]).to(E4M3), scales


def checked(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    diff = got.float() - want
    rel = (diff.norm() / want.norm()).item()
    print(f"check {name:44s} max abs {diff.abs().max().item():.3e}  rel norm {rel:.3e}", flush=True)
    if not rel < 0.05:
        raise SystemExit(f"{name}: relative error {rel:.3e} against the reference; nothing timed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--len", type=int, default=8192)
    parser.add_argument("--no-flashinfer", action="store_true")
    args = parser.parse_args()

    import astrai_jit

    flashinfer = optional_flashinfer(args.no_flashinfer)
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), flush=True)
    torch.manual_seed(0)

    batch, length, heads, kv_heads, hd = args.batch, args.len, 32, 8, 128
    q = torch.randn(batch, length, heads, hd, device=dev)
    k = torch.randn(batch, length, kv_heads, hd, device=dev)
    v = torch.randn(batch, length, kv_heads, hd, device=dev)
    (q8, qs), (k8, ks), (v8, vs) = quantize(q), quantize(k), quantize(v)
    q16, k16, v16 = (x.to(torch.bfloat16) for x in (q, k, v))
    flops = 4.0 * batch * heads * length * length * hd / 2

    # Reference: prompt 0's first rows against the dequantized inputs, in float32.
    rows = min(length, 1024)
    deq = lambda x8, s: x8[0, :rows].float() * s[None, :, None]  # noqa: E731
    qd, kd, vd = deq(q8, qs), deq(k8, ks), deq(v8, vs)
    kd, vd = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (kd, vd))
    scores = torch.einsum("qhd,khd->hqk", qd, kd) / math.sqrt(hd)
    scores.masked_fill_(torch.ones(rows, rows, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    want = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), vd)
    del scores

    fp8 = lambda p_dtype=None: astrai_jit.prefill(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs,  # noqa: E731
                                                  causal_offset=0, out_dtype=torch.bfloat16, p_dtype=p_dtype)
    checked("astrai-jit fp8 (P e4m3)", fp8()[0, :rows], want)
    checked("astrai-jit fp8 (P f16)", fp8(torch.float16)[0, :rows], want)
    label = f"hd128.h32kv8.causal.B{batch}x{length}"
    base = timed(lambda: astrai_jit.prefill(q16, k16, v16, causal_offset=0))
    row(f"prefill astrai-jit bf16 {label}", base, flops)
    row(f"prefill astrai-jit fp8 {label}", timed(fp8), flops, base[0])
    row(f"prefill astrai-jit fp8 p_f16 {label}", timed(lambda: fp8(torch.float16)), flops, base[0])

    if flashinfer is not None:
        try:
            started = time.perf_counter()
            theirs = lambda b: flashinfer.single_prefill_with_kv_cache(  # noqa: E731
                q8[b], k8[b], v8[b], scale_q=qs, scale_k=ks, scale_v=vs, o_dtype=torch.bfloat16, causal=True,
                backend="fa3")
            first = theirs(0)
            torch.cuda.synchronize()
            print(f"flashinfer fa3 fp8 first call (its JIT): {time.perf_counter() - started:.1f} s", flush=True)
            checked("flashinfer fa3 fp8", first[:rows], want)

            def step():
                for b in range(batch):
                    theirs(b)

            row(f"prefill flashinfer fa3 fp8 {label} ({batch} calls)", timed(step), flops, base[0])
        except Exception as error:
            print(f"flashinfer fa3 fp8 failed: {error!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
