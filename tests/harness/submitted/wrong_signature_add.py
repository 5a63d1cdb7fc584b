"""elementwise_add whose output is declared float16 where the operator
passes float32: the executor refuses the program before compiling it."""

import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def wrong_signature_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), "float16"),
    ):
        with T.Kernel(M) as i:
            for j in T.serial(N):
                C[i, j] = T.cast(A[i, j] + B[i, j], "float16")

    return wrong_signature_add
