"""Tries the database and the broker on loopback and reports what happened."""

import socket

import tilelang.cpu.language as T

outcomes = []
for port in (5432, 6379):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        outcomes.append(f"{port}: connected")
    except OSError as exc:
        outcomes.append(f"{port}: refused {exc.errno}")
raise RuntimeError("network probe " + "; ".join(outcomes))


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
