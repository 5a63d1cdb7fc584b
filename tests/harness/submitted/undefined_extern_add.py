"""elementwise_add that calls a C function nobody defines: the executor
refuses the extern call before anything is built."""

import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def undefined_extern_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            for j in T.serial(N):
                C[i, j] = T.call_extern(dtype, "tm_no_such_function", A[i, j], B[i, j])

    return undefined_extern_add
