"""The datasheet floor under a kernel's time (runners.kernels.peaks): it
lets through the fastest honest results the H200 measured, and refuses
what is faster than the device could be."""

from __future__ import annotations

import pytest

from runners import kernels
from runners.kernels import peaks


def _measured_ms(operator, shape, dtype, gbps=None, tflops=None):
    if gbps:
        return operator.bytes_moved(shape, dtype) / (gbps * 1e9) * 1e3
    return operator.flops(shape) / (tflops * 1e12) * 1e3


# The H200's fastest results in docs/evidence: a decode gemm at 4,424 GB/s
# (92% of the datasheet) and a square one at 831 TFLOP/s (84%).
@pytest.mark.parametrize(
    ("shape", "dtype", "gbps", "tflops"),
    [
        ({"M": 1, "N": 152064, "K": 3584}, "bfloat16", 4424.5, None),
        ({"M": 4096, "N": 4096, "K": 14336}, "bfloat16", None, 831.4),
    ],
)
def test_the_h200s_fastest_honest_results_are_possible(shape, dtype, gbps, tflops):
    gemm = kernels.get("gemm")
    peak = peaks.device_peak("H200", "cuda")
    measured = _measured_ms(gemm, shape, dtype, gbps, tflops)

    assert (
        peaks.implausible(
            operator=gemm, shape=shape, dtype=dtype, kernel_ms=measured, peak=peak
        )
        is None
    )
    # Twice as fast would beat the datasheet.
    why = peaks.implausible(
        operator=gemm, shape=shape, dtype=dtype, kernel_ms=measured / 2, peak=peak
    )
    assert why and "NVIDIA H200 SXM" in why


def test_a_model_no_datasheet_names_gets_its_backends_ceiling():
    assert peaks.device_peak("H100 80GB HBM3", "cuda").name == "NVIDIA H100 SXM"
    assert peaks.device_peak("RTX 9090", "cuda").name == "the fastest CUDA device"
    assert peaks.device_peak("x86-64", "c").name == "a CPU host"
    assert peaks.device_peak("thing", "fpga") is None
