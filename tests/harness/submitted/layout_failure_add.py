"""elementwise_add whose fragment layout cannot be inferred on the CPU: a
compile error raised by a TileLang pass (LayoutInference)."""

import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def layout_failure_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(1) as _:
            S = T.alloc_shared((M, N), dtype)
            W = T.alloc_shared((N, N), dtype)
            F = T.alloc_fragment((M, N), dtype)  # CANARY_LINE
            T.copy(A, S)
            T.clear(W)
            T.clear(F)
            T.gemm(S, W, F)
            T.copy(F, C)

    return layout_failure_add
