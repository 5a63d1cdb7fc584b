"""softmax: Y[M, N] = softmax of X over N, float32 math.

GPU, rows up to ``RESIDENT_MAX`` columns: a block holds whole rows in
registers, so X is read once and Y written once (the memory-bound minimum).
Longer rows (a vocabulary) stream in chunks: an online pass keeps each
thread's running max and rescaled sum, a second pass re-reads the row
(partly from L2) and writes it. Columns past N enter as -inf so they weigh
zero.

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
# Streamed rows: 1024 threads reading 16 values each per chunk ran
# 4096 x 128256 at 73-74% of the copy bandwidth on the H200, against 61% for
# the earlier kernel (block-wide max and sum per 4096-column chunk), 64-68%
# with 512 threads or 32 values, 62% at one block per SM, 67% staging the
# chunks through shared memory by TMA, and 67% with the bare exp2
# (bench/kernel_tune.py, docs/evidence/2026-11-30-h200-kernel-tune-{7..10}.json).
STREAM_VEC = 16
STREAM_THREADS = 1024
METAL_THREADS = 256


def build_gpu(shape: dict, dtype: str, target: dict, config: dict | None = None):
    """``config`` overrides ``per_thread`` (resident rows) or ``vec`` and
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
    vec: int = STREAM_VEC,
    threads: int = STREAM_THREADS,
):
    """Each thread keeps its own running max and rescaled sum over the
    ``vec`` consecutive values it reads from every ``threads * vec`` chunk,
    so the first pass needs no block-wide step until the end, where one
    max and one sum combine the threads' partials. The second pass walks
    the row backwards: the chunks read last are the likeliest still in L2.
    """
    T = language(target)
    M, N = shape["M"], shape["N"]
    chunk = threads * vec
    chunks = -(-N // chunk)
    neg_inf = -T.infinity("float32")

    @T.prim_func
    def softmax(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M, threads=threads) as bx:
            x = T.alloc_fragment((threads, vec), "float32")
            run_max = T.alloc_fragment((threads,), "float32")
            run_sum = T.alloc_fragment((threads,), "float32")
            vec_max = T.alloc_fragment((threads,), "float32")
            vec_sum = T.alloc_fragment((threads,), "float32")
            part = T.alloc_fragment((1, threads), "float32")
            row_max = T.alloc_fragment((1,), "float32")
            row_sum = T.alloc_fragment((1,), "float32")
            T.fill(run_max, neg_inf)
            T.fill(run_sum, 0.0)
            for k in T.serial(chunks):
                for t, v in T.Parallel(threads, vec):
                    x[t, v] = T.if_then_else(
                        k * chunk + t * vec + v < N,
                        T.cast(X[bx, k * chunk + t * vec + v], "float32"),
                        neg_inf,
                    )
                T.reduce_max(x, vec_max, dim=1)
                for t in T.Parallel(threads):
                    vec_max[t] = T.max(vec_max[t], run_max[t])
                    run_sum[t] = run_sum[t] * T.if_then_else(
                        vec_max[t] == run_max[t],
                        1.0,
                        T.exp2((run_max[t] - vec_max[t]) * LOG2E),
                    )
                    run_max[t] = vec_max[t]
                for t, v in T.Parallel(threads, vec):
                    x[t, v] = T.exp2((x[t, v] - run_max[t]) * LOG2E)
                T.reduce_sum(x, vec_sum, dim=1)
                for t in T.Parallel(threads):
                    run_sum[t] += vec_sum[t]
            for i, t in T.Parallel(1, threads):
                part[i, t] = run_max[t]
            T.reduce_max(part, row_max, dim=1)
            for i, t in T.Parallel(1, threads):
                part[i, t] = T.if_then_else(
                    run_max[t] == neg_inf,
                    0.0,
                    run_sum[t] * T.exp2((run_max[t] - row_max[i]) * LOG2E),
                )
            T.reduce_sum(part, row_sum, dim=1)
            for i in T.Parallel(1):
                row_sum[i] = 1.0 / row_sum[i]  # a multiply per value below
            for kk in T.serial(chunks):
                k = chunks - 1 - kk
                for t, v in T.Parallel(threads, vec):
                    if k * chunk + t * vec + v < N:
                        Y[bx, k * chunk + t * vec + v] = T.cast(
                            T.exp2(
                                (
                                    T.cast(X[bx, k * chunk + t * vec + v], "float32")
                                    - row_max[0]
                                )
                                * LOG2E
                            )
                            * row_sum[0],
                            dtype,
                        )

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
