"""Echoes every secret it can reach in a compile error: the environment, the
Django settings module (which reads the secret key file), and the key files
named by the test."""

import os

import tilelang.cpu.language as T

found = [f"{name}={value}" for name, value in os.environ.items()]
try:
    import matrix.settings

    found.append("settings " + matrix.settings.SECRET_KEY)
except Exception as exc:
    found.append(f"settings unavailable: {exc!r}")
for path in ("@KEY_PATH@", "@SECRET_KEY_PATH@"):
    try:
        with open(path) as secret:
            found.append(secret.read())
    except OSError as exc:
        found.append(repr(exc))
raise RuntimeError("echo: " + " | ".join(found))


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def echo(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            for j in T.serial(N):
                C[i, j] = A[i, j] + B[i, j]

    return echo
