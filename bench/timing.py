"""What the Python side-by-side benchmarks share: CUDA-event timing, and FlashInfer as an optional
peer."""
import importlib
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


def optional_flashinfer(skip: bool, *submodules: str):
    """FlashInfer with the named submodules imported, or None when skipped or not importable (the
    peer is optional: astrai-jit's rows still run). Says which, with its version."""
    if skip:
        return None
    try:
        module = importlib.import_module("flashinfer")
        for name in submodules:
            importlib.import_module(f"flashinfer.{name}")
    except Exception as error:  # noqa: BLE001 (any failure of the peer's import leaves it out)
        print(f"flashinfer not importable: {error!r}", flush=True)
        return None
    print(f"flashinfer {module.__version__}", flush=True)
    return module
