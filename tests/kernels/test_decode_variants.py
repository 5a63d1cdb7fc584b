"""The kernel a shape gets: decode gemms (a few rows of A) and sums over few
long rows split their reduction across a thread-block cluster on Hopper,
float32 gemm and attention run on the CUDA cores, and every variant lowers
(and builds, where nvcc is here) for cuda sm_90a. No device needed."""

from __future__ import annotations

import shutil

import pytest

from runners.kernels import get
from runners.kernels.attention import tile_config as attention_config
from runners.kernels.gemm import H200_SMS, tile_config
from runners.kernels.row_sum import split_ranks
from runners.kernels.toolchain import build, lower

from .conftest import CUDA, HIP

AMPERE = {"kind": "cuda", "arch": "sm_80"}
LM_HEAD_152K = {"M": 1, "N": 151936, "K": 3584}
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")


@pytest.mark.parametrize(
    ("shape", "variant"),
    [
        # The gemv: one row against every weight up to 65536 columns, at
        # any K, and a router's few columns at up to four rows.
        ({"M": 1, "N": 4096, "K": 14336}, "gemv"),
        ({"M": 1, "N": 3584, "K": 18944}, "gemv"),
        ({"M": 1, "N": 28672, "K": 4096}, "gemv"),
        ({"M": 4, "N": 8, "K": 4096}, "gemv"),
        # The split-K tile: more rows, and the vocabulary heads.
        ({"M": 4, "N": 6144, "K": 4096}, "splitk"),
        ({"M": 4, "N": 4096, "K": 14336}, "splitk"),
        ({"M": 2, "N": 3584, "K": 3584}, "splitk"),
        (LM_HEAD_152K, "splitk"),
        ({"M": 4, "N": 28672, "K": 4096}, "splitk"),
        ({"M": 16, "N": 4096, "K": 14336}, "splitk"),
        ({"M": 16, "N": 8, "K": 4096}, "splitk"),
        ({"M": 17, "N": 4096, "K": 14336}, "tile"),
        ({"M": 4096, "N": 4096, "K": 4096}, "tile"),
        # A row of B that is not whole 16-byte vectors keeps the tile kernel.
        ({"M": 1, "N": 1003, "K": 4096}, "tile"),
    ],
)
def test_gemm_chooses_its_kernel_by_shape_on_hopper(shape, variant):
    assert tile_config(shape, CUDA, "bfloat16")["variant"] == variant


def test_decode_gemm_keeps_the_tile_kernel_without_clusters():
    assert tile_config(LM_HEAD_152K, AMPERE, "bfloat16")["variant"] == "tile"
    assert tile_config(LM_HEAD_152K, HIP, "float16")["variant"] == "tile"


