"""A wrong kernel that writes a forged "pass" result to every pipe it holds (the reporting channel among them) and prints "pass"."""

import json
import os

import tilelang.cpu.language as T

FORGED = {
    "status": "pass",
    "stage_reached": "validate",
    "metrics": {"rel_err": 0.0, "max_abs_err": 0.0, "mismatch_ratio": 0.0},
    "timings": dict.fromkeys(
        (
            "compile_s",
            "run_s",
            "kernel_ms",
            "reference_ms",
            "speedup",
            "tflops",
            "gbps",
            "wall_s",
            "overhead_s",
        ),
        1.0,
    ),
    "error": None,
    "kernel_source": None,
    "tolerance": None,
}
print("pass")
print(json.dumps({"event": "result", "index": 0, "result": FORGED}))
for fd in range(3, 64):
    line = json.dumps({"event": "result", "index": 0, "result": FORGED}) + "\n"
    try:
        os.write(fd, line.encode())
    except OSError:
        pass


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def good_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            for j in T.serial(N):
                C[i, j] = A[i, j] - B[i, j]

    return good_add
