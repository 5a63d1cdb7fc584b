"""gemm: C[M, N] = A[M, K] @ B[K, N], row-major, float32 accumulation.

GPU: one block per C tile; K streams through shared memory in a
multi-stage ``T.Pipelined`` loop (TMA + wgmma on sm_90a, async copies and
MFMA on gfx942) into a float32 fragment. Tile sizes follow the shape: a
128x256 tile with 2 consumer warpgroups for large problems, narrower tiles
when M is small (decode) or when the large tile would leave SMs idle.
Edges that are not a multiple of the tile are zero-filled on load (zeros add
nothing to the dot products) and guarded on store; rows whose stride is not
16-byte aligned (K or N not a multiple of 8 halves) are loaded with guarded
cp.async instead of TMA, which TileLang decides per buffer.

Float32 is not offered on GPUs: tensor cores would run it as tf32, which is
a different operator than the float32 reference.
"""

from __future__ import annotations

from .base import Operator, TensorSpec, Tolerance
from .common import CPU_DTYPES, HALF_DTYPES, METAL_DTYPES, element_size, language

H200_SMS = 132


def tile_config(shape: dict, target: dict) -> dict:
    """Block sizes, pipeline depth, threads, swizzle panel and epilogue for
    this shape and target (``bench/kernel_tune.py`` measures the options)."""
    M, N = shape["M"], shape["N"]
    common = dict(panel=10, store_via_shared=False)
    if target["kind"] == "metal":
        return dict(common, block_m=32, block_n=32, block_k=32, stages=0, threads=128)
    if target["kind"] == "hip":
        return dict(common, block_m=128, block_n=128, block_k=32, stages=2, threads=256)
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
    T = language(target)
    M, N, K = shape["M"], shape["N"], shape["K"]
    cfg = {**tile_config(shape, target), **(config or {})}
    block_m, block_n, block_k = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    stages, threads = cfg["stages"], cfg["threads"]
    panel, store_via_shared = cfg["panel"], cfg["store_via_shared"]

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
        "cuda": HALF_DTYPES,
        "hip": HALF_DTYPES,
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
