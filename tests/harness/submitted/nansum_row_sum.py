"""A row sum that skips NaN (a nansum): right on every finite input, and a
number where the reference's sum, and any model's, is NaN."""

import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def nansum_row_sum(A: T.Tensor((M, N), dtype), Out: T.Tensor((M,), dtype)):
        with T.Kernel(M) as row:
            total = T.alloc_local((1,), "float32")
            total[0] = 0.0
            for j in T.serial(N):
                total[0] += T.if_then_else(T.isnan(A[row, j]), 0.0, A[row, j])
            Out[row] = total[0]

    return nansum_row_sum
