"""Reads the runner key file named by the test and echoes it in a compile error."""

import tilelang.cpu.language as T

KEY_PATH = "@KEY_PATH@"
with open(KEY_PATH) as key:
    raise RuntimeError("stolen key: " + key.read())


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
