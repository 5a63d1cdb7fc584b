"""A "kernel" that hands the executor's own Python a line to run: the
outputs computed by torch, in the process that runs and times the kernel."""

import tilelang.cpu.language as T

LINE = (
    "import gc, torch\n"
    "for t in [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]: pass\n"
)


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def extern_python(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            T.evaluate(T.call_extern("int32", "PyRun_SimpleString", LINE))
            for j in T.serial(N):
                C[i, j] = A[i, j] - B[i, j]

    return extern_python
