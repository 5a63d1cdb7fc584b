"""A kernel that never finishes. Before it hangs, program() records its
process group and starts a grandchild there (a sleeping process), so a test
can check that a timeout leaves neither behind. The test fills in the
report path."""

import os
import subprocess

import tilelang.cpu.language as T

REPORT_PATH = "@REPORT_PATH@"


def program(shape, dtype, target):
    sleeper = subprocess.Popen(["sleep", "600"])
    with open(REPORT_PATH, "w") as report:
        report.write(f"{os.getpgid(0)} {sleeper.pid}\n")
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def hang_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            for _ in T.serial(2147483647):
                for _ in T.serial(2147483647):
                    for j in T.serial(N):
                        C[i, j] = C[i, j] + A[i, j] + B[i, j]

    return hang_add
