"""gemm: C[M, N] = A[M, K] @ B[K, N], row-major, float32 accumulation.

GPU, one kernel chosen by shape (``tile_config``):

- ``tile``: one block per C tile; K streams through shared memory in a
  multi-stage ``T.Pipelined`` loop (TMA + wgmma on sm_90a, async copies and
  MFMA on gfx942) into a float32 fragment. A 128x256 tile with 2 consumer
  warpgroups for large problems, narrower tiles when the large tile would
  leave SMs idle. Edges that are not a multiple of the tile are zero-filled
  on load (zeros add nothing to the dot products) and guarded on store; rows
  whose stride is not 16-byte aligned (K or N not a multiple of 8 halves)
  are loaded with guarded cp.async instead of TMA, which TileLang decides
  per buffer.
- ``gemv`` (decode, one row, or a router's few columns at up to four rows,
  Hopper): a row of A against all of B is a stream of B through the GPU
  once, so it runs at memory speed or not at all. Each thread loads 16
  bytes of a B row (8 columns) from 8 rows at a time and keeps M x 8 float32
  sums in registers; the threads of a block split K and add up through warp
  shuffles and shared memory; where N has too few column tiles to give every
  SM two blocks, a cluster of blocks splits K further and adds up through
  distributed shared memory (``cluster``).
- ``splitk`` (decode, M <= 16, Hopper): the tile kernel with a 16-row tile
  (tensor-core mma, A zero-filled past M) and K split across a cluster the
  same way, at most one block per SM.
- ``simt`` (float32): the tensor cores would run float32 as tf32, which is
  not the float32 operator the reference computes (nor what
  ``torch.matmul`` does by default); a register-tiled CUDA-core kernel does
  it in float32 FMA, each thread an 8 x 8 block of C.
"""

from __future__ import annotations

from .base import Operator, TensorSpec, Tolerance
from .cluster import CLUSTER_MAX, CLUSTER_SUM_SOURCE, clusters, ranks_for
from .common import (
    CPU_DTYPES,
    GPU_DTYPES,
    METAL_DTYPES,
    element_size,
    language,
)

H200_SMS = 132
VEC = 8  # halves in 16 bytes
DECODE_M = 16
# One row past this many columns (the vocabulary heads) keeps the split-K
# tile: the gemv ran no faster there (0.98-1.00x against 0.99-1.01x).
GEMV_MAX_N = 65536
ROUTER_N = 64  # fewer columns than this: a router (8 experts)


