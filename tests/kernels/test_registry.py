from __future__ import annotations

import pytest
import torch

from runners.kernels import OPERATORS, get
from runners.kernels.base import MalformedShape, Unsupported

from .conftest import CUDA, METAL, C

EXPECTED = {
    "elementwise_add",
    "row_sum",
    "softmax",
    "rmsnorm",
    "gemm",
    "attention",
    "attention_causal",
}


def test_registry_holds_every_operator_under_its_name():
    assert set(OPERATORS) == EXPECTED
    for name, op in OPERATORS.items():
        assert get(name) is op and op.name == name


def test_unknown_operator_raises_key_error_naming_the_known_ones():
    with pytest.raises(KeyError, match="unknown operator 'matmul'.*gemm"):
        get("matmul")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_operator_declares_c_and_gpu_kernels_and_tolerances(name):
    op = OPERATORS[name]
    assert op.dtypes["c"] == ("float32",)
    assert {"float16", "bfloat16"} <= set(op.dtypes["cuda"])
    assert set(op.dtypes["hip"]) == set(op.dtypes["cuda"])
    for backend in op.dtypes:
        for dtype in op.dtypes[backend]:
            tol = op.tolerances[dtype]
            assert tol.reason and 0 < tol.rel_err < 0.05
    op.validate_shape(op.default_shape)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inputs_are_seeded_and_never_zero(name):
    op = OPERATORS[name]
    shape = {d: 3 for d in op.dims} | ({"HKV": 3} if "HKV" in op.dims else {})
    first = op.make_inputs(shape, "float16", seed=7)
    again = op.make_inputs(shape, "float16", seed=7)
    other = op.make_inputs(shape, "float16", seed=8)
    specs = op.inputs(shape, "float16")
    assert [tuple(t.shape) for t in first] == [s.shape for s in specs]
    for a, b, c in zip(first, again, other, strict=True):
        assert a.dtype == torch.float16
        assert torch.equal(a, b) and not torch.equal(a, c)
        assert bool((a != 0).all())


def test_gemm_inputs_shrink_with_k_so_outputs_stay_order_one():
    op = get("gemm")
    shape = {"M": 64, "N": 64, "K": 4096}
    a, b = op.make_inputs(shape, "float32", seed=0)
    (c,) = op.reference(a.double(), b.double())
    assert 0.05 < c.abs().mean().item() < 2


def test_attention_refuses_heads_that_do_not_form_whole_groups():
    op = get("attention")
    with pytest.raises(Unsupported, match="multiple of HKV"):
        op.check({"B": 1, "H": 6, "HKV": 4, "S": 8, "D": 64}, "float16", CUDA)


def test_attention_refuses_head_dims_tensor_cores_cannot_take():
    op = get("attention_causal")
    with pytest.raises(Unsupported, match="head dim"):
        op.check({"B": 1, "H": 2, "HKV": 1, "S": 8, "D": 72}, "float16", CUDA)


def test_attention_has_no_metal_kernel_and_says_so():
    with pytest.raises(Unsupported, match="no kernel for backend 'metal'"):
        get("attention").check(get("attention").default_shape, "float16", METAL)


def test_half_types_are_refused_on_the_cpu():
    with pytest.raises(Unsupported, match="float32"):
        get("softmax").check({"M": 2, "N": 2}, "float16", C)


def test_gpu_gemm_and_attention_take_float32():
    # On the CUDA cores in float32 FMA (tests/kernels/test_decode_variants.py),
    # not as tf32 on the tensor cores.
    get("gemm").check({"M": 64, "N": 64, "K": 64}, "float32", CUDA)
    get("attention").check(dict(B=1, H=2, HKV=1, S=64, D=64), "float32", CUDA)


def test_malformed_shapes_are_rejected():
    with pytest.raises(MalformedShape):
        get("gemm").validate_shape({"M": 4, "N": 4})
