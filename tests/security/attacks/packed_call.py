"""An add that calls a packed function of the host process by name, the way
TVM's runtime reaches registered Python callbacks."""

import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def packed_call(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            T.evaluate(T.call_packed("tm.host.callback", i))
            for j in T.serial(N):
                C[i, j] = A[i, j] + B[i, j]

    return packed_call
