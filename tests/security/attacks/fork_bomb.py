"""Forks without end; each child becomes a sleeping process whose command
line holds a token the test fills in, so the test can look for survivors."""

import os

import tilelang.cpu.language as T

while True:
    try:
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "@SLEEP@"])
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
                C[i, j] = A[i, j] + B[i, j]

    return good_add
