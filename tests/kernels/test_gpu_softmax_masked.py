"""On a CUDA host: softmax over a vocabulary row whose first third is masked
(-inf, as a left-padded batch's or a constrained decoder's mask) is right on
both long-row kernels, clustered (Hopper) and streamed (Ampere, ROCm). Both
once wrote NaN everywhere: a block's slice, or a thread's share of a row, that
is all -inf subtracted its own max of -inf from -inf."""

from __future__ import annotations

import pytest

from runners.harness import distributions
from runners.kernels import softmax

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TARGET = {"kind": "cuda", "arch": "sm_90a"}
SHAPE = {"M": 16, "N": 128256}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("path", ["cluster", "stream"])
def test_a_masked_vocabulary_row_is_right(path, dtype):
    import tilelang

    config = {} if path == "cluster" else {"cluster": 0}
    program = softmax.build_gpu(SHAPE, dtype, TARGET, config)
    kernel = tilelang.compile(program, target=TARGET)
    (x,) = distributions.draw(
        softmax.OPERATOR, SHAPE, dtype, 5, "cuda", distributions.MASKED
    )
    assert x[:, : SHAPE["N"] // 3].isneginf().all()
    y = torch.full_like(x, float("nan"))
    kernel(x, y)
    expected = torch.softmax(x.double(), dim=-1)
    assert not y.isnan().any()
    assert (y[:, : SHAPE["N"] // 3] == 0).all()
    torch.testing.assert_close(y.double(), expected, rtol=2e-2, atol=1e-6)
