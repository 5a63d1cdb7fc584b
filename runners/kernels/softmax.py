"""softmax: Y[M, N] = softmax of X over N, float32 math.

GPU, rows up to ``RESIDENT_MAX`` columns: a block holds whole rows in
registers, so X is read once and Y written once (the memory-bound minimum).
Longer rows (a vocabulary) stream in chunks: an online pass keeps the
running max and rescaled sum, a second pass re-reads the row (mostly from
L2) and writes it. Columns past N enter as -inf so they weigh zero.

Metal has no ``T.reduce_*`` lowering in TileLang 0.1.15, so its kernel gives
each thread one row and loops serially.
"""

from __future__ import annotations

from .base import Operator, TensorSpec
from .common import (
    CPU_DTYPES,
    GPU_DTYPES,
    LOG2E,
    METAL_DTYPES,
    ROUNDED_ONCE,
    element_size,
    language,
    resident_row_tile,
)

RESIDENT_MAX = 16384
# Streamed rows: 4096-column chunks over 128 threads (32 values each) ran
# 4096 x 128256 at 61% of the copy bandwidth on the H200, against 58% with
# 256 threads and 41-55% with 512-1024 (bench/kernel_tune.py).
CHUNK = 4096
STREAM_THREADS = 128
METAL_THREADS = 256


def build_gpu(shape: dict, dtype: str, target: dict, config: dict | None = None):
    """``config`` overrides ``per_thread`` (resident rows) or ``chunk`` and
    ``threads`` (streamed rows); ``bench/kernel_tune.py`` measures them."""
    if shape["N"] <= RESIDENT_MAX:
        return _build_resident(shape, dtype, target, **(config or {}))
    return _build_streaming(shape, dtype, target, **(config or {}))


