"""An add that takes the address of its input: a pointer is the first step
to memory beyond the kernel's tensors."""

import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def address_of_input(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            T.evaluate(T.address_of(A[i, 0]))
            for j in T.serial(N):
                C[i, j] = A[i, j] + B[i, j]

    return address_of_input