def decode_variant(shape: dict, dtype: str, target: dict) -> str | None:
    """The decode kernel for a few rows of A on Hopper, or None: B's rows
    must be whole 16-byte vectors (N and K multiples of 8) and its index fit
    in 32 bits."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    if (
        dtype == "float32"
        or not clusters(target)
        or M > DECODE_M
        or N % VEC
        or K % VEC
        or N * K >= 2**31
    ):
        return None
    # Measured on the H200 in bfloat16 (bench/kernel_tune.py --decode-wide,
    # rounds 2 and 3: docs/evidence/2026-12-03-h200-kernel-tune-decode-2.json
    # and -3.json, CUDA-graph replays against torch.matmul, at decode_config's
    # knobs). One row: the gemv ran 1.05-1.31x against the weights up to 6144
    # columns (K up to 18944, where the best split-K tile ran 1.16x as it
    # did) and 0.98-1.05x at 28672-37888 columns (the split-K tile 0.97-1.05x);
    # the vocabulary heads (128256-152064 columns) keep the split-K tile,
    # 0.99-1.01x, both variants at copy bandwidth there. Four and sixteen
    # rows: the split-K tile ran 0.96-1.23x to 6144 columns (at 3584 columns,
    # and four rows at 6144, the same tile at other ranks or pipelines ran
    # 1.02-1.24x) and 0.97-1.05x past them, where the gemv had run 0.64-0.92x
    # (round 1, 2026-12-02-h200-kernel-tune-decode-1.json). A router's 8
    # columns take the gemv at up to four rows (2.1-2.5x), the split-K tile at
    # sixteen (2.0x).
    if (M == 1 and N <= GEMV_MAX_N) or (M <= 4 and N < ROUTER_N):
        return "gemv"
    return "splitk"


def decode_config(shape: dict, variant: str) -> dict:
    """A decode variant's knobs (bench/kernel_tune.py --decode-wide and
    --refine measured them; figures are bfloat16 against torch.matmul)."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    if variant == "gemv":
        # Sixteen rows of sums in registers leave room for half the loads.
        unroll = VEC if M <= 8 else VEC // 2
        if N < ROUTER_N:
            # A router's one column tile: 2 lanes (16 columns) and a cluster
            # of 8 splitting K (2.55x at one row, 2.12x at four; 4 lanes
            # had run 2.49x and 1.94x).
            return dict(variant="gemv", lanes=2, threads=256, unroll=unroll, ranks=8)
        # 8 lanes (64 columns, a 128-byte row of B per load): 1.05-1.31x at
        # one row where 4 lanes ran 0.95-1.24x at best. To 8192 columns, 128
        # threads a block and a cluster splitting K until every SM has two
        # blocks (3584 and 4096 columns: 8 ranks, 1.05-1.31x; 4608 and 6144:
        # 4 ranks, 1.05-1.14x); past them 256 threads and no cluster
        # (28672-37888 columns: 0.98-1.05x).
        if N > 8192:
            return dict(variant="gemv", lanes=8, threads=256, unroll=unroll, ranks=1)
        tiles = -(-N // (8 * VEC))
        ranks = ranks_for(tiles, 2 * H200_SMS, K // unroll, 128 // 8)
        return dict(variant="gemv", lanes=8, threads=128, unroll=unroll, ranks=ranks)
    # 64 columns a tile while that gives at most two tiles per SM, 128 past
    # it (the 28672-152064-column weights: 0.97-1.05x at 128 against
    # 0.91-1.01x at 64 in round 1). K splits across a cluster into equal shares of at
    # least 4 steps, as far as every block still has an SM to itself: one
    # block per SM ran 1.21-1.23x at 4096 x 4096 (64 tiles, 2 ranks) where
    # two per SM (4 ranks) ran 0.74x.
    block_n = 64 if -(-N // 64) <= 2 * H200_SMS else 128
    block_k, stages = 128, 4
    tiles, steps = -(-N // block_n), -(-K // block_k)
    ranks = max(
        r
        for r in (1, 2, 4, CLUSTER_MAX)
        if steps % r == 0 and (r == 1 or steps // r >= 4 and tiles * r <= H200_SMS)
    )
    return dict(
        variant="splitk", block_n=block_n, block_k=block_k, stages=stages, ranks=ranks
    )


def tile_config(shape: dict, target: dict, dtype: str = "float16") -> dict:
    """The variant and its block sizes, pipeline depth, threads, swizzle
    panel, epilogue and cluster ranks for this shape and target
    (``bench/kernel_tune.py`` measures the options)."""
    M, N = shape["M"], shape["N"]
    common = dict(variant="tile", panel=10, store_via_shared=False)
    if dtype == "float32" and target["kind"] in ("cuda", "hip"):
        return dict(variant="simt", block_m=128, block_n=128, block_k=16, threads=256)
    if target["kind"] == "metal":
        return dict(common, block_m=32, block_n=32, block_k=32, stages=0, threads=128)
    if target["kind"] == "hip":
        return dict(common, block_m=128, block_n=128, block_k=32, stages=2, threads=256)
    decode = decode_variant(shape, dtype, target)
    if decode:
        return decode_config(shape, decode)
    if M <= 64:
        return dict(common, block_m=64, block_n=128, block_k=128, stages=3, threads=128)
    big_tiles = -(-M // 128) * -(-N // 256)
    if M <= 256 or big_tiles < H200_SMS:
        return dict(common, block_m=128, block_n=128, block_k=64, stages=4, threads=256)
    # Measured on the H200 at 4096^3 and 8192^3 (bench/kernel_tune.py): the
    # shared-memory epilogue and a 16-block swizzle panel took gemm from
    # 0.87-0.95x to 0.97-1.02x torch.matmul. TileLang lays the epilogue's
    # tile over the B stages, which leaves room for a fourth stage (192 KB of
    # shared memory): 0.941-0.996x to 0.969-1.002x over five alternating
    # rounds (round 16).
    return dict(
        common,
        block_m=128,
        block_n=256,
        block_k=64,
        stages=4,
        threads=256,
        panel=16,
        store_via_shared=True,
    )


def build_gpu(shape: dict, dtype: str, target: dict, config: dict | None = None):
    """``config`` overrides ``tile_config``'s choice (``variant`` and its
    knobs); ``bench/kernel_tune.py`` measures them."""
    if config and "variant" in config:
        cfg = dict(config)  # another variant: none of the chosen one's knobs
    else:
        cfg = {**tile_config(shape, target, dtype), **(config or {})}
    build = {
        "tile": _build_tile,
        "gemv": _build_gemv,
        "splitk": _build_splitk,
        "simt": _build_simt,
    }[cfg.pop("variant")]
    return build(shape, dtype, target, **cfg)


def _build_tile(
    shape: dict,
    dtype: str,
    target: dict,
    *,
    block_m: int,
    block_n: int,
    block_k: int,
    stages: int,
    threads: int,
    panel: int,
    store_via_shared: bool,
):
    T = language(target)
    M, N, K = shape["M"], shape["N"], shape["K"]

    @T.prim_func
    def gemm(
        A: T.Tensor((M, K), dtype),
        B: T.Tensor((K, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(
            T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads
        ) as (
            bx,
            by,
        ):
            a_tile = T.alloc_shared((block_m, block_k), dtype)
            b_tile = T.alloc_shared((block_k, block_n), dtype)
            acc = T.alloc_fragment((block_m, block_n), "float32")
            # Neighbouring blocks share A rows and B columns while both are
            # still in L2.
            T.use_swizzle(panel_size=panel)
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                T.copy(A[by * block_m, k * block_k], a_tile)
                T.copy(B[k * block_k, bx * block_n], b_tile)
                T.gemm(a_tile, b_tile, acc)
            if store_via_shared:
                # Staged through shared memory, C leaves in whole rows (a TMA
                # store on sm_90a) instead of each thread's scattered pairs.
                c_tile = T.alloc_shared((block_m, block_n), dtype)
                T.copy(acc, c_tile)
                T.copy(c_tile, C[by * block_m, bx * block_n])
            else:
                T.copy(acc, C[by * block_m, bx * block_n])

    return gemm


def _build_gemv(
    shape: dict,
    dtype: str,
    target: dict,
    *,
    lanes: int,
    threads: int,
    ranks: int,
    unroll: int = VEC,
):
    """``lanes`` threads side by side cover ``lanes`` x 8 columns of B (one
    16-byte load each); the block's other threads take other 8-row chunks of
    K, ``unroll`` rows a load round (the loads in flight per thread); the
    cluster's ``ranks`` blocks take equal shares of K's chunks."""
    T = language(target)
    M, N, K = shape["M"], shape["N"], shape["K"]
    block_n = lanes * VEC
    rows = threads // lanes  # threads along K in a block
    warps = threads // 32
    per_rank = -(-(K // unroll) // ranks)
    rounds = -(-per_rank // rows)
    outputs = M * block_n
    share = -(-outputs // ranks)  # outputs each rank adds up over the cluster
    shuffles = (32 // lanes).bit_length() - 1

    @T.prim_func
    def gemm(
        A: T.Tensor((M, K), dtype),
        B: T.Tensor((K, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.ClusterKernel(
            T.ceildiv(N, block_n) * ranks, cluster_dims=ranks, threads=threads
        ) as bx:
            T.import_source(CLUSTER_SUM_SOURCE)
            tid = T.get_thread_binding(0)
            tile = bx // ranks
            rank = bx % ranks
            col = tile * block_n + tid % lanes * VEC
            acc = T.alloc_local((M, VEC), "float32")
            b = T.alloc_local((unroll, VEC), dtype)
            a = T.alloc_local((M, unroll), dtype)
            warp_sums = T.alloc_shared((warps, outputs), "float32")
            part = T.alloc_shared((outputs,), "float32")
            T.clear(acc)
            for r in T.serial(rounds):
                chunk = rank * per_rank + r * rows + tid // lanes
                if chunk < (rank + 1) * per_rank and chunk * unroll < K and col < N:
                    # Every load of the round is issued before the first use.
                    for u in T.unroll(unroll):
                        for v in T.vectorized(VEC):
                            b[u, v] = B[chunk * unroll + u, col + v]
                    for m in T.unroll(M):
                        for u in T.vectorized(unroll):
                            a[m, u] = A[m, chunk * unroll + u]
                    for u in T.unroll(unroll):
                        for m in T.unroll(M):
                            for v in T.unroll(VEC):
                                acc[m, v] += T.cast(a[m, u], "float32") * T.cast(
                                    b[u, v], "float32"
                                )
            # Lanes lanes apart hold the same columns: fold them together.
            for m in T.unroll(M):
                for v in T.unroll(VEC):
                    for s in T.unroll(shuffles):
                        acc[m, v] += T.shfl_xor(acc[m, v], lanes << s)
            if tid % 32 < lanes:
                for m in T.unroll(M):
                    for v in T.unroll(VEC):
                        warp_sums[tid // 32, m * block_n + tid % lanes * VEC + v] = acc[
                            m, v
                        ]
            T.sync_threads()
            for e in T.serial(T.ceildiv(outputs, threads)):
                if e * threads + tid < outputs:
                    part[e * threads + tid] = 0.0
                    for w in T.unroll(warps):
                        part[e * threads + tid] += warp_sums[w, e * threads + tid]
            T.call_extern("void", "tm_cluster_sync")
            for e in T.serial(T.ceildiv(share, threads)):
                i = rank * share + e * threads + tid
                if e * threads + tid < share and i < outputs:
                    if tile * block_n + i % block_n < N:
                        C[i // block_n, tile * block_n + i % block_n] = T.cast(
                            T.call_extern(
                                "float32",
                                "tm_cluster_sum",
                                T.address_of(part[0]),
                                i,
                                ranks,
                            ),
                            dtype,
                        )
            T.call_extern("void", "tm_cluster_sync")

    return gemm


def _build_splitk(
    shape: dict,
    dtype: str,
    target: dict,
    *,
    block_n: int,
    block_k: int,
    stages: int,
    ranks: int,
):
    """A 16-row tile (A zero-filled past M) streaming B by TMA, each of the
    cluster's ``ranks`` blocks over an equal share of K's steps."""
    T = language(target)
    M, N, K = shape["M"], shape["N"], shape["K"]
    block_m = DECODE_M
    threads = 128
    share = -(-(M * block_n) // ranks)

    @T.prim_func
    def gemm(
        A: T.Tensor((M, K), dtype),
        B: T.Tensor((K, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.ClusterKernel(
            T.ceildiv(N, block_n) * ranks, cluster_dims=ranks, threads=threads
        ) as bx:
            T.import_source(CLUSTER_SUM_SOURCE)
            tile = bx // ranks
            # Each rank's equal share of K's steps (tile_config divides them).
            steps = T.ceildiv(K, block_k) // ranks
            first = bx % ranks * steps
            a_tile = T.alloc_shared((block_m, block_k), dtype)
            b_tile = T.alloc_shared((block_k, block_n), dtype)
            acc = T.alloc_fragment((block_m, block_n), "float32")
            part = T.alloc_shared((block_m, block_n), "float32")
            T.clear(acc)
            for k in T.Pipelined(steps, num_stages=stages):
                T.copy(A[0, (first + k) * block_k], a_tile)
                T.copy(B[(first + k) * block_k, tile * block_n], b_tile)
                T.gemm(a_tile, b_tile, acc)
            T.copy(acc, part)
            T.call_extern("void", "tm_cluster_sync")
            tid = T.get_thread_binding(0)
            for e in T.serial(T.ceildiv(share, threads)):
                i = bx % ranks * share + e * threads + tid
                if e * threads + tid < share and i < M * block_n:
                    if tile * block_n + i % block_n < N:
                        C[i // block_n, tile * block_n + i % block_n] = T.cast(
                            T.call_extern(
                                "float32",
                                "tm_cluster_sum",
                                T.address_of(part[0, 0]),
                                i,
                                ranks,
                            ),
                            dtype,
                        )
            T.call_extern("void", "tm_cluster_sync")

    return gemm


def _build_simt(
    shape: dict,
    dtype: str,
    target: dict,
    *,
    block_m: int,
    block_n: int,
    block_k: int,
    threads: int,
):
    """Each thread keeps an (8 x 8) block of C in registers and, per step of
    K, multiplies a column of 8 from the A tile by a row of 8 from the B
    tile (an outer product: 64 FMAs for 16 shared-memory reads)."""
    T = language(target)
    M, N, K = shape["M"], shape["N"], shape["K"]
    per = 8
    across = block_n // per  # threads along N

    @T.prim_func
    def gemm(
        A: T.Tensor((M, K), dtype),
        B: T.Tensor((K, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(
            T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads
        ) as (
            bx,
            by,
        ):
            a_tile = T.alloc_shared((block_m, block_k), dtype)
            b_tile = T.alloc_shared((block_k, block_n), dtype)
            acc = T.alloc_local((per, per), dtype)
            a = T.alloc_local((per,), dtype)
            b = T.alloc_local((per,), dtype)
            tid = T.get_thread_binding(0)
            row = tid // across * per
            col = tid % across * per
            T.clear(acc)
            for k in T.serial(T.ceildiv(K, block_k)):
                T.copy(A[by * block_m, k * block_k], a_tile)
                T.copy(B[k * block_k, bx * block_n], b_tile)
                for kk in T.serial(block_k):
                    for i in T.unroll(per):
                        a[i] = a_tile[row + i, kk]
                    for j in T.vectorized(per):
                        b[j] = b_tile[kk, col + j]
                    for i in T.unroll(per):
                        for j in T.unroll(per):
                            acc[i, j] += a[i] * b[j]
            for i in T.unroll(per):
                for j in T.unroll(per):
                    if by * block_m + row + i < M and bx * block_n + col + j < N:
                        C[by * block_m + row + i, bx * block_n + col + j] = acc[i, j]

    return gemm


def build_c(shape: dict, dtype: str, target: dict):
    T = language(target)
    M, N, K = shape["M"], shape["N"], shape["K"]

    @T.prim_func
    def gemm(
        A: T.Tensor((M, K), dtype),
        B: T.Tensor((K, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as row:
            # i-k-j order: the innermost loop walks rows of B and C
            # contiguously.
            for j in T.serial(N):
                C[row, j] = T.cast(0.0, dtype)
            for k in T.serial(K):
                for j in T.serial(N):
                    C[row, j] += A[row, k] * B[k, j]

    return gemm


def _inputs(shape: dict, dtype: str) -> list[TensorSpec]:
    # A scaled by 1/sqrt(K): each output is a sum of K products of order
    # 1/sqrt(K), so outputs stay O(1) whatever K is.
    return [
        TensorSpec("A", (shape["M"], shape["K"]), dtype, scale=shape["K"] ** -0.5),
        TensorSpec("B", (shape["K"], shape["N"]), dtype),
    ]


def _outputs(shape: dict, dtype: str) -> list[TensorSpec]:
    return [TensorSpec("C", (shape["M"], shape["N"]), dtype)]


def _reference(a, b):
    return [a @ b]


# Inputs are exact in the reference (it sees the same rounded values), so
# the error is float32 accumulation over K (about sqrt(K) * 2^-24, < 1e-5 at
# K = 14336) plus one rounding of each output.
TOLERANCES = {
    "float16": Tolerance(
        rel_err=1e-3,
        atol=2e-3,
        rtol=4e-3,
        max_mismatch_ratio=1e-4,
        reason="float32 accumulation over K, one fp16 rounding (2^-11) of C",
    ),
    "bfloat16": Tolerance(
        rel_err=8e-3,
        atol=1.6e-2,
        rtol=3e-2,
        max_mismatch_ratio=1e-4,
        reason="float32 accumulation over K, one bf16 rounding (2^-8) of C",
    ),
    "float32": Tolerance(
        rel_err=2e-5,
        atol=2e-5,
        rtol=2e-4,
        max_mismatch_ratio=1e-4,
        reason="float32 serial accumulation over K: error grows like "
        "sqrt(K) * 2^-24 with a different summation order than BLAS",
    ),
}

OPERATOR = Operator(
    name="gemm",
    dims=("M", "N", "K"),
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
    flops=lambda s: 2 * s["M"] * s["N"] * s["K"],
    bytes_moved=lambda s, dt: (
        (s["M"] * s["K"] + s["K"] * s["N"] + s["M"] * s["N"]) * element_size(dt)
    ),
    tolerances=TOLERANCES,
    description="A[M,K] @ B[K,N] row-major, float32 accumulation",
    default_shape={"M": 4096, "N": 4096, "K": 4096},
)