@pytest.mark.parametrize(
    ("shape", "block_n", "ranks"),
    [
        ({"M": 4, "N": 4096, "K": 14336}, 64, 2),
        ({"M": 16, "N": 4096, "K": 4096}, 64, 2),
        ({"M": 16, "N": 3584, "K": 18944}, 64, 2),
        # 96 tiles: a second rank would put two blocks on some SMs.
        ({"M": 4, "N": 6144, "K": 4096}, 64, 1),
        # A router: one tile, 32 steps of K, 4 for each of 8 ranks.
        ({"M": 16, "N": 8, "K": 4096}, 64, 8),
        # 29 steps of K do not share evenly.
        ({"M": 16, "N": 4104, "K": 3592}, 64, 1),
        # Past two 64-column tiles per SM, 128 columns and no cluster.
        ({"M": 4, "N": 28672, "K": 4096}, 128, 1),
        (LM_HEAD_152K, 128, 1),
    ],
)
def test_split_k_tiles_split_k_while_every_block_has_an_sm(shape, block_n, ranks):
    config = tile_config(shape, CUDA, "float16")
    steps = -(-shape["K"] // config["block_k"])
    blocks = -(-shape["N"] // config["block_n"]) * config["ranks"]
    assert config["variant"] == "splitk"
    assert (config["block_n"], config["ranks"]) == (block_n, ranks)
    assert steps % ranks == 0 and (ranks == 1 or steps // ranks >= 4)
    assert ranks == 1 or blocks <= H200_SMS


@pytest.mark.parametrize(
    ("shape", "threads", "ranks"),
    [
        # 56 and 64 column tiles: 8 ranks give every SM two blocks.
        ({"M": 1, "N": 3584, "K": 18944}, 128, 8),
        ({"M": 1, "N": 4096, "K": 4096}, 128, 8),
        # 96 tiles: 4 ranks do.
        ({"M": 1, "N": 6144, "K": 4096}, 128, 4),
        # An odd number of 8-row chunks of K does not share evenly.
        ({"M": 1, "N": 4096, "K": 4104}, 128, 1),
        ({"M": 1, "N": 28672, "K": 4096}, 256, 1),
        ({"M": 1, "N": 14336, "K": 4096}, 256, 1),
    ],
)
def test_a_one_row_gemv_takes_64_columns_a_block(shape, threads, ranks):
    config = tile_config(shape, CUDA, "float16")
    assert config == dict(
        variant="gemv", lanes=8, threads=threads, unroll=8, ranks=ranks
    )


def test_a_router_gemv_splits_k_eight_ways():
    for rows in (1, 4):
        router = tile_config({"M": rows, "N": 8, "K": 4096}, CUDA, "bfloat16")
        assert router == dict(variant="gemv", lanes=2, threads=256, unroll=8, ranks=8)


def test_float32_gemm_and_attention_run_on_the_cuda_cores():
    assert tile_config({"M": 64, "N": 64, "K": 64}, CUDA, "float32")["variant"] == (
        "simt"
    )
    shape = dict(B=1, H=32, HKV=8, S=4096, D=128)
    assert attention_config(shape, CUDA, dtype="float32")["simt"]
    assert not attention_config(shape, CUDA, dtype="bfloat16")["simt"]


def test_few_long_rows_share_a_cluster_and_many_rows_do_not():
    assert split_ranks({"M": 3, "N": 1_000_003}, CUDA) == 16
    assert split_ranks({"M": 4096, "N": 4096}, CUDA) == 1
    assert split_ranks({"M": 3, "N": 1_000_003}, AMPERE) == 1
    # A row too short for two steps per block stays with one block.
    assert split_ranks({"M": 3, "N": 8192}, CUDA) == 1


@pytest.mark.parametrize(
    ("name", "shape", "dtype", "marker"),
    [
        ("gemm", {"M": 4, "N": 4096, "K": 14336}, "float16", "tm_cluster_sum("),
        ("gemm", {"M": 16, "N": 4096, "K": 14336}, "bfloat16", "mma_sync"),
        ("gemm", {"M": 1, "N": 3584, "K": 18944}, "bfloat16", "tm_cluster_sum("),
        ("gemm", {"M": 1, "N": 28672, "K": 4096}, "float16", "__shfl_xor_sync"),
        ("gemm", {"M": 4, "N": 8, "K": 4096}, "bfloat16", "tm_cluster_sum("),
        ("gemm", LM_HEAD_152K, "bfloat16", "mma_sync"),
        ("row_sum", {"M": 3, "N": 1_000_003}, "float32", "tm_cluster_sum("),
    ],
)
def test_decode_variants_lower_for_cuda_sm90a(tilelang, name, shape, dtype, marker):
    source = lower(get(name).program(shape, dtype, CUDA), CUDA)
    assert marker in source and "cooperative_groups" in source


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("gemm", {"M": 77, "N": 1003, "K": 1001}),
        ("attention", dict(B=2, H=4, HKV=2, S=77, D=64)),
        ("attention_causal", dict(B=2, H=4, HKV=2, S=77, D=64)),
    ],
)
def test_float32_kernels_lower_without_tensor_cores(tilelang, name, shape):
    source = lower(get(name).program(shape, "float32", CUDA), CUDA)
    assert "__global__" in source
    assert "mma" not in source and "tf32" not in source


@needs_nvcc
def test_the_152k_vocabulary_head_builds_with_nvcc_as_a_split_k_tile(tilelang):
    source = build(get("gemm").program(LM_HEAD_152K, "bfloat16", CUDA), CUDA)
    # B streams in by TMA into tensor-core mma; 16-row tiles, no cluster.
    assert "tma_load(B_desc" in source and "mma_sync" in source


@needs_nvcc
def test_a_decode_projection_builds_with_nvcc_as_a_gemv(tilelang):
    shape = {"M": 1, "N": 4096, "K": 4096}
    source = build(get("gemm").program(shape, "float16", CUDA), CUDA)
    # Each thread reads 16 bytes of B at a time, and the threads sharing
    # columns fold their sums together through warp shuffles.
    assert "*(uint4*)(B +" in source and "__shfl_xor_sync" in source


@needs_nvcc
def test_the_split_row_sum_builds_with_nvcc(tilelang):
    source = build(
        get("row_sum").program({"M": 3, "N": 1_000_003}, "float32", CUDA), CUDA
    )
    assert "tm_cluster_sync();" in source
