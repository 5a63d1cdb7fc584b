"""softmax with its row maximum started at float32's lowest finite value
instead of -inf: it lowers on TileLang releases that have no lowering for
``tl.infinity`` (0.1.13, 0.1.14) as well as on 0.1.15."""

import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def finite_softmax(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M) as row:
            top = T.alloc_local((1,), "float32")
            total = T.alloc_local((1,), "float32")
            top[0] = -3.4028234663852886e38
            total[0] = 0.0
            for j in T.serial(N):
                top[0] = T.max(top[0], X[row, j])
            for j in T.serial(N):
                total[0] += T.exp(X[row, j] - top[0])
            for j in T.serial(N):
                Y[row, j] = T.exp(X[row, j] - top[0]) / total[0]

    return finite_softmax
