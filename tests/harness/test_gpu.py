"""On a CUDA host (the H200): library kernels validate and are timed against
the reference in the same run, the fingerprint names the device, a
submitted kernel passes and is timed on the GPU through its three sandboxed
children, and an illegal address is that job's runtime_error while the next
job runs on."""

from __future__ import annotations

import shutil

import pytest

from runners.harness.sandbox import run_batch
from tests.harness.helpers import CACHE_ROOT, library_job, submitted_job

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = {"target": {"kind": "cuda", "arch": "sm_90a"}}
CELLS = [
    library_job("elementwise_add", {"M": 4096, "N": 4096}, dtype="float16", **CUDA),
    library_job("softmax", {"M": 1000, "N": 3000}, dtype="bfloat16", **CUDA),
    library_job("rmsnorm", {"M": 4096, "N": 4096}, dtype="float16", **CUDA),
    library_job("row_sum", {"M": 4096, "N": 1000}, dtype="float32", **CUDA),
    library_job("gemm", {"M": 4096, "N": 4096, "K": 4096}, dtype="float16", **CUDA),
    library_job("gemm", {"M": 1000, "N": 1000, "K": 1000}, dtype="bfloat16", **CUDA),
]


@pytest.fixture(scope="module")
def results():
    submitted = submitted_job("cuda_add", {"M": 4096, "N": 4096}, **CUDA)
    submitted["dtype"] = "float16"
    illegal = submitted_job("illegal_address_add", {"M": 64, "N": 64}, **CUDA)
    illegal["dtype"] = "float16"
    after = library_job("elementwise_add", {"M": 64, "N": 64}, dtype="float16", **CUDA)
    cache = CACHE_ROOT / "tests-gpu"
    cache.mkdir(parents=True, exist_ok=True)
    return run_batch([*CELLS, submitted, illegal, after], cache_dir=str(cache))


# A runner without bubblewrap refuses submitted kernels (infra_error, naming
# the missing sandbox): the H200 lab runs without it (docs/deploy.md).
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="submitted kernels need bubblewrap"
)


@pytest.mark.parametrize("index", range(len(CELLS)))
def test_library_kernels_pass_and_are_timed(results, index):
    result = results[index]
    assert result["status"] == "pass", result["error"]
    timings = result["timings"]
    assert timings["kernel_ms"] > 0 and timings["reference_ms"] > 0
    assert timings["speedup"] == pytest.approx(
        timings["reference_ms"] / timings["kernel_ms"]
    )
    assert timings["gbps"] > 0
    if result["operator"] == "gemm":
        assert timings["tflops"] > 1


def test_the_fingerprint_names_the_gpu(results):
    components = results[0]["fingerprint"]["components"]
    assert components["gpu_name"] and components["driver"].startswith("nvidia ")
    assert components["gpu_arch"].startswith("sm_")
    assert components["torch_cuda"] and components["nvcc"]


@needs_bwrap
def test_a_submitted_kernel_passes_and_is_timed_on_the_gpu(results):
    result = results[len(CELLS)]
    assert result["status"] == "pass", result["error"]
    assert result["timings"]["kernel_ms"] > 0
    assert result["timings"]["reference_ms"] > 0
    assert result["timing_trust"].startswith("submitted: ")
    assert result["sandbox"].startswith("full: ")


@needs_bwrap
def test_a_kernel_that_switches_off_the_bounds_guard_is_refused_and_the_next_runs(
    results,
):
    # It stored far outside its output, an illegal address, until the TIR
    # check refused pass configs in a submission: TileLang's guard against
    # out-of-bounds accesses stays on, so its stores stay within C.
    illegal, after = results[-2:]
    assert illegal["status"] == "compile_error", illegal["error"]
    assert "tilelang_pass_configs" in illegal["error"]["message"]
    assert after["status"] == "pass", after["error"]


def test_inputs_made_on_the_gpu_equal_those_made_on_the_cpu():
    from runners.harness.tensors import seeded_inputs

    specs = [
        {"shape": [4096, 3000], "dtype": dtype, "scale": 0.3, "positive": positive}
        for dtype in ("float16", "bfloat16", "float32")
        for positive in (False, True)
    ]
    on_gpu = seeded_inputs(specs, seed=2**62 + 9, device="cuda")
    on_cpu = seeded_inputs(specs, seed=2**62 + 9, device="cpu")
    for gpu, cpu in zip(on_gpu, on_cpu, strict=True):
        assert torch.equal(gpu.cpu(), cpu)
