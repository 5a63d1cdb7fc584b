"""Reports the environment names and any secret values it can see."""

import os

import tilelang.cpu.language as T

raise RuntimeError(
    "environment probe " + " ".join(f"{k}={v}" for k, v in os.environ.items())
)


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
