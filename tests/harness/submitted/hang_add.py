"""A kernel that never finishes. program() first starts a sleeping process
whose command line holds a token the test fills in, so that the test can
look for it on the host once the job is over."""

import subprocess

import tilelang.cpu.language as T


def program(shape, dtype, target):
    subprocess.Popen(["sleep", "@SLEEP@"])
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def hang_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            total = T.alloc_local((1,), dtype)
            total[0] = 0.0
            for _ in T.serial(2147483647):
                for _ in T.serial(2147483647):
                    for j in T.serial(N):
                        total[0] = total[0] + A[i, j] + B[i, j]
            for j in T.serial(N):
                C[i, j] = total[0]

    return hang_add
