"""softmax: Y[M, N] = softmax of X over N, float32 math.

GPU, rows up to ``RESIDENT_MAX`` columns: a block holds whole rows in
registers, so X is read once and Y written once (the memory-bound minimum).
Longer rows (a vocabulary) on Hopper: a cluster of blocks shares each row,
every block keeping its slice in shared memory, so X is still read once
(``_build_cluster``). Without clusters (Ampere, ROCm) long rows stream in
chunks: an online pass keeps each thread's running max and rescaled sum, a
second pass re-reads the row (partly from L2) and writes it. Columns past N
enter as -inf so they weigh zero, as masked logits do: a block's slice or a
thread's share that is all -inf adds nothing to the row's sum (it has no max
to subtract), and the row is still right if any of it is not masked.

Metal has no ``T.reduce_*`` lowering in TileLang 0.1.15, so its kernel gives
each thread one row and loops serially.
"""

from __future__ import annotations

import re

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
# Vocabulary rows (4096 x 128256) on the H200, as fractions of the copy
# bandwidth (bench/kernel_tune.py, docs/evidence/2026-12-01-h200-kernel-tune-
# {11,12}.json): clusters of 8 blocks, each thread loading 8 x 16 bytes into
# shared memory (256 threads for fp16 and bf16, 512 for fp32, so a block
# holds 32 or 64 KB and an SM several blocks) ran at 77-78% for fp16 and
# bf16 and 76% for fp32, against 72-74% and 66% streamed. Clusters of 4 or
# 16, 128 or 1024 threads (bf16) and 256 threads (fp32) ran at 45-77%.
CLUSTER = 8
CLUSTER_THREADS = {"float16": 256, "bfloat16": 256, "float32": 512}
# Streamed rows: 1024 threads reading 16 values each per chunk ran
# 4096 x 128256 at 73-74% of the copy bandwidth, against 61% for the earlier
# kernel (block-wide max and sum per 4096-column chunk), 64-68% with 512
# threads or 32 values, 62% at one block per SM, 67% staging the chunks
# through shared memory by TMA, and 67% with the bare exp2
# (docs/evidence/2026-11-30-h200-kernel-tune-{7..10}.json).
STREAM_VEC = 16
STREAM_THREADS = 1024
METAL_THREADS = 256
# Each block of a cluster posts its slice's (max, sum) in shared memory; after
# one cluster barrier every block reads all of them through distributed
# shared memory. The arrive after the last read pairs with the wait at the
# end of the kernel: a block must not exit while a peer still reads its
# shared memory.
# (1.4426950408889634f is LOG2E.)
CLUSTER_SOURCE = r"""
#include <cooperative_groups.h>
__shared__ float2 tm_cluster_stats;
__device__ __forceinline__ float tm_cluster_max(float m, float s, int ranks) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) tm_cluster_stats = make_float2(m, s);
  cluster.sync();
  for (int r = 0; r < ranks; ++r)
    m = fmaxf(m, cluster.map_shared_rank(&tm_cluster_stats, r)->x);
  return m;
}
__device__ __forceinline__ float tm_cluster_sum(float row_max, int ranks) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  float sum = 0.0f;
  for (int r = 0; r < ranks; ++r) {
    float2 peer = *cluster.map_shared_rank(&tm_cluster_stats, r);
    sum += peer.y * exp2f((peer.x - row_max) * 1.4426950408889634f);
  }
  cluster.barrier_arrive();
  return sum;
}
__device__ __forceinline__ void tm_cluster_wait() {
  cooperative_groups::this_cluster().barrier_wait();
}
"""


def build_gpu(shape: dict, dtype: str, target: dict, config: dict | None = None):
    """``config`` overrides ``per_thread`` (resident rows), ``ranks``,
    ``vec`` and ``threads`` (clustered rows), ``cluster=0`` (stream instead)
    or ``vec`` and ``threads`` (streamed rows); ``bench/kernel_tune.py``
    measures them."""
    config = dict(config or {})
    if shape["N"] <= RESIDENT_MAX:
        return _build_resident(shape, dtype, target, **config)
    if _clusters(target) and config.pop("cluster", True):
        return _build_cluster(shape, dtype, target, **config)
    return _build_streaming(shape, dtype, target, **config)


