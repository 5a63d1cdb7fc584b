"""Every CPU kernel, compiled by TileLang for target c and run against the
float32 reference on regular and ragged shapes."""

from __future__ import annotations

import pytest
import torch

from runners.kernels import get
from runners.kernels.toolchain import compile_kernel

from .conftest import C

SHAPES = {
    "elementwise_add": [{"M": 64, "N": 128}, {"M": 1, "N": 1}, {"M": 37, "N": 1001}],
    "row_sum": [{"M": 64, "N": 128}, {"M": 1, "N": 1}, {"M": 37, "N": 1001}],
    "softmax": [{"M": 64, "N": 128}, {"M": 1, "N": 1}, {"M": 37, "N": 1001}],
    "rmsnorm": [{"M": 64, "N": 128}, {"M": 1, "N": 1}, {"M": 37, "N": 1001}],
    "gemm": [
        {"M": 64, "N": 64, "K": 128},
        {"M": 1, "N": 1, "K": 1},
        {"M": 37, "N": 19, "K": 101},
    ],
    "attention": [
        dict(B=1, H=4, HKV=2, S=64, D=32),
        dict(B=1, H=1, HKV=1, S=1, D=1),
        dict(B=2, H=3, HKV=1, S=37, D=24),
    ],
    "attention_causal": [
        dict(B=1, H=4, HKV=2, S=64, D=32),
        dict(B=1, H=1, HKV=1, S=1, D=1),
        dict(B=2, H=3, HKV=1, S=37, D=24),
    ],
}
CASES = [(name, shape) for name, shapes in SHAPES.items() for shape in shapes]


def _id(case):
    name, shape = case
    return name + "-" + "x".join(str(v) for v in shape.values())


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_cpu_kernel_matches_the_reference(tilelang, case):
    name, shape = case
    op = get(name)
    kernel = compile_kernel(op.program(shape, "float32", C), C)
    inputs = op.make_inputs(shape, "float32", seed=1)
    outputs = [
        torch.full(spec.shape, float("nan")) for spec in op.outputs(shape, "float32")
    ]
    kernel(*inputs, *outputs)
    tol = op.tolerances["float32"]
    for out, ref in zip(outputs, op.reference(*inputs), strict=True):
        assert not out.isnan().any(), "kernel left outputs unwritten"
        rel = ((out - ref).norm() / ref.norm()).item()
        assert rel <= tol.rel_err
        mismatch = (out - ref).abs() > tol.atol + tol.rtol * ref.abs()
        assert mismatch.double().mean().item() <= tol.max_mismatch_ratio
