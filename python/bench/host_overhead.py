"""Host time per eager paged_decode call from Python (a benchmark, not a test; needs a GPU).

Times, in one process and on one shape: the public call (argument handling, stream lookup,
DLPack import of every tensor, the runtime call), the extension call alone, and a torch
no-op of similar arity for scale. Each figure is the mean over --calls calls, the GPU kept
busy enough that host time is what is measured. The C++ call's own host time is astrai-bench's
`host_overhead` case.

    python python/bench/host_overhead.py [--calls 20000]
"""
import argparse
import time

import torch

import astrai_jit


def per_call_us(fn, calls):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.arange(64, device="cuda", dtype=torch.int32).view(1, 64)
    lens = torch.full((1,), 512, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    stream = torch.cuda.current_stream().cuda_stream
    public = per_call_us(lambda: astrai_jit.paged_decode(q, kc, vc, table, lens, out=out), args.calls)
    raw = per_call_us(lambda: astrai_jit._C.paged_decode(q, kc, vc, table, lens, out, None, None, None, None,
                                                         None, 0.0, stream), args.calls)
    add = per_call_us(lambda: torch.add(q, q, out=out), args.calls)
    print(f"paged_decode, public Python call: {public:.2f} us per call")
    print(f"paged_decode, extension call:     {raw:.2f} us per call")
    print(f"torch.add(out=) for scale:        {add:.2f} us per call")


if __name__ == "__main__":
    main()
