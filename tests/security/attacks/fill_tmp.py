"""Writes files of 100 MB into /tmp and /dev/shm, each under the per-file
limit and outside its HOME's quota, until 1.2 GB: the host's disk and memory
if either were the host's own."""

import tilelang.cpu.language as T

chunk = b"\0" * 2**20
stopped = []
for where in ("/dev/shm", "/tmp"):
    try:
        for number in range(12):
            with open(f"{where}/@TOKEN@-{number}.bin", "wb") as stream:
                for _ in range(100):
                    stream.write(chunk)
    except OSError as exc:
        stopped.append(f"{where}: {exc.strerror}")
if stopped:
    raise RuntimeError("stopped at " + "; ".join(stopped))


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
