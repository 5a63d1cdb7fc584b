"""On a CUDA host (the H200): the decode variants, the split row sum and the
float32 kernels pass against the float64 reference through the harness, on
poisoned outputs, at the shapes that choose them."""

from __future__ import annotations

import pytest

from runners.harness.sandbox import run_batch
from tests.harness.helpers import CACHE_ROOT, library_job

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = {"target": {"kind": "cuda", "arch": "sm_90a"}}
CELLS = [
    # split-K tensor-core tile of 128 columns, N not a multiple of the tile
    library_job("gemm", {"M": 1, "N": 151936, "K": 3584}, dtype="bfloat16", **CUDA),
    # gemv, K split across a cluster of 8
    library_job("gemm", {"M": 1, "N": 3584, "K": 3584}, dtype="bfloat16", **CUDA),
    # router gemv, K's 449 chunks not a multiple of the 8 ranks
    library_job("gemm", {"M": 4, "N": 8, "K": 3592}, dtype="float16", **CUDA),
    # split-K tile of 64 columns over 2 ranks, N not a multiple of the tile
    library_job("gemm", {"M": 16, "N": 4104, "K": 4096}, dtype="bfloat16", **CUDA),
    library_job("row_sum", {"M": 3, "N": 1_000_003}, dtype="float32", **CUDA),
    library_job("row_sum", {"M": 3, "N": 1_000_003}, dtype="bfloat16", **CUDA),
    library_job("gemm", {"M": 77, "N": 1003, "K": 1001}, dtype="float32", **CUDA),
    library_job(
        "attention", dict(B=2, H=4, HKV=2, S=77, D=64), dtype="float32", **CUDA
    ),
    library_job(
        "attention_causal",
        dict(B=1, H=8, HKV=2, S=300, D=128),
        dtype="float32",
        **CUDA,
    ),
]


@pytest.fixture(scope="module")
def results():
    cache = CACHE_ROOT / "tests-gpu"
    cache.mkdir(parents=True, exist_ok=True)
    return run_batch(CELLS, cache_dir=str(cache))


@pytest.mark.parametrize("index", range(len(CELLS)))
def test_variant_passes_against_the_float64_reference(results, index):
    result = results[index]
    assert result["status"] == "pass", result["error"]
    assert result["timings"]["kernel_ms"] > 0
