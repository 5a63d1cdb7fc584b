"""row_sum: out[M] = sum over N of A[M, N], accumulated in float32.

The GPU kernel gives each block ``block_m`` rows and streams them in
``block_n``-wide chunks through registers, keeping per-thread float32
partial sums, and reduces across threads once at the end (``T.reduce_sum``).
Columns past N load as zero, which leaves the sum unchanged.

Few long rows (3 x 1,000,003) would leave most SMs idle with a block per
row: on Hopper a cluster of blocks shares each row, each summing an equal
span of it, and the blocks add their sums through distributed shared memory
(``cluster``).

Metal has no ``T.reduce_*`` lowering in TileLang 0.1.15: one row per thread.
"""

from __future__ import annotations

from .base import Operator, TensorSpec, Tolerance
from .cluster import CLUSTER_SUM_SOURCE, clusters
from .common import (
    CPU_DTYPES,
    GPU_DTYPES,
    METAL_DTYPES,
    clamp,
    element_size,
    language,
    next_pow2,
)

THREADS = 256
TILE = 2048  # elements a block loads per step
METAL_THREADS = 256
H200_SMS = 132
SPLIT_THREADS = 512
SPLIT_TILE = 8192  # elements a block of a split row loads per step
# Clusters of 16 (past the portable 8; TileLang allows them at launch) ran
# 3 x 1,000,003 at 1.17x torch.sum in float32 and 1.07x in bf16, against
# 0.81x and 0.68x for 8 (bench/kernel_tune.py --decode, round 1).
SPLIT_MAX = 16


