"""Time a callable the way the GPU notes say: warm up, then take the samples.

CPU: wall clock per call. GPU: CUDA events, each call on the next of several
copies of its inputs so that together they exceed L2 and no call reads inputs
the previous one left cached; calls of decode size as CUDA-graph replays.

Each function returns the per-call samples in milliseconds: the result keeps
their median and a few of them (``kept``), which the gate's speed verdict
tests (matrix/gate/significance.py).
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
# A CPU kernel of a few microseconds, timed 5 times, read 2.8x slower on one
# toolchain than another while another process took the core: short calls
# are timed until about this much time is spent, up to CPU_MAX_REPEATS.
CPU_TIMED_BUDGET_MS = 20.0
CPU_MAX_REPEATS = 1000
MIN_GPU_REPEATS = 10
# A call shorter than this is timed as CUDA-graph replays (see time_gpu).
GRAPH_BELOW_MS = 1.0
GRAPH_REPLAY_MS = 2.0
GRAPH_REPLAYS = 10
MAX_GRAPH_CALLS = 4096
# How many samples a result keeps: enough for a rank test to tell a 3%
# change from noise, few enough that a result row stays small.
SAMPLES_KEPT = 32
# Before timed GPU work the stream is given this much of a spin kernel, so
# that the host has queued every timed call before the first starts: a host
# descheduled between recording the start event and launching the call
# (another child compiling on every core) is otherwise timed as the kernel.
QUEUE_AHEAD_MS = 5.0


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def kept(samples_ms: Sequence[float]) -> list[float]:
    """At most SAMPLES_KEPT samples, in the order taken: each the median of
    a run of consecutive calls where there were more, rounded to six
    significant digits. Medians of batches keep the spread between batches
    (a host that slowed half-way shows) without one stalled call's tail."""
    samples = list(samples_ms)
    if len(samples) > SAMPLES_KEPT:
        size = len(samples) / SAMPLES_KEPT
        samples = [
            statistics.median(samples[round(i * size) : round((i + 1) * size)])
            for i in range(SAMPLES_KEPT)
        ]
    return [float(f"{s:.6g}") for s in samples]


