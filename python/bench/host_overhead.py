"""Host time per eager paged_decode call from Python (a benchmark, not a test; needs a GPU).

Times, in one process and on one shape: the public call (argument handling, stream lookup,
DLPack import of every tensor, the runtime call), the extension call alone, the C++ call
alone (Runtime::paged_decode in a C++ loop over arguments built once), and torch.add(out=)
for scale. Each figure is the mean host time over --calls back-to-back calls.

    python python/bench/host_overhead.py [--calls 256] [--reps 50]
"""
import argparse
import statistics
import time

import torch

import astrai_jit


def per_call_us(fn, calls, reps):
    # Bursts shorter than the launch queue, so the host never waits for the GPU; the median
    # burst is reported.
    for _ in range(calls):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=256, help="calls per burst (below the launch queue)")
    parser.add_argument("--reps", type=int, default=50, help="bursts")
    args = parser.parse_args()
    q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.arange(64, device="cuda", dtype=torch.int32).view(1, 64)
    lens = torch.full((1,), 512, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    stream = torch.cuda.current_stream().cuda_stream
    public = per_call_us(lambda: astrai_jit.paged_decode(q, kc, vc, table, lens, out=out), args.calls, args.reps)
    raw = per_call_us(lambda: astrai_jit._C.paged_decode(q, kc, vc, table, lens, out, None, None, None, None,
                                                         None, 0.0, stream), args.calls, args.reps)
    bursts = []
    for _ in range(args.reps):
        torch.cuda.synchronize()
        bursts.append(astrai_jit._C._time_paged_decode_calls(q, kc, vc, table, lens, out, 0.0, stream, args.calls))
    torch.cuda.synchronize()
    cpp = statistics.median(bursts)
    add = per_call_us(lambda: torch.add(q, q, out=out), args.calls, args.reps)
    print(f"paged_decode, public Python call: {public:.2f} us per call")
    print(f"paged_decode, extension call:     {raw:.2f} us per call")
    print(f"paged_decode, C++ call:           {cpp:.2f} us per call")
    print(f"Python over C++:                  {public - cpp:.2f} us per call")
    print(f"torch.add(out=) for scale:        {add:.2f} us per call")


if __name__ == "__main__":
    main()