def _tile(shape: dict, tile: int) -> tuple[int, int]:
    block_n = clamp(next_pow2(shape["N"]), 32, tile)
    block_m = clamp(tile // block_n, 1, next_pow2(shape["M"]))
    return block_m, block_n


def split_ranks(shape: dict, target: dict, tile: int = SPLIT_TILE) -> int:
    """How many blocks of a cluster share each row: enough for two blocks
    per SM when a block per row would leave SMs idle, each with at least one
    whole step of the row; 1 (no split) otherwise."""
    M, N = shape["M"], shape["N"]
    if not clusters(target) or M >= H200_SMS:
        return 1
    ranks = 1
    while ranks < SPLIT_MAX and M * ranks < 2 * H200_SMS and N >= 2 * ranks * tile:
        ranks *= 2
    return ranks


def build_gpu(
    shape: dict,
    dtype: str,
    target: dict,
    config: dict | None = None,
):
    """``config`` overrides ``tile`` (elements per step), ``threads`` and
    ``ranks`` (blocks sharing a row; 1 is a block per ``block_m`` rows);
    ``bench/kernel_tune.py`` measures them."""
    config = dict(config or {})
    ranks = config.pop("ranks", None) or split_ranks(
        shape, target, config.get("tile", SPLIT_TILE)
    )
    if ranks > 1:
        return _build_split(shape, dtype, target, ranks=ranks, **config)
    T = language(target)
    M, N = shape["M"], shape["N"]
    cfg = {"tile": TILE, "threads": THREADS, **config}
    block_m, block_n = _tile(shape, cfg["tile"])
    threads = cfg["threads"]

    @T.prim_func
    def row_sum(A: T.Tensor((M, N), dtype), Out: T.Tensor((M,), dtype)):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            chunk = T.alloc_fragment((block_m, block_n), dtype)
            partial = T.alloc_fragment((block_m, block_n), "float32")
            total = T.alloc_fragment((block_m,), "float32")
            T.clear(partial)
            for k in T.Pipelined(T.ceildiv(N, block_n), num_stages=1):
                T.copy(A[bx * block_m, k * block_n], chunk)
                for i, j in T.Parallel(block_m, block_n):
                    partial[i, j] += T.cast(chunk[i, j], "float32")
            T.reduce_sum(partial, total, dim=1)
            T.copy(total, Out[bx * block_m])

    return row_sum


def _build_split(
    shape: dict,
    dtype: str,
    target: dict,
    *,
    ranks: int,
    tile: int = SPLIT_TILE,
    threads: int = SPLIT_THREADS,
):
    """Each of a cluster's ``ranks`` blocks sums ``span`` columns of one row
    (a whole number of ``tile``-wide steps), then the first block adds the
    cluster's sums."""
    T = language(target)
    M, N = shape["M"], shape["N"]
    steps = -(-N // (ranks * tile))
    span = steps * tile

    @T.prim_func
    def row_sum(A: T.Tensor((M, N), dtype), Out: T.Tensor((M,), dtype)):
        with T.ClusterKernel(M * ranks, cluster_dims=ranks, threads=threads) as bx:
            T.import_source(CLUSTER_SUM_SOURCE)
            row = bx // ranks
            start = bx % ranks * span
            chunk = T.alloc_fragment((1, tile), dtype)
            partial = T.alloc_fragment((1, tile), "float32")
            total = T.alloc_fragment((1,), "float32")
            part = T.alloc_shared((1,), "float32")
            T.clear(partial)
            for k in T.serial(steps):
                if start + k * tile < N:  # the last rank's span may pass N
                    T.copy(A[row, start + k * tile], chunk)
                    for i, j in T.Parallel(1, tile):
                        partial[i, j] += T.cast(chunk[i, j], "float32")
            T.reduce_sum(partial, total, dim=1)
            T.copy(total, part)
            T.call_extern("void", "tm_cluster_sync")
            if bx % ranks == 0 and T.get_thread_binding(0) == 0:
                Out[row] = T.cast(
                    T.call_extern(
                        "float32", "tm_cluster_sum", T.address_of(part[0]), 0, ranks
                    ),
                    dtype,
                )
            T.call_extern("void", "tm_cluster_sync")

    return row_sum


def build_metal(shape: dict, dtype: str, target: dict):
    T = language(target)
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def row_sum(A: T.Tensor((M, N), dtype), Out: T.Tensor((M,), dtype)):
        with T.Kernel(T.ceildiv(M, METAL_THREADS), threads=METAL_THREADS) as bx:
            total = T.alloc_fragment((METAL_THREADS,), "float32")
            for t in T.Parallel(METAL_THREADS):
                if bx * METAL_THREADS + t < M:
                    total[t] = 0.0
                    for j in T.serial(N):
                        total[t] += T.cast(A[bx * METAL_THREADS + t, j], "float32")
                    Out[bx * METAL_THREADS + t] = T.cast(total[t], dtype)

    return row_sum


def build_c(shape: dict, dtype: str, target: dict):
    T = language(target)
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def row_sum(A: T.Tensor((M, N), dtype), Out: T.Tensor((M,), dtype)):
        with T.Kernel(M) as row:
            total = T.alloc_local((1,), "float32")
            total[0] = 0.0
            for j in T.serial(N):
                total[0] += A[row, j]
            Out[row] = T.cast(total[0], dtype)

    return row_sum


def _inputs(shape: dict, dtype: str) -> list[TensorSpec]:
    # Positive addends: no cancellation, so the norm-relative error measures
    # the kernel and not the conditioning of the sum. The 1/sqrt(N) scale keeps
    # sums near sqrt(N), far below fp16's 65504 even for a vocabulary row.
    scale = shape["N"] ** -0.5
    return [TensorSpec("A", (shape["M"], shape["N"]), dtype, scale, positive=True)]


def _outputs(shape: dict, dtype: str) -> list[TensorSpec]:
    return [TensorSpec("Out", (shape["M"],), dtype)]


def _reference(a):
    return [a.sum(dim=1)]


# Inputs are positive, so float32 accumulation over N terms is accurate to
# about sqrt(N) * 2^-24 (< 2e-5 at N = 128256) and the output rounding
# dominates for half types.
TOLERANCES = {
    "float16": Tolerance(
        rel_err=1e-3,
        atol=1e-3,
        rtol=2e-3,
        max_mismatch_ratio=0.0,
        reason="float32 sum of positive terms, one fp16 rounding (2^-11)",
    ),
    "bfloat16": Tolerance(
        rel_err=8e-3,
        atol=8e-3,
        rtol=1.6e-2,
        max_mismatch_ratio=0.0,
        reason="float32 sum of positive terms, one bf16 rounding (2^-8)",
    ),
    "float32": Tolerance(
        rel_err=2e-5,
        atol=1e-5,
        rtol=5e-5,
        max_mismatch_ratio=0.0,
        reason="float32 sum of up to ~1e5 positive terms in a different order: "
        "error grows like sqrt(N) * 2^-24",
    ),
}

OPERATOR = Operator(
    name="row_sum",
    dims=("M", "N"),
    dtypes={
        "cuda": GPU_DTYPES,
        "hip": GPU_DTYPES,
        "metal": METAL_DTYPES,
        "c": CPU_DTYPES,
    },
    builders={"cuda": build_gpu, "hip": build_gpu, "metal": build_metal, "c": build_c},
    inputs=_inputs,
    outputs=_outputs,
    reference=_reference,
    flops=lambda s: s["M"] * s["N"],
    bytes_moved=lambda s, dt: (s["M"] * s["N"] + s["M"]) * element_size(dt),
    tolerances=TOLERANCES,
    description="sum of each row, float32 accumulation",
    default_shape={"M": 4096, "N": 4096},
)
