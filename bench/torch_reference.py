"""PyTorch's own attention kernels (cuDNN, FlashAttention-2) on the shapes of the sm_90 prefill
rows and of the decode rows, timed like astrai-sm90-check (median of CUDA-event timings after a
warm-up), so that the ratios are read from one run on one GPU. Prints one TIME line per case and
backend. Decode is SDPA over a contiguous [B, H, L, D] cache with grouped KV heads
(enable_gqa), one query token: the reference for issue 9's paged-decode targets; its TB/s
counts the K and V bytes, as astrai-bench does.

    python3 bench/torch_reference.py [--filter REGEX] [--reps N] [--sustained SECONDS]

--filter keeps the cases whose TIME label matches (e.g. 'cudnn prefill hd128 B2'); --reps 1
with a filter launches one kernel after the warm-up, for a profiler. --sustained S also prints a
SUSTAINED line per case: the mean time a call over S seconds of back-to-back calls, as
astrai-sm90-check --sustained measures it (the GPU then runs at its power cap)."""
import argparse
import re
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from reference_labels import decode_label, prefill_label


def median_ms(fn, reps=20):
    fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def sustained_ms(fn, seconds):
    """Mean time a call over `seconds` of back-to-back calls (batches of 20, synchronized)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    calls = 0
    while True:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        calls += 20
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed * 1e3 / calls


BACKENDS = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash2", SDPBackend.FLASH_ATTENTION))


def time_sdpa(pattern, label, backend, run, reps, rate, sustained=0.0):
    """Prints `TIME label: rate(ms)` (and `SUSTAINED label: ...` when `sustained` > 0) for one SDPA
    backend when the label matches the filter; a backend that refuses the shape prints SKIP and the
    rest still run."""
    if not pattern.search(label):
        return
    try:
        with sdpa_kernel([backend]):
            ms = median_ms(run, reps)
            print(f"TIME {label}: {rate(ms)}", flush=True)
            if sustained > 0:
                print(f"SUSTAINED {label}: {rate(sustained_ms(run, sustained))} over {sustained:g} s", flush=True)
    except Exception as error:
        print(f"SKIP {label}: {str(error).splitlines()[0][:160]}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--filter", default="", help="regex over the case labels")
    parser.add_argument("--reps", type=int, default=20, help="timed runs per case (median)")
    parser.add_argument("--sustained", type=float, default=0.0,
                        help="also time each case over this many seconds of back-to-back calls")
    args = parser.parse_args()
    pattern = re.compile(args.filter)
    torch.manual_seed(0)
    # (head_dim, batch, length, causal, heads, kv_heads): the sm_90 rows, then AstrAI's own heads on
    # short prompts (astrai-bench's prefill/hd64.h24kv4.causal.B16x1024).
    cases = [(128, 4, 4096, False, 32, 8), (128, 2, 8192, True, 32, 8), (64, 2, 8192, True, 32, 8),
             (256, 2, 8192, True, 32, 8), (64, 16, 1024, True, 24, 4)]
    for head_dim, batch, length, causal, heads, kv_heads in cases:
        # [B, L, H, D] storage viewed as [B, H, L, D], as a serving engine holds it.
        q = torch.rand(batch, length, heads, head_dim, device="cuda", dtype=torch.bfloat16).sub_(0.5).transpose(1, 2)
        k = torch.rand(batch, length, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16).sub_(0.5)
        v = torch.rand_like(k).sub_(0.5)
        # Expanded to every query head (the FLOPs are the same; cuDNN's GQA support varies).
        k = k.repeat_interleave(heads // kv_heads, dim=2).transpose(1, 2)
        v = v.repeat_interleave(heads // kv_heads, dim=2).transpose(1, 2)
        flops = 4.0 * batch * heads * length * length * head_dim * (0.5 if causal else 1.0)
        for name, backend in BACKENDS:
            time_sdpa(pattern, prefill_label(name, head_dim, batch, length, causal, heads, kv_heads), backend,
                      lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), args.reps,
                      lambda ms: f"{ms:.3f} ms {flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s", args.sustained)
        del q, k, v
    # Decode: (head_dim, heads, kv_heads, batch, length); each call reads 2 x B x Hkv x L x D x 2 bytes.
    decode_cases = [(128, 32, 8, 64, 8192), (128, 32, 8, 16, 32768), (128, 32, 8, 32, 4096), (64, 24, 4, 32, 4096)]
    for head_dim, heads, kv_heads, batch, length in decode_cases:
        q = torch.rand(batch, heads, 1, head_dim, device="cuda", dtype=torch.bfloat16).sub_(0.5)
        k = torch.rand(batch, kv_heads, length, head_dim, device="cuda", dtype=torch.bfloat16).sub_(0.5)
        v = torch.rand_like(k).sub_(0.5)
        kv_bytes = 2.0 * k.numel() * k.element_size()
        for name, backend in BACKENDS:
            time_sdpa(pattern, decode_label(name, head_dim, heads, kv_heads, batch, length), backend,
                      lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True), args.reps,
                      lambda ms: f"{ms * 1e3:.1f} us {kv_bytes / (ms * 1e-3) / 1e12:.2f} TB/s", args.sustained)
        del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
