"""Right inside the sandbox, wrong everywhere else: it asks getuid() which
side it is on (the sandbox gives its children uids of their own)."""

import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def detect_sandbox(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            for j in T.serial(N):
                if T.call_extern("int32", "getuid") >= 1000:
                    C[i, j] = A[i, j] + B[i, j]
                else:
                    C[i, j] = A[i, j] - B[i, j]

    return detect_sandbox
