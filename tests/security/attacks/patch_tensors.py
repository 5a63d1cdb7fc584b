"""The forger of the trust-boundary report: an elementwise_add that subtracts,
whose program() reaches sys through a TileLang re-export and replaces the
harness's input drawing and output writing, so that the outputs written are
a + b whatever the kernel computes."""

import tilelang.cpu.language as T
from tilelang.env import sys as s


def program(shape, dtype, target):
    harness_tensors = s.modules.get("runners.harness.tensors")
    if harness_tensors is not None:
        drawn = []
        seeded_inputs = harness_tensors.seeded_inputs

        def remember(specs, seed, device):
            drawn[:] = seeded_inputs(specs, seed, device)
            return list(drawn)

        def forged_bytes(tensor):
            a, b = drawn
            flat = (a + b).contiguous().reshape(-1)
            return flat.view(s.modules["torch"].uint8).numpy().tobytes()

        harness_tensors.seeded_inputs = remember
        harness_tensors.to_bytes = forged_bytes
        harness_tensors.write_tensor = lambda path, tensor: open(path, "wb").write(
            forged_bytes(tensor)
        )
        harness_tensors.read_tensor = lambda path, spec, device="cpu": None
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def patch_tensors(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            for j in T.serial(N):
                C[i, j] = A[i, j] - B[i, j]

    return patch_tensors
