"""Writes files of 200 MB into its HOME, each under the per-file limit,
until the disk is full: 2.4 GB went to the host's disk before a quota."""

import tilelang.cpu.language as T

chunk = b"\0" * 2**20
for number in range(12):
    with open(f"fill-{number}.bin", "wb") as stream:
        for _ in range(200):
            stream.write(chunk)


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
