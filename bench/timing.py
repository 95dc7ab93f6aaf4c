"""CUDA-event timing shared by the Python side-by-side benchmarks."""
import statistics

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


def timed(fn, calls: int = 20, windows: int = 7):
    """Median, min and max microseconds per call over `windows` bursts of `calls`, after a warm-up call."""
    fn()
    torch.cuda.synchronize()
    per_call = [time_call(fn, calls) for _ in range(windows)]
    return statistics.median(per_call), min(per_call), max(per_call)
