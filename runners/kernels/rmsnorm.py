"""rmsnorm: Y[M, N] = X / sqrt(mean(X^2, over N) + 1e-6) * weight[N].

Same shape of kernel as softmax: rows up to ``RESIDENT_MAX`` columns stay in
registers (X read once, Y written once, the weight read from L2 per block);
longer rows take a sum-of-squares pass and a scaling pass. Columns past N
load as zero and add nothing to the sum of squares. Math is float32, the
output rounded once, as Llama-style RMSNorm layers do.

Metal has no ``T.reduce_*`` lowering in TileLang 0.1.15: one row per thread.
"""

from __future__ import annotations

from .base import Operator, TensorSpec
from .common import (
    CPU_DTYPES,
    GPU_DTYPES,
    METAL_DTYPES,
    ROUNDED_ONCE,
    element_size,
    language,
    resident_row_tile,
)

EPS = 1e-6
RESIDENT_MAX = 16384
CHUNK = 4096
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
    def rmsnorm(
        X: T.Tensor((M, N), dtype),
        W: T.Tensor((N,), dtype),
        Y: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            raw = T.alloc_fragment((block_m, width), dtype)
            weight = T.alloc_shared((width,), dtype)
            squares = T.alloc_fragment((block_m, width), "float32")
            inv_rms = T.alloc_fragment((block_m,), "float32")
            T.copy(X[bx * block_m, 0], raw)
            T.copy(W[0], weight)
            for i, j in T.Parallel(block_m, width):
                squares[i, j] = T.cast(raw[i, j], "float32") * T.cast(
                    raw[i, j], "float32"
                )
            T.reduce_sum(squares, inv_rms, dim=1)
            for i in T.Parallel(block_m):
                inv_rms[i] = T.rsqrt(inv_rms[i] / N + EPS)
            for i, j in T.Parallel(block_m, width):
                raw[i, j] = T.cast(
                    T.cast(raw[i, j], "float32")
                    * inv_rms[i]
                    * T.cast(weight[j], "float32"),
                    dtype,
                )
            T.copy(raw, Y[bx * block_m, 0])

    return rmsnorm


def _build_streaming(
    shape: dict, dtype: str, target: dict, chunk: int = CHUNK, threads: int = 256
):
    T = language(target)
    M, N = shape["M"], shape["N"]
    chunks = -(-N // chunk)

    @T.prim_func
    def rmsnorm(
        X: T.Tensor((M, N), dtype),
        W: T.Tensor((N,), dtype),
        Y: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M, threads=threads) as bx:
            raw = T.alloc_fragment((1, chunk), dtype)
            weight = T.alloc_shared((chunk,), dtype)
            squares = T.alloc_fragment((1, chunk), "float32")
            inv_rms = T.alloc_fragment((1,), "float32")
            T.clear(squares)
            for k in T.Pipelined(chunks, num_stages=1):
                T.copy(X[bx, k * chunk], raw)
                for i, j in T.Parallel(1, chunk):
                    squares[i, j] += T.cast(raw[i, j], "float32") * T.cast(
                        raw[i, j], "float32"
                    )
            T.reduce_sum(squares, inv_rms, dim=1)
            for i in T.Parallel(1):
                inv_rms[i] = T.rsqrt(inv_rms[i] / N + EPS)
            for k in T.Pipelined(chunks, num_stages=1):
                T.copy(X[bx, k * chunk], raw)
                T.copy(W[k * chunk], weight)
                for i, j in T.Parallel(1, chunk):
                    raw[i, j] = T.cast(
                        T.cast(raw[i, j], "float32")
                        * inv_rms[i]
                        * T.cast(weight[j], "float32"),
                        dtype,
                    )
                T.copy(raw, Y[bx, k * chunk])

    return rmsnorm


def build_metal(shape: dict, dtype: str, target: dict):
    T = language(target)
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def rmsnorm(
        X: T.Tensor((M, N), dtype),
        W: T.Tensor((N,), dtype),
        Y: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(M, METAL_THREADS), threads=METAL_THREADS) as bx:
            inv_rms = T.alloc_fragment((METAL_THREADS,), "float32")
            for t in T.Parallel(METAL_THREADS):
                if bx * METAL_THREADS + t < M:
                    inv_rms[t] = 0.0
                    for j in T.serial(N):
                        inv_rms[t] += T.cast(
                            X[bx * METAL_THREADS + t, j], "float32"
                        ) * T.cast(X[bx * METAL_THREADS + t, j], "float32")
                    inv_rms[t] = T.rsqrt(inv_rms[t] / N + EPS)
                    for j in T.serial(N):
                        Y[bx * METAL_THREADS + t, j] = T.cast(
                            T.cast(X[bx * METAL_THREADS + t, j], "float32")
                            * inv_rms[t]
                            * T.cast(W[j], "float32"),
                            dtype,
                        )

    return rmsnorm


def build_c(shape: dict, dtype: str, target: dict):
    T = language(target)
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def rmsnorm(
        X: T.Tensor((M, N), dtype),
        W: T.Tensor((N,), dtype),
        Y: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as row:
            inv_rms = T.alloc_local((1,), "float32")
            inv_rms[0] = 0.0
            for j in T.serial(N):
                inv_rms[0] += X[row, j] * X[row, j]
            inv_rms[0] = 1.0 / T.sqrt(inv_rms[0] / N + EPS)
            for j in T.serial(N):
                Y[row, j] = T.cast(X[row, j] * inv_rms[0] * W[j], dtype)

    return rmsnorm


def _inputs(shape: dict, dtype: str) -> list[TensorSpec]:
    # Weights near 1 as in a trained layer; activations signed.
    return [
        TensorSpec("X", (shape["M"], shape["N"]), dtype, scale=2.0),
        TensorSpec("weight", (shape["N"],), dtype, scale=1.5, positive=True),
    ]


def _outputs(shape: dict, dtype: str) -> list[TensorSpec]:
    return [TensorSpec("Y", (shape["M"], shape["N"]), dtype)]


def _reference(x, weight):
    import torch

    return [x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight]


OPERATOR = Operator(
    name="rmsnorm",
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
    flops=lambda s: 4 * s["M"] * s["N"],
    bytes_moved=lambda s, dt: (2 * s["M"] * s["N"] + s["N"]) * element_size(dt),
    tolerances=ROUNDED_ONCE,
    description="x / rms(x) * weight over the last dim, eps 1e-6, float32 math",
    default_shape={"M": 4096, "N": 4096},
)
