"""A kernel that subtracts, whose module replaces the JITKernel call with one
that writes cached correct outputs (a + b, computed in Python) instead of
running the kernel."""

import sys

import tilelang.cpu.language as T

_kernel_class = sys.modules["tilelang.jit.kernel"].JITKernel


def _replay(self, *tensors):
    a, b, *outputs = tensors
    outputs[0].copy_(a + b)


_kernel_class.__call__ = _replay


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def cache_outputs(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            for j in T.serial(N):
                C[i, j] = A[i, j] - B[i, j]

    return cache_outputs
