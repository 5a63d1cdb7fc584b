"""Helpers the operator modules share: the TileLang dialect per backend,
tolerance presets and tile-size arithmetic.

TileLang 0.1.15 splits its language into dialects: ``tilelang.language`` is
the CUDA one, and ``T.Kernel(..., threads=)`` does not exist for the CPU. A
builder asks ``language(target)`` for the module matching its target.
"""

from __future__ import annotations

import importlib

from .base import Tolerance

_DIALECTS = {
    "cuda": "tilelang.language",
    "hip": "tilelang.rocm.language",
    "metal": "tilelang.metal.language",
    "c": "tilelang.cpu.language",
}

GPU_BACKENDS = ("cuda", "hip", "metal")
GPU_DTYPES = ("float16", "bfloat16", "float32")
HALF_DTYPES = ("float16", "bfloat16")
METAL_DTYPES = ("float16", "float32")  # Metal has no bfloat16 arithmetic
CPU_DTYPES = ("float32",)

LOG2E = 1.4426950408889634

# CUDA's exp2f (without --use_fast_math) wraps the hardware ex2 in a compare
# and two predicated multiplies that keep subnormal results: three extra
# instructions for every score attention exponentiates. The flush-to-zero
# form below is the bare instruction; a softmax weight under 2^-126 rounds to
# zero in fp16 and bf16 anyway. Kernels that call it import the source.
FAST_EXP2 = "tm_exp2_ftz"
FAST_EXP2_SOURCE = r"""
__device__ __forceinline__ float tm_exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""


def language(target: dict):
    """The TileLang language module for the target's backend (imported lazily
    so an operator module imports without TileLang installed)."""
    return importlib.import_module(_DIALECTS[target["kind"]])


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def element_size(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


# One rounding of the output dominates operators that compute in float32 and
# store once: fp16 keeps 11 significant bits (2^-11 ~ 4.9e-4), bf16 keeps 8
# (2^-8 ~ 3.9e-3). The bounds below allow about twice that, and a few ulps
# for float32 where libm exp/rsqrt and summation order differ from torch.
ROUNDED_ONCE = {
    "float16": Tolerance(
        rel_err=1e-3,
        atol=1e-3,
        rtol=2e-3,
        max_mismatch_ratio=1e-4,
        reason="float32 math, one fp16 rounding of the output (2^-11 relative)",
    ),
    "bfloat16": Tolerance(
        rel_err=8e-3,
        atol=8e-3,
        rtol=1.6e-2,
        max_mismatch_ratio=1e-4,
        reason="float32 math, one bf16 rounding of the output (2^-8 relative)",
    ),
    "float32": Tolerance(
        rel_err=1e-5,
        atol=1e-5,
        rtol=1e-4,
        max_mismatch_ratio=0.0,
        reason="float32 end to end; only summation order and libm ulps differ",
    ),
}


def resident_row_tile(shape: dict, per_thread: int = 16) -> tuple[int, int, int]:
    """(rows per block, padded row width, threads) for a row-wise kernel that
    holds whole rows in registers: about ``per_thread`` float32 values per
    thread, enough loads in flight without spilling the row out of
    registers."""
    width = max(32, next_pow2(shape["N"]))
    block_m = clamp(2048 // width, 1, next_pow2(shape["M"]))
    threads = clamp(block_m * width // per_thread, 64, 512)
    return block_m, width, threads
