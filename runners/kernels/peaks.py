"""What a device can do at most, from its datasheet: the floor under any
honest kernel time.

A kernel must move at least its operator's bytes and do its flops, so it
takes at least ``bytes / peak bandwidth`` and ``flops / peak rate``. A
result faster than that skipped work or lied about its time: it is refused
as implausible, by the harness and again at ingest, whichever runner sent
it. The peaks are the datasheets' best figures (SXM parts, dense tensor
cores, TF32 for float32), so the guard never refuses a kernel that did its
work: the H200's fastest results in docs/evidence reached 92% of its
bandwidth and 84% of its rate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    name: str
    memory_gbps: float
    tflops: dict[str, float]  # dtype -> dense peak, TFLOP/s

    def fastest_ms(self, *, flops: int, bytes_moved: int, dtype: str) -> float:
        """The least time, in ms, in which this device can do the work."""
        rate = self.tflops.get(dtype, max(self.tflops.values()))
        return max(bytes_moved / (self.memory_gbps * 1e9), flops / (rate * 1e12)) * 1e3


def _peak(name: str, gbps: float, half: float, single: float) -> Peak:
    return Peak(name, gbps, {"float16": half, "bfloat16": half, "float32": single})


# Matched by the device type's model name, first match wins.
DATASHEETS = (
    ("H200", _peak("NVIDIA H200 SXM", 4800, 989.5, 494.7)),
    ("H100", _peak("NVIDIA H100 SXM", 3350, 989.4, 494.7)),
    ("B200", _peak("NVIDIA B200", 8000, 2250, 1100)),
    ("A100", _peak("NVIDIA A100 SXM 80GB", 2039, 312, 156)),
    ("L40S", _peak("NVIDIA L40S", 864, 362, 183)),
    ("MI300X", _peak("AMD MI300X", 5300, 1307.4, 653.7)),
    ("MI325X", _peak("AMD MI325X", 6000, 1307.4, 653.7)),
    ("M3", _peak("Apple M3 Max", 400, 28.4, 14.2)),
)
# A model no datasheet names still has a ceiling: the fastest part of its
# backend, so that only what no such device can do is refused.
BACKEND_CEILINGS = {
    "cuda": _peak("the fastest CUDA device", 8000, 2250, 1100),
    "hip": _peak("the fastest ROCm device", 6000, 1307.4, 653.7),
    "metal": _peak("the fastest Apple GPU", 800, 56.8, 28.4),
    # One CPU host, caches included (a small cell runs from L1).
    "c": _peak("a CPU host", 2000, 20, 20),
    "npu": _peak("the fastest NPU", 8000, 2250, 1100),
}


def device_peak(model: str, backend: str) -> Peak | None:
    for needle, peak in DATASHEETS:
        if needle.lower() in model.lower():
            return peak
    return BACKEND_CEILINGS.get(backend)


def implausible(
    *, operator, shape: dict, dtype: str, kernel_ms: float, peak: Peak
) -> str | None:
    """Why ``kernel_ms`` is faster than ``peak`` allows, or None."""
    flops = operator.flops(shape)
    bytes_moved = operator.bytes_moved(shape, dtype)
    fastest = peak.fastest_ms(flops=flops, bytes_moved=bytes_moved, dtype=dtype)
    if kernel_ms >= fastest:
        return None
    seconds = kernel_ms / 1e3
    return (
        f"{kernel_ms:.3g} ms is faster than {peak.name} can do it "
        f"({fastest:.3g} ms at least): it would move {bytes_moved / seconds / 1e9:.3g}"
        f" GB/s against a peak of {peak.memory_gbps:g} GB/s and compute "
        f"{flops / seconds / 1e12:.3g} TFLOP/s against "
        f"{peak.tflops.get(dtype, max(peak.tflops.values())):g}"
    )