def _build_resident(shape: dict, dtype: str, target: dict, per_thread: int = 16):
    T = language(target)
    M, N = shape["M"], shape["N"]
    block_m, width, threads = resident_row_tile(shape, per_thread)

    @T.prim_func
    def softmax(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            raw = T.alloc_fragment((block_m, width), dtype)
            x = T.alloc_fragment((block_m, width), "float32")
            row_max = T.alloc_fragment((block_m,), "float32")
            row_sum = T.alloc_fragment((block_m,), "float32")
            T.copy(X[bx * block_m, 0], raw)
            for i, j in T.Parallel(block_m, width):
                x[i, j] = T.if_then_else(
                    j < N, T.cast(raw[i, j], "float32"), -T.infinity("float32")
                )
            T.reduce_max(x, row_max, dim=1)
            for i, j in T.Parallel(block_m, width):
                x[i, j] = T.exp2((x[i, j] - row_max[i]) * LOG2E)
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(block_m, width):
                raw[i, j] = T.cast(x[i, j] / row_sum[i], dtype)
            T.copy(raw, Y[bx * block_m, 0])

    return softmax


def _build_streaming(
    shape: dict,
    dtype: str,
    target: dict,
    chunk: int = CHUNK,
    threads: int = STREAM_THREADS,
):
    T = language(target)
    M, N = shape["M"], shape["N"]
    chunks = -(-N // chunk)

    @T.prim_func
    def softmax(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M, threads=threads) as bx:
            raw = T.alloc_fragment((1, chunk), dtype)
            x = T.alloc_fragment((1, chunk), "float32")
            run_max = T.alloc_fragment((1,), "float32")
            run_sum = T.alloc_fragment((1,), "float32")
            chunk_max = T.alloc_fragment((1,), "float32")
            chunk_sum = T.alloc_fragment((1,), "float32")
            T.fill(run_max, -T.infinity("float32"))
            T.fill(run_sum, 0.0)
            for k in T.Pipelined(chunks, num_stages=1):
                T.copy(X[bx, k * chunk], raw)
                for i, j in T.Parallel(1, chunk):
                    x[i, j] = T.if_then_else(
                        k * chunk + j < N,
                        T.cast(raw[i, j], "float32"),
                        -T.infinity("float32"),
                    )
                T.reduce_max(x, chunk_max, dim=1)
                for i in T.Parallel(1):
                    chunk_max[i] = T.max(chunk_max[i], run_max[i])
                for i, j in T.Parallel(1, chunk):
                    x[i, j] = T.exp2((x[i, j] - chunk_max[i]) * LOG2E)
                T.reduce_sum(x, chunk_sum, dim=1)
                for i in T.Parallel(1):
                    run_sum[i] = (
                        run_sum[i] * T.exp2((run_max[i] - chunk_max[i]) * LOG2E)
                        + chunk_sum[i]
                    )
                    run_max[i] = chunk_max[i]
            for k in T.Pipelined(chunks, num_stages=1):
                T.copy(X[bx, k * chunk], raw)
                for i, j in T.Parallel(1, chunk):
                    raw[i, j] = T.cast(
                        T.exp2((T.cast(raw[i, j], "float32") - run_max[i]) * LOG2E)
                        / run_sum[i],
                        dtype,
                    )
                T.copy(raw, Y[bx, k * chunk])

    return softmax


def build_metal(shape: dict, dtype: str, target: dict):
    T = language(target)
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def softmax(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, METAL_THREADS), threads=METAL_THREADS) as bx:
            row_max = T.alloc_fragment((METAL_THREADS,), "float32")
            row_sum = T.alloc_fragment((METAL_THREADS,), "float32")
            for t in T.Parallel(METAL_THREADS):
                if bx * METAL_THREADS + t < M:
                    row_max[t] = -T.infinity("float32")
                    row_sum[t] = 0.0
                    for j in T.serial(N):
                        row_max[t] = T.max(
                            row_max[t], T.cast(X[bx * METAL_THREADS + t, j], "float32")
                        )
                    for j in T.serial(N):
                        row_sum[t] += T.exp2(
                            (
                                T.cast(X[bx * METAL_THREADS + t, j], "float32")
                                - row_max[t]
                            )
                            * LOG2E
                        )
                    for j in T.serial(N):
                        Y[bx * METAL_THREADS + t, j] = T.cast(
                            T.exp2(
                                (
                                    T.cast(X[bx * METAL_THREADS + t, j], "float32")
                                    - row_max[t]
                                )
                                * LOG2E
                            )
                            / row_sum[t],
                            dtype,
                        )

    return softmax


def build_c(shape: dict, dtype: str, target: dict):
    T = language(target)
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def softmax(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M) as row:
            stats = T.alloc_local((2,), "float32")  # running max, then sum
            stats[0] = -T.infinity("float32")
            stats[1] = 0.0
            for j in T.serial(N):
                stats[0] = T.max(stats[0], X[row, j])
            for j in T.serial(N):
                Y[row, j] = T.cast(T.exp(X[row, j] - stats[0]), dtype)
                stats[1] += Y[row, j]
            for j in T.serial(N):
                Y[row, j] = Y[row, j] / stats[1]

    return softmax


def _inputs(shape: dict, dtype: str) -> list[TensorSpec]:
    # Logits within +-4: a realistic spread that keeps every probability far
    # from underflow, so relative errors stay meaningful.
    return [TensorSpec("X", (shape["M"], shape["N"]), dtype, scale=4.0)]


def _outputs(shape: dict, dtype: str) -> list[TensorSpec]:
    return [TensorSpec("Y", (shape["M"], shape["N"]), dtype)]


def _reference(x):
    import torch

    return [torch.softmax(x, dim=-1)]


OPERATOR = Operator(
    name="softmax",
    dims=("M", "N"),
    dtypes={
        "cuda": GPU_DTYPES,
        "hip": GPU_DTYPES,
        "metal": METAL_DTYPES,
        "c": CPU_DTYPES,
    },
    builders={
        "cuda": build_gpu,
        "hip": build_gpu,
        "metal": build_metal,
        "c": build_c,
    },
    inputs=_inputs,
    outputs=_outputs,
    reference=_reference,
    flops=lambda s: 5 * s["M"] * s["N"],
    bytes_moved=lambda s, dt: 2 * s["M"] * s["N"] * element_size(dt),
    tolerances=ROUNDED_ONCE,
    description="softmax over the last dim, float32 math",
    default_shape={"M": 4096, "N": 4096},
)
