"""elementwise_add for cuda that stores far outside C, at an offset read from
its input so that no compiler pass can see it coming, with TileLang's guard
against out-of-bounds accesses switched off: an illegal address. The TIR
check refuses it before it is built (a submission may not set pass
configs)."""

import tilelang.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def illegal_address_add(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M, threads=32) as row:
            for j in T.Parallel(N):
                far = T.cast(T.abs(T.cast(A[row, j], "float32")) * 1e9, "int32")
                C[row + far, j] = A[row, j] + B[row, j]

    unguarded = {"tl.disable_safe_memory_legalize": True}
    return illegal_address_add.with_attr("tilelang_pass_configs", unguarded)
