"""Compile-only evidence for the GPU kernels, no device needed: every kernel
lowers for cuda sm_90a and hip gfx942 at a served and a ragged shape, builds
with nvcc for sm_90a, and lowers for metal where it has a metal kernel."""

from __future__ import annotations

import shutil

import pytest

from runners.kernels import OPERATORS, get
from runners.kernels.toolchain import build, lower

from .conftest import CUDA, HIP, METAL

SERVED = {
    "elementwise_add": {"M": 512, "N": 4096},
    "row_sum": {"M": 512, "N": 4096},
    "softmax": {"M": 16, "N": 128256},
    "rmsnorm": {"M": 512, "N": 4096},
    "gemm": {"M": 4096, "N": 6144, "K": 4096},
    "attention": dict(B=1, H=32, HKV=8, S=4096, D=128),
    "attention_causal": dict(B=1, H=32, HKV=8, S=512, D=128),
}
RAGGED = {
    "elementwise_add": {"M": 37, "N": 1001},
    "row_sum": {"M": 37, "N": 1001},
    "softmax": {"M": 37, "N": 1001},
    "rmsnorm": {"M": 3, "N": 20001},
    "gemm": {"M": 77, "N": 1003, "K": 1001},
    "attention": dict(B=2, H=4, HKV=2, S=77, D=64),
    "attention_causal": dict(B=2, H=4, HKV=2, S=77, D=64),
}
NAMES = sorted(OPERATORS)


@pytest.mark.parametrize("name", NAMES)
def test_gpu_kernel_lowers_for_cuda_at_a_ragged_shape(tilelang, name):
    source = lower(get(name).program(RAGGED[name], "bfloat16", CUDA), CUDA)
    assert "__global__" in source


@pytest.mark.parametrize("shape_kind", ["served", "ragged"])
@pytest.mark.parametrize("name", NAMES)
def test_gpu_kernel_lowers_for_hip(tilelang, name, shape_kind):
    shape = (SERVED if shape_kind == "served" else RAGGED)[name]
    source = lower(get(name).program(shape, "float16", HIP), HIP)
    assert "__global__" in source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", NAMES)
def test_gpu_kernel_builds_with_nvcc_for_sm90a_at_a_served_shape(tilelang, name):
    source = build(get(name).program(SERVED[name], "float16", CUDA), CUDA)
    assert "__global__" in source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_vocabulary_softmax_reads_each_row_once_through_a_cluster_on_hopper(tilelang):
    # A ragged row past the resident limit: sm_90a shares it among a cluster
    # of blocks that swap their (max, sum) through distributed shared memory;
    # sm_80 has no clusters and streams the row twice.
    shape = {"M": 3, "N": 20001}
    hopper = build(get("softmax").program(shape, "float32", CUDA), CUDA)
    assert "tm_cluster_max(" in hopper
    ampere = {"kind": "cuda", "arch": "sm_80"}
    streamed = build(get("softmax").program(shape, "float32", ampere), ampere)
    assert "__global__" in streamed and "tm_cluster" not in streamed


def test_vocabulary_softmax_uses_clusters_past_hopper_too(tilelang):
    # The arch's number, not its first two digits: sm_100a is not "sm_10".
    blackwell = {"kind": "cuda", "arch": "sm_100a"}
    source = lower(
        get("softmax").program({"M": 3, "N": 20001}, "float32", blackwell), blackwell
    )
    assert "tm_cluster_max(" in source


METAL_NAMES = [n for n in NAMES if "metal" in OPERATORS[n].builders]


def test_metal_kernels_cover_all_but_attention():
    assert METAL_NAMES == ["elementwise_add", "gemm", "rmsnorm", "row_sum", "softmax"]


@pytest.mark.parametrize("name", METAL_NAMES)
def test_kernel_lowers_for_metal_at_a_ragged_shape(tilelang, name):
    source = lower(get(name).program(RAGGED[name], "float16", METAL), METAL)
    assert "#include <metal_stdlib>" in source and f"{name}_kernel" in source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_fresh_cuda_kernel_leaves_the_build_with_its_host_library_linked(
    tilelang, tmp_path, monkeypatch
):
    """No GPU here: what is checked is that the link TileLang would run at
    a fresh kernel's first call (0.2 s a kernel on the H100's host, inside
    the device turn) ran in the build, so the first call finds it made."""
    from tvm.contrib import cc

    from runners.harness.job import parse_job
    from runners.harness.stages import compile_program

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))  # fresh: no cache hit
    job = parse_job(
        {
            "operator": "elementwise_add",
            "shape": {"M": 64, "N": 256},
            "dtype": "float16",
            "target": CUDA,
            "stage": "validate",
            "seed": 1,
        }
    )
    program = get("elementwise_add").program(job["shape"], "float16", CUDA)
    kernel, source = compile_program(job, lambda: program, {}, lambda stage: None)
    assert "__global__" in source

    def no_compiler(*args, **kwargs):
        raise AssertionError("the host library was linked at the first call")

    monkeypatch.setattr(cc, "create_shared", no_compiler)
    # What the kernel's first call runs before it launches (tvm_ffi adapter).
    executable = kernel.adapter.get_exportable_executable()
    assert executable.jit().get_function("main", query_imports=True) is not None
