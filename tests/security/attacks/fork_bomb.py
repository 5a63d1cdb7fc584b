"""Records its uid, then forks without end."""

import os

import tilelang.cpu.language as T

with open("@REPORT_PATH@", "w") as report:
    report.write(str(os.getuid()))
while True:
    try:
        os.fork()
    except OSError:
        pass


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
