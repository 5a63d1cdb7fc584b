"""The input distributions each operator's pass must be right on, besides
the uniform draw: what real models send an operator's first input (its
activations). They belong to the judge, not to the kernels: the library's
revisions (runners.kernels.revision) stay as they are when what a pass is
checked on grows, and a result says which distributions it was checked on.
"""

from __future__ import annotations

from runners.harness import tensors
from runners.harness.tensors import UNIFORM, Distribution

ZERO_ROWS = Distribution("zero_rows")
OUTLIERS = Distribution("outliers", 1000.0)
# Logits of +-100 (the draw's +-4 times 25): past float32's exp range, as
# real logits are, so a softmax without its max subtracted overflows.
LARGE_LOGITS = Distribution("large", 25.0)
# Queries of +-16 (the draw's +-2 times 8): scores far from zero, which an
# online softmax must rescale to keep finite.
LARGE_QUERIES = Distribution("large", 8.0)

# -inf over the first third of each row: a thread or block whose whole share
# of a row is masked must not turn it into NaN (exp(-inf - -inf)).
MASKED = Distribution("masked")

# Every third row one value: a variance of zero, a softmax of 1/N.
CONSTANT_ROWS = Distribution("constant_rows")
# A few values up to 100x the scale among many near it, as activations are.
HEAVY_TAILS = Distribution("heavy_tails", 100.0)
# The largest value at 45% of the dtype's largest finite one: an add of a
# small second input stays finite, and a softmax that subtracts its max
# stays exact (one that does not overflows).
NEAR_LIMIT = Distribution("near_limit", 0.45)
# +-inf in an add, where the reference's sum is infinite too: a kernel that
# saturates, or clamps to the largest finite value, is wrong there.
INFINITIES = Distribution("infinities")
# A row sum, or a matmul's output, at 45% of the dtype's largest value:
# exact with a float32 accumulator, lost with a half-precision one. (The
# inputs' own near-limit draw would overflow any float32 accumulation, which
# the float64 reference does not: it could not tell right from wrong.)
ROW_LIMIT = Distribution("row_limit", 0.45)
# An RMS norm's row whose sum of squares is 45% of float32's largest value:
# values at the dtype's own limit in float16, whose squares a float16
# accumulator cannot hold.
SQUARE_LIMIT = Distribution("square_limit", 0.45)
# One NaN in every fifth row: the reference's result there is NaN (a row's
# sum, norm, softmax or matmul row), and a kernel whose max or clamp drops a
# NaN silently serves a number.
NAN = Distribution("nan")

BY_OPERATOR = {
    "elementwise_add": (
        ZERO_ROWS,
        CONSTANT_ROWS,
        OUTLIERS,
        HEAVY_TAILS,
        NEAR_LIMIT,
        INFINITIES,
        NAN,
    ),
    "row_sum": (ZERO_ROWS, CONSTANT_ROWS, OUTLIERS, HEAVY_TAILS, ROW_LIMIT, NAN),
    "softmax": (
        LARGE_LOGITS,
        ZERO_ROWS,
        CONSTANT_ROWS,
        OUTLIERS,
        HEAVY_TAILS,
        NEAR_LIMIT,
        MASKED,
        NAN,
    ),
    "rmsnorm": (
        ZERO_ROWS,
        CONSTANT_ROWS,
        OUTLIERS,
        HEAVY_TAILS,
        SQUARE_LIMIT,
        NAN,
    ),
    "gemm": (ZERO_ROWS, CONSTANT_ROWS, OUTLIERS, HEAVY_TAILS, ROW_LIMIT, NAN),
    "attention": (ZERO_ROWS, LARGE_QUERIES),
    "attention_causal": (ZERO_ROWS, LARGE_QUERIES),
}


def checked_on(operator: str) -> tuple[Distribution, ...]:
    """Every distribution a pass of ``operator`` is checked on, the uniform
    draw first (an operator this table does not name gets it alone)."""
    return (UNIFORM, *BY_OPERATOR.get(operator, ()))


def draw(
    operator, shape: dict, dtype: str, seed: int, device: str, distribution
) -> list:
    """``operator``'s seeded inputs, the first shaped by ``distribution``."""
    specs = [tensors.spec_dict(s) for s in operator.inputs(shape, dtype)]
    return tensors.seeded_inputs(specs, seed, device, distribution)


def input_sets(operator, shape: dict, dtype: str, seed: int, device: str):
    """Yield (distribution, inputs) for every distribution ``operator`` is
    checked on, each the same tensors ``draw`` gives. The uniform draw is
    hashed once: only the first input differs between distributions, so
    each other one is a copy of it, shaped, beside the same other inputs (a
    GEMM's 500M-element weight hashed once, not once per distribution)."""
    specs = [tensors.spec_dict(s) for s in operator.inputs(shape, dtype)]
    uniform = tensors.seeded_inputs(specs, seed, device)
    first = uniform[0].clone() if uniform else None
    for distribution in checked_on(operator.name):
        if distribution == UNIFORM or first is None:
            yield distribution, uniform
            continue
        shaped = first.clone()
        distribution.shape(shaped, tensors.other_scale(specs))
        yield distribution, [shaped, *uniform[1:]]
