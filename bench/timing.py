"""CUDA-event timing shared by the Python side-by-side benchmarks."""
import torch


def time_call(fn, burst: int) -> float:
    """Mean microseconds per call of `burst` back-to-back calls of fn, between two CUDA events."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(burst):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1000.0 / burst
