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
        # The gemv: one to four rows against weights of up to 8192 columns.
        ({"M": 1, "N": 4096, "K": 14336}, "gemv"),
        ({"M": 4, "N": 6144, "K": 4096}, "gemv"),
        # The split-K tile: longer K, wider weights, sixteen rows.
        ({"M": 4, "N": 4096, "K": 14336}, "splitk"),
        ({"M": 1, "N": 3584, "K": 18944}, "splitk"),
        (LM_HEAD_152K, "splitk"),
        ({"M": 4, "N": 28672, "K": 4096}, "splitk"),
        ({"M": 16, "N": 4096, "K": 14336}, "splitk"),
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
    ("shape", "ranks"),
    [
        ({"M": 4, "N": 4096, "K": 14336}, 8),
        ({"M": 16, "N": 4096, "K": 4096}, 8),
        # 148 steps of K share evenly among 4 ranks, not 8.
        ({"M": 1, "N": 3584, "K": 18944}, 4),
        ({"M": 16, "N": 3584, "K": 18944}, 4),
    ],
)
def test_split_k_tiles_split_k_until_every_sm_has_two_blocks(shape, ranks):
    config = tile_config(shape, CUDA, "float16")
    steps = -(-shape["K"] // config["block_k"])
    blocks = -(-shape["N"] // config["block_n"]) * config["ranks"]
    assert config["variant"] == "splitk" and config["ranks"] == ranks
    assert blocks >= 2 * H200_SMS or steps % (2 * ranks)


def test_a_gemv_splits_k_across_a_cluster_only_for_a_few_columns():
    assert tile_config({"M": 1, "N": 4096, "K": 4096}, CUDA, "float16")["ranks"] == 1
    router = tile_config({"M": 1, "N": 8, "K": 4096}, CUDA, "float16")
    assert router["variant"] == "gemv" and router["ranks"] == 8


def test_a_vocabulary_head_needs_no_cluster():
    assert tile_config(LM_HEAD_152K, CUDA, "bfloat16")["ranks"] == 1


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
