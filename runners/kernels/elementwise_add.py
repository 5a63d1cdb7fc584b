"""elementwise_add: C[M, N] = A[M, N] + B[M, N].

Memory bound: 3 tensors cross HBM once. The GPU kernel moves 4096-element
tiles (16 per thread) through registers so every access is a wide vector
load; ragged edges are zero-filled on load and guarded on store by
TileLang's copy legalization.
"""

from __future__ import annotations

from .base import Operator, TensorSpec
from .common import (
    CPU_DTYPES,
    GPU_DTYPES,
    METAL_DTYPES,
    ROUNDED_ONCE,
    clamp,
    element_size,
    language,
    next_pow2,
)

THREADS = 256
TILE_ELEMENTS = 4096


def _tile(shape: dict) -> tuple[int, int]:
    block_n = clamp(next_pow2(shape["N"]), 32, 1024)
    block_m = clamp(TILE_ELEMENTS // block_n, 1, next_pow2(shape["M"]))
    return block_m, block_n


def build_gpu(shape: dict, dtype: str, target: dict):
    T = language(target)
    M, N = shape["M"], shape["N"]
    block_m, block_n = _tile(shape)

    @T.prim_func
    def elementwise_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(
            T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=THREADS
        ) as (
            bx,
            by,
        ):
            a = T.alloc_fragment((block_m, block_n), dtype)
            b = T.alloc_fragment((block_m, block_n), dtype)
            c = T.alloc_fragment((block_m, block_n), dtype)
            T.copy(A[by * block_m, bx * block_n], a)
            T.copy(B[by * block_m, bx * block_n], b)
            for i, j in T.Parallel(block_m, block_n):
                c[i, j] = a[i, j] + b[i, j]
            T.copy(c, C[by * block_m, bx * block_n])

    return elementwise_add


def build_c(shape: dict, dtype: str, target: dict):
    T = language(target)
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def elementwise_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as row:
            for j in T.serial(N):
                # The cast keeps ``dtype`` in the body: TileLang resolves the
                # (string) annotations against the names the body closes over.
                C[row, j] = T.cast(A[row, j] + B[row, j], dtype)

    return elementwise_add


def _inputs(shape: dict, dtype: str) -> list[TensorSpec]:
    dims = (shape["M"], shape["N"])
    return [TensorSpec("A", dims, dtype), TensorSpec("B", dims, dtype)]


def _outputs(shape: dict, dtype: str) -> list[TensorSpec]:
    return [TensorSpec("C", (shape["M"], shape["N"]), dtype)]


def _reference(a, b):
    return [a + b]


OPERATOR = Operator(
    name="elementwise_add",
    dims=("M", "N"),
    dtypes={
        "cuda": GPU_DTYPES,
        "hip": GPU_DTYPES,
        "metal": METAL_DTYPES,
        "c": CPU_DTYPES,
    },
    builders={"cuda": build_gpu, "hip": build_gpu, "metal": build_gpu, "c": build_c},
    inputs=_inputs,
    outputs=_outputs,
    reference=_reference,
    flops=lambda s: s["M"] * s["N"],
    bytes_moved=lambda s, dt: 3 * s["M"] * s["N"] * element_size(dt),
    tolerances=ROUNDED_ONCE,
    description="C = A + B, element by element",
    default_shape={"M": 4096, "N": 4096},
)
