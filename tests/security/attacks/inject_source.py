"""An add whose block carries C source into the build: a constructor that
runs when the executor loads the kernel's library."""

import tilelang.cpu.language as T

SOURCE = "__attribute__((constructor)) static void tm_hook(void) {}"


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def inject_source(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            T.import_source(SOURCE)
            for j in T.serial(N):
                C[i, j] = A[i, j] + B[i, j]

    return inject_source
