"""Starts a process in a session of its own (outside the process group killed on timeout), then hangs."""

import subprocess
import time

import tilelang.cpu.language as T

sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
with open("@REPORT_PATH@", "w") as report:
    report.write(str(sleeper.pid))
time.sleep(600)


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
                C[i, j] = A[i, j] + B[i, j]

    return good_add
