"""Starts a process in a session of its own (outside the process group killed
on timeout), with a token the test fills in on its command line, then
hangs."""

import subprocess
import time

import tilelang.cpu.language as T

subprocess.Popen(["sleep", "@SLEEP@"], start_new_session=True)
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
