"""Time a callable the way the GPU notes say: warm up, then take the median.

CPU: wall clock per call. GPU: CUDA events per call, each call on the next of
several copies of its inputs so that together they exceed L2 and no call reads
inputs the previous one left cached.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

L2_ROTATION_BYTES = 60 * 2**20
MAX_ROTATION_SETS = 64
MAX_ROTATION_BYTES = 4 * 2**30
GPU_TIMED_BUDGET_MS = 200.0
MIN_GPU_REPEATS = 10


def median_ms(samples_s: Sequence[float]) -> float:
    return statistics.median(samples_s) * 1e3


def rotation_sets(input_bytes: int) -> int:
    """How many copies of the inputs make the rotation exceed L2."""
    if input_bytes <= 0:
        return 1
    wanted = math.ceil(2 * L2_ROTATION_BYTES / input_bytes)
    affordable = max(1, MAX_ROTATION_BYTES // input_bytes)
    return max(1, min(wanted, MAX_ROTATION_SETS, affordable))


def time_cpu(fn: Callable[[int], object], *, repeats: int, warmup: int = 1) -> float:
    """Median wall-clock milliseconds of ``fn(i)`` over ``repeats`` calls,
    with torch on one thread, as the TileLang ``c`` kernels run: on a busy
    host, waking torch's other threads took 12-47 ms for a call of a few
    microseconds, which made the kernel look tens of times faster than the
    reference."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(warmup):
            fn(i)
        samples = []
        for i in range(repeats):
            start = time.perf_counter()
            fn(i)
            samples.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return median_ms(samples)


def time_gpu(fn: Callable[[int], object], *, repeats: int, warmup: int = 10) -> float:
    """Median milliseconds of ``fn(i)`` by CUDA events, after ``warmup`` calls.

    ``fn(i)`` is expected to pick its i-th rotated input set. Long kernels
    take fewer than ``repeats`` samples (no fewer than MIN_GPU_REPEATS): about
    GPU_TIMED_BUDGET_MS of timed calls is as steady a median as more.
    """
    import torch

    started, warmed = (
        torch.cuda.Event(enable_timing=True),
        torch.cuda.Event(enable_timing=True),
    )
    started.record()
    for i in range(warmup):
        fn(i)
    warmed.record()
    torch.cuda.synchronize()
    if warmup:
        per_call_ms = max(started.elapsed_time(warmed) / warmup, 1e-6)
        affordable = math.ceil(GPU_TIMED_BUDGET_MS / per_call_ms)
        repeats = max(min(repeats, MIN_GPU_REPEATS), min(repeats, affordable))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(repeats)
    ]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(warmup + i)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def throughput(*, flops: int, bytes_moved: int, kernel_ms: float | None) -> dict:
    """TFLOP/s and GB/s from the operator's counts and the kernel's median."""
    if not kernel_ms or kernel_ms <= 0:
        return {"tflops": None, "gbps": None}
    seconds = kernel_ms / 1e3
    return {
        "tflops": flops / seconds / 1e12 if flops else None,
        "gbps": bytes_moved / seconds / 1e9 if bytes_moved else None,
    }
