"""Host time per eager paged_decode call from Python (a benchmark, not a test).

On a GPU, times in one process and on one shape: the public call (argument handling, stream
lookup, tensor import, the runtime call), the extension call alone, the C++ call alone
(Runtime::paged_decode in a C++ loop over arguments built once), and torch.add(out=) for scale.
Each figure is the median over --reps bursts of the mean host time of --calls back-to-back calls.

With --cpu (no GPU needed) the extension runs in its benchmark mode: every argument is checked
and converted as usual, on CPU tensors, and nothing launches. The public and extension figures
are then the Python host path alone, i.e. the overhead over the C++ call (less the CUDA device
and stream queries, which CPU tensors skip), timed in the thread's CPU time, fastest burst.

    python python/bench/host_overhead.py [--calls 256] [--reps 50] [--cpu]
"""
import argparse
import statistics
import time

import torch

import astrai_jit


def per_call_us(fn, calls, reps, sync, clock=time.perf_counter, pick=statistics.median):
    # Bursts shorter than the launch queue, so the host never waits for the GPU; the median
    # burst is reported (the fastest one in --cpu mode).
    for _ in range(calls):
        fn()
    times = []
    for _ in range(reps):
        sync()
        start = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - start) / calls * 1e6)
    sync()
    return pick(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=256, help="calls per burst (below the launch queue)")
    parser.add_argument("--reps", type=int, default=50, help="bursts")
    parser.add_argument("--cpu", action="store_true", help="time the host path on CPU tensors, launching nothing")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    sync = (lambda: None) if args.cpu else torch.cuda.synchronize
    # Nothing runs asynchronously on the CPU, so the thread's CPU time is the host time there, and
    # other processes on a shared machine disturb it less than the wall clock.
    clock = time.thread_time if args.cpu else time.perf_counter
    pick = min if args.cpu else statistics.median
    q = torch.randn(1, 32, 128, device=device, dtype=torch.bfloat16)
    kc = torch.randn(64, 16, 8, 128, device=device, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.arange(64, device=device, dtype=torch.int32).view(1, 64)
    lens = torch.full((1,), 512, device=device, dtype=torch.int32)
    out = torch.empty_like(q)
    stream = 0 if args.cpu else torch.cuda.current_stream().cuda_stream
    astrai_jit._C._set_host_only(args.cpu)
    try:
        public = per_call_us(lambda: astrai_jit.paged_decode(q, kc, vc, table, lens, out=out), args.calls,
                             args.reps, sync, clock, pick)
        # The options pack as the public call builds it (scale, logit_cap, sinks, window_left,
        # k_scale, v_scale, alibi_slopes: _library._PACKED_OPTIONS).
        raw = per_call_us(lambda: astrai_jit._C.paged_decode(q, kc, vc, table, lens, out, None, None, None, None,
                                                             None, (0.0, 0.0, None, -1, None, None, None), stream),
                          args.calls, args.reps, sync, clock, pick)
    finally:
        astrai_jit._C._set_host_only(False)
    print(f"paged_decode, public Python call: {public:.2f} us per call")
    print(f"paged_decode, extension call:     {raw:.2f} us per call")
    if args.cpu:
        print("(CPU benchmark mode: nothing launches, so these are the host path over the C++ call)")
        return
    bursts = []
    for _ in range(args.reps):
        torch.cuda.synchronize()
        bursts.append(astrai_jit._C._time_paged_decode_calls(q, kc, vc, table, lens, out, 0.0, stream, args.calls))
    torch.cuda.synchronize()
    cpp = statistics.median(bursts)
    add = per_call_us(lambda: torch.add(q, q, out=out), args.calls, args.reps, sync)
    print(f"paged_decode, C++ call:           {cpp:.2f} us per call")
    print(f"Python over C++:                  {public - cpp:.2f} us per call")
    print(f"torch.add(out=) for scale:        {add:.2f} us per call")


if __name__ == "__main__":
    main()
