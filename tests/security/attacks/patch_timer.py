"""A correct kernel whose module stops the clock the harness times with, to
claim it takes no time at all."""

import time

import tilelang.cpu.language as T

time.perf_counter = lambda: 0.0
time.perf_counter_ns = lambda: 0


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
