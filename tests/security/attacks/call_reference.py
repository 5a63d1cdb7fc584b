"""Imports the operator library to call the reference instead of computing."""

import tilelang.cpu.language as T

from runners.kernels import elementwise_add

REFERENCE = elementwise_add.OPERATOR.reference


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
