"""elementwise_add that reads its inputs but never stores to C."""

import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def unwritten_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            acc = T.alloc_local((1,), dtype)
            acc[0] = 0.0
            for j in T.serial(N):
                acc[0] += A[i, j] + B[i, j]

    return unwritten_add
