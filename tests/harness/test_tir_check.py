"""The executor's check of a submitted PrimFunc (runners.harness.tir_check),
on real TileLang programs: the operator library's tile kernels pass it, and
what reaches past TIR or reads an output is refused with its line."""

from __future__ import annotations

import pytest

from runners import kernels
from runners.harness.tir_check import tir_check

SM90 = {"kind": "cuda", "arch": "sm_90a"}


def _program(body: str, *, outputs: int = 1):
    """A cuda elementwise kernel of 256 x 256 whose block body is ``body``."""
    import tilelang.language as T

    namespace = {"T": T}
    source = f"""
@T.prim_func
def kernel(
    A: T.Tensor((256, 256), "float32"),
    B: T.Tensor((256, 256), "float32"),
    C: T.Tensor((256, 256), "float32"),
):
    with T.Kernel(2, threads=128) as bx:
        tile = T.alloc_fragment((128, 256), "float32")
{body}
"""
    path = _program.tmp / f"k{abs(hash(body))}.py"
    path.write_text("import tilelang.language as T\n" + source)
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return tir_check(namespace["kernel"], outputs=outputs)


@pytest.fixture(autouse=True)
def _source_dir(tmp_path):
    # TileLang parses a kernel from its source file.
    _program.tmp = tmp_path


@pytest.mark.parametrize(
    ("operator", "shape"),
    [
        ("elementwise_add", None),
        ("softmax", None),
        ("rmsnorm", None),
        ("gemm", None),
        ("row_sum", None),
        ("softmax", {"M": 4096, "N": 37}),
    ],
)
def test_the_library_tile_kernels_for_hopper_pass(operator, shape):
    op = kernels.get(operator)
    shape = shape or dict(op.default_shape)
    func = op.program(shape, "float16", SM90)
    assert tir_check(func, outputs=len(op.outputs(shape, "float16"))) == []


def test_copying_into_an_output_is_a_write_not_a_read():
    body = """\
        T.copy(A[bx * 128, 0], tile)
        T.copy(tile, C[bx * 128, 0])"""
    assert _program(body) == []


def test_copying_out_of_an_output_is_a_read():
    body = """\
        T.copy(C[bx * 128, 0], tile)
        T.copy(tile, C[bx * 128, 0])"""
    (refusal,) = _program(body)
    assert refusal.construct.startswith("C[")
    assert "outputs are written, never read" in refusal.reason
    assert refusal.line > 0


def test_an_input_is_not_an_output():
    body = """\
        T.copy(B[bx * 128, 0], tile)
        T.copy(tile, C[bx * 128, 0])"""
    assert _program(body, outputs=1) == []
    # The same program, told that B is an output too, reads one.
    (refusal,) = _program(body, outputs=2)
    assert "B is an output" in refusal.reason


def test_inline_assembly_is_refused():
    body = """\
        T.copy(A[bx * 128, 0], tile)
        T.ptx_fence_barrier_init()
        T.copy(tile, C[bx * 128, 0])"""
    refusals = _program(body)
    assert [r.reason for r in refusals] == [
        "inline assembly is native code outside TIR's operators"
    ]


def test_function_attributes_beyond_its_name_are_refused():
    import tilelang.language as T

    @T.prim_func
    def kernel(A: T.Tensor((4,), "float32"), C: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=4) as _:
            T.copy(A, C)

    assert tir_check(kernel, outputs=1) == []
    (refusal,) = tir_check(kernel.with_attr("calling_conv", 2), outputs=1)
    assert refusal.construct == "calling_conv"
    assert "the compiler's" in refusal.reason
