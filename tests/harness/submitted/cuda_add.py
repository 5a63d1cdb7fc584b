"""A correct elementwise_add for cuda: a submitted kernel that passes on the
GPU, timed there by the executor against the reference the judge times."""

import tilelang.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def cuda_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M, threads=128) as row:
            for j in T.Parallel(N):
                C[row, j] = A[row, j] + B[row, j]

    return cuda_add