def _clusters(target: dict) -> bool:
    """Thread-block clusters: CUDA from sm_90 (Hopper) on, sm_100 included."""
    arch = re.match(r"sm_(\d+)", target.get("arch", ""))
    return target["kind"] == "cuda" and arch is not None and int(arch[1]) >= 90


def _build_cluster(
    shape: dict,
    dtype: str,
    target: dict,
    ranks: int = CLUSTER,
    vec: int | None = None,
    threads: int | None = None,
):
    """A cluster of ``ranks`` blocks shares each row: every block copies its
    slice into shared memory once, reduces the slice's max and sum, and the
    blocks swap those through distributed shared memory (``CLUSTER_SOURCE``)
    before each writes its slice from shared memory: one read of X."""
    T = language(target)
    M, N = shape["M"], shape["N"]
    vec = vec or 16 // element_size(dtype)  # 16-byte loads
    threads = threads or CLUSTER_THREADS[dtype]
    chunk = threads * vec
    chunks = -(-N // (ranks * chunk))
    width = chunks * chunk
    neg_inf = -T.infinity("float32")

    @T.prim_func
    def softmax(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(ranks * M, threads=threads, cluster_dims=ranks) as bx:
            T.import_source(CLUSTER_SOURCE)
            row = bx // ranks
            base = bx % ranks * width
            s = T.alloc_shared((width,), dtype)
            x = T.alloc_fragment((threads, vec), "float32")
            run = T.alloc_fragment((threads,), "float32")
            part = T.alloc_fragment((threads,), "float32")
            row_max = T.alloc_fragment((1,), "float32")
            row_sum = T.alloc_fragment((1,), "float32")
            # Each thread reads back only the columns it copied in, so the
            # passes below need no barrier between them.
            for j in T.Parallel(width):
                if base + j < N:
                    s[j] = X[row, base + j]
            T.fill(run, neg_inf)
            for k in T.serial(chunks):
                for t, v in T.Parallel(threads, vec):
                    x[t, v] = T.if_then_else(
                        base + k * chunk + t * vec + v < N,
                        T.cast(s[k * chunk + t * vec + v], "float32"),
                        neg_inf,
                    )
                T.reduce_max(x, part, dim=1)
                for t in T.Parallel(threads):
                    run[t] = T.max(run[t], part[t])
            T.reduce_max(run, row_max, dim=0)
            T.fill(run, 0.0)
            for k in T.serial(chunks):
                for t, v in T.Parallel(threads, vec):
                    value = T.cast(s[k * chunk + t * vec + v], "float32")
                    # A masked value weighs nothing: exp(-inf - max) would be
                    # NaN where the whole slice is masked (max -inf).
                    x[t, v] = T.if_then_else(
                        base + k * chunk + t * vec + v < N,
                        T.if_then_else(
                            value == neg_inf,
                            0.0,
                            T.exp2((value - row_max[0]) * LOG2E),
                        ),
                        0.0,
                    )
                T.reduce_sum(x, part, dim=1)
                for t in T.Parallel(threads):
                    run[t] += part[t]
            T.reduce_sum(run, row_sum, dim=0)
            # The slice's max and sum (relative to that max) become the row's.
            for i in T.Parallel(1):
                row_max[i] = T.call_extern(
                    "float32", "tm_cluster_max", row_max[i], row_sum[i], ranks
                )
                row_sum[i] = 1.0 / T.call_extern(
                    "float32", "tm_cluster_sum", row_max[i], ranks
                )
            for j in T.Parallel(width):
                if base + j < N:
                    Y[row, base + j] = T.cast(
                        T.exp2((T.cast(s[j], "float32") - row_max[0]) * LOG2E)
                        * row_sum[0],
                        dtype,
                    )
            T.call_extern("void", "tm_cluster_wait")

    return softmax


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
                    # As in the cluster kernel: a thread whose values so far
                    # are all masked has run_max -inf, and -inf - -inf is NaN.
                    x[t, v] = T.if_then_else(
                        x[t, v] == neg_inf, 0.0, T.exp2((x[t, v] - run_max[t]) * LOG2E)
                    )
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