def rotation_sets(input_bytes: int) -> int:
    """How many copies of the inputs make the rotation exceed L2."""
    if input_bytes <= 0:
        return 1
    wanted = math.ceil(2 * L2_ROTATION_BYTES / input_bytes)
    affordable = max(1, MAX_ROTATION_BYTES // input_bytes)
    return max(1, min(wanted, MAX_ROTATION_SETS, affordable))


def time_cpu(
    fn: Callable[[int], object],
    *,
    repeats: int,
    warmup: int = 1,
    prepare: Callable[[], object] | None = None,
) -> list[float]:
    """Wall-clock milliseconds of each of ``repeats`` calls of ``fn(i)``,
    or more for short calls (about CPU_TIMED_BUDGET_MS of them), with torch
    on one thread, as the TileLang ``c`` kernels run: on a busy
    host, waking torch's other threads took 12-47 ms for a call of a few
    microseconds, which made the kernel look tens of times faster than the
    reference. ``prepare``, when given, runs before every call, outside the
    time taken."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(warmup):
            fn(i)
        samples, spent_s = [], 0.0
        while len(samples) < repeats or (
            len(samples) < CPU_MAX_REPEATS and spent_s * 1e3 < CPU_TIMED_BUDGET_MS
        ):
            if prepare is not None:
                prepare()
            start = time.perf_counter()
            fn(len(samples))
            samples.append(time.perf_counter() - start)
            spent_s += samples[-1]
    finally:
        torch.set_num_threads(threads)
    return [s * 1e3 for s in samples]


def time_gpu(
    fn: Callable[..., object],
    input_sets: Sequence[Sequence[object]],
    *,
    repeats: int,
    warmup: int = 10,
) -> list[float]:
    """Milliseconds of each timed call of ``fn``, each call on the next of the
    rotated ``input_sets``, after ``warmup`` calls.

    A call shorter than GRAPH_BELOW_MS is timed as replays of a CUDA graph of
    many calls, as a serving engine replays its decode step: timed one by one
    with events, such a call measures mostly the host's launch, which the
    H200's repeats put at 0.27-0.34 of a decode call's time. Longer calls,
    and calls a graph cannot capture, are timed one by one with events; long
    kernels take fewer than ``repeats`` samples (no fewer than
    MIN_GPU_REPEATS): about GPU_TIMED_BUDGET_MS of timed calls is as steady a
    median as more.
    """
    import torch

    def call(i: int) -> object:
        return fn(*input_sets[i % len(input_sets)])

    # One call before the warm-up is timed: a library's first call in a
    # dtype loads its kernels (the reference was validated in float64), and
    # on the H200 that made a 6 µs matmul's warm-up read as milliseconds, so
    # it was timed call by call, launch and all, in one child and as a graph
    # in the next.
    call(0)
    torch.cuda.synchronize()
    started, warmed = (
        torch.cuda.Event(enable_timing=True),
        torch.cuda.Event(enable_timing=True),
    )
    started.record()
    for i in range(warmup):
        call(i)
    warmed.record()
    torch.cuda.synchronize()
    if warmup:
        per_call_ms = max(started.elapsed_time(warmed) / warmup, 1e-6)
        if per_call_ms < GRAPH_BELOW_MS:
            calls = graph_calls(per_call_ms, len(input_sets))
            graph = graphed(fn, input_sets, calls)
            if graph is not None:
                return time_graph(graph, calls)
        affordable = math.ceil(GPU_TIMED_BUDGET_MS / per_call_ms)
        repeats = max(min(repeats, MIN_GPU_REPEATS), min(repeats, affordable))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(repeats)
    ]
    queue_ahead(per_call_ms * repeats if warmup else GPU_TIMED_BUDGET_MS)
    for i, (start, end) in enumerate(events):
        start.record()
        call(warmup + i)
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def queue_ahead(timed_ms: float) -> None:
    """Keep the device busy while the host queues ``timed_ms`` of timed
    work (see QUEUE_AHEAD_MS)."""
    import torch

    spin_ms = min(QUEUE_AHEAD_MS, max(0.5, timed_ms / 4))
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    clock_hz = getattr(properties, "clock_rate", 0) * 1e3 or 2e9
    torch.cuda._sleep(int(spin_ms / 1e3 * clock_hz))


def graph_calls(per_call_ms: float, rotation: int) -> int:
    """How many calls make one replay last about GRAPH_REPLAY_MS: whole
    passes through the rotation, at least one."""
    passes = max(1, round(GRAPH_REPLAY_MS / max(per_call_ms, 1e-4) / rotation))
    return min(passes * rotation, MAX_GRAPH_CALLS)


def graphed(fn: Callable[..., object], input_sets, calls: int):
    """A CUDA graph of ``calls`` calls of ``fn`` over the rotated input sets,
    or None where the call cannot be captured (a host sync, an allocation
    the capture refuses): it is then timed call by call."""
    import torch

    side = torch.cuda.Stream()
    before = torch.cuda.current_stream()
    side.wait_stream(before)
    try:
        # One call on a side stream first, as torch's capture notes ask, so
        # that lazy initialisation happens outside the capture.
        with torch.cuda.stream(side):
            fn(*input_sets[0])
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(*input_sets[i % len(input_sets)])
    except Exception:  # noqa: BLE001 - any refusal means: time call by call
        _capture_undo(before)
        return None
    return graph


def _capture_undo(stream) -> None:
    """Undo what a refused capture leaves behind. ``torch.cuda.graph`` ends
    the capture on the way out, and when that raises it neither restores
    the stream it made current nor lets torch's default CUDA generator
    leave capture mode: every later random draw on the device then fails
    ("Offset increment outside graph capture", seen on the H200). The
    generator gets a copy of its own seed and offset, out of capture."""
    import torch

    torch.cuda.set_stream(stream)
    torch.cuda.synchronize()
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    generator.graphsafe_set_state(generator.clone_state())


def time_graph(graph, calls: int, replays: int = GRAPH_REPLAYS) -> list[float]:
    """Milliseconds per call in each of ``replays`` replays of ``graph``."""
    import torch

    graph.replay()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(replays)
    ]
    queue_ahead(GRAPH_REPLAY_MS * replays)
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / calls for s, e in events]


def throughput(*, flops: int, bytes_moved: int, kernel_ms: float | None) -> dict:
    """TFLOP/s and GB/s from the operator's counts and the kernel's median."""
    if not kernel_ms or kernel_ms <= 0:
        return {"tflops": None, "gbps": None}
    seconds = kernel_ms / 1e3
    return {
        "tflops": flops / seconds / 1e12 if flops else None,
        "gbps": bytes_moved / seconds / 1e9 if bytes_moved else None,
    }
