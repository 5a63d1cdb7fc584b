"""A pass means right on the inputs real models send: each operator's
declared distributions (large logits, zero and constant rows, outlier
channels, heavy tails, values near the dtype's limit, sums and squares
near the accumulator's limit, infinities, NaN, masked rows) besides the
uniform draw. Textbook-wrong kernels that the uniform draw let through
fail, naming the distribution; the library's CPU kernels pass them all."""

from __future__ import annotations

import hashlib

import pytest
import torch

from runners import kernels
from runners.harness import compare, distributions
from runners.harness.distributions import OUTLIERS, ZERO_ROWS
from runners.harness.sandbox import run_batch
from runners.harness.tensors import Distribution
from tests.harness.helpers import SUBMITTED, library_job

SHAPE = {"M": 7, "N": 33}


def _submitted(name: str, operator: str) -> dict:
    source = (SUBMITTED / f"{name}.py").read_text()
    job = library_job(operator, SHAPE)
    job["source"] = source
    job["source_sha256"] = hashlib.sha256(source.encode()).hexdigest()
    return job


@pytest.fixture(scope="module")
def judged(cache_dir):
    jobs = {
        "naive_softmax": _submitted("naive_softmax", "softmax"),
        "rmsnorm_no_eps": _submitted("rmsnorm_no_eps", "rmsnorm"),
        "online_softmax": _submitted("online_softmax_unguarded", "softmax"),
        "saturating_add": _submitted("saturating_add", "elementwise_add"),
        "nansum": _submitted("nansum_row_sum", "row_sum"),
        "library_softmax": library_job("softmax", SHAPE),
        "library_rmsnorm": library_job("rmsnorm", SHAPE),
        "library_add": library_job("elementwise_add", SHAPE),
    }
    results = run_batch(list(jobs.values()), cache_dir=cache_dir, workers=2)
    return dict(zip(jobs, results, strict=True))


def test_a_softmax_without_its_max_fails_on_large_logits(judged):
    result = judged["naive_softmax"]
    assert result["status"] == "mismatch"
    assert result["error"]["message"].endswith("(on large x25 inputs)")


def test_an_rmsnorm_without_epsilon_fails_on_zero_rows(judged):
    result = judged["rmsnorm_no_eps"]
    assert result["status"] == "mismatch"
    assert "NaN" in result["error"]["message"]
    assert result["error"]["message"].endswith("(on zero rows inputs)")


def test_an_online_softmax_without_a_guard_for_minus_infinity_fails_on_masked_rows(
    judged,
):
    result = judged["online_softmax"]
    assert result["status"] == "mismatch"
    assert "NaN" in result["error"]["message"]
    assert result["error"]["message"].endswith("(on masked inputs)")


def test_an_add_that_saturates_fails_where_the_reference_is_infinite(judged):
    result = judged["saturating_add"]
    assert result["status"] == "mismatch"
    message = result["error"]["message"]
    assert "not the reference's infinity" in message
    assert message.endswith("(on infinities inputs)")


def test_a_row_sum_that_skips_nan_fails_where_the_reference_is_nan(judged):
    result = judged["nansum"]
    assert result["status"] == "mismatch"
    message = result["error"]["message"]
    assert "not NaN at 1 of 1 places where the reference is" in message
    assert message.endswith("(on NaN inputs)")


def _half_accumulated_rmsnorm(x, weight):
    """An RMS norm whose sum of squares is kept in float16, a step at a time,
    as a kernel with a half-precision accumulator keeps it."""
    total = torch.zeros(x.shape[0], dtype=torch.float16)
    for column in x.float().square().T:
        total = (total.float() + column).half()
    rms = torch.rsqrt(total.float() / x.shape[1] + 1e-6)
    return [(x.float() * rms[:, None] * weight.float()).half()]


def test_a_half_precision_accumulator_passes_the_draw_and_fails_at_the_square_limit():
    """The float16 rows GPUs serve: a sum of squares kept in float16 is close
    enough on the uniform draw, and infinite (a row of zeros) once values
    reach the dtype's limit, where float32's sum is exact."""
    op = kernels.get("rmsnorm")
    shape, dtype = {"M": 10, "N": 256}, "float16"
    tolerance = op.tolerances[dtype]

    def verdict(distribution):
        inputs = distributions.draw(op, shape, dtype, 5, "cpu", distribution)
        references = op.reference(*[x.double() for x in inputs])
        outputs = _half_accumulated_rmsnorm(*inputs)
        return compare.compare_outputs(["Y"], outputs, references, tolerance)

    assert verdict(distributions.UNIFORM).verdict(tolerance) is None
    at_limit = verdict(distributions.SQUARE_LIMIT).verdict(tolerance)
    assert at_limit == "Y is all zeros and the reference is not"


def test_the_library_kernels_pass_and_say_what_they_were_checked_on(judged):
    softmax, rmsnorm = judged["library_softmax"], judged["library_rmsnorm"]
    assert softmax["status"] == rmsnorm["status"] == "pass"
    assert softmax["distributions"] == [
        "uniform",
        "large x25",
        "zero rows",
        "constant rows",
        "outliers x1000",
        "heavy tails x100",
        "near the dtype's limit (45% of it)",
        "masked",
        "NaN",
    ]
    assert rmsnorm["distributions"] == [
        "uniform",
        "zero rows",
        "constant rows",
        "outliers x1000",
        "heavy tails x100",
        "squares at 45% of float32's limit",
        "NaN",
    ]
    add = judged["library_add"]
    assert add["status"] == "pass", add["error"]
    assert add["distributions"][-3:] == [
        "near the dtype's limit (45% of it)",
        "infinities",
        "NaN",
    ]


def test_each_distribution_shapes_the_first_input_only():
    op = kernels.get("rmsnorm")
    shape = {"M": 6, "N": 10}
    x, weight = op.make_inputs(shape, "float32", seed=3)

    def draw(distribution):
        return distributions.draw(op, shape, "float32", 3, "cpu", distribution)

    zero_x, zero_weight = draw(ZERO_ROWS)
    assert zero_x[2].abs().sum() == 0 and zero_x[5].abs().sum() == 0
    assert (zero_x[[0, 1, 3, 4]] == x[[0, 1, 3, 4]]).all()
    assert (zero_weight == weight).all()
    outlier_x, _ = draw(OUTLIERS)
    assert (outlier_x[:, [0, 3, 6, 9]] == 1000 * x[:, [0, 3, 6, 9]]).all()
    assert (outlier_x[:, [1, 2, 4]] == x[:, [1, 2, 4]]).all()
    large, _ = draw(Distribution("large", 25))
    assert (large == 25 * x).all()
    masked, _ = draw(Distribution("masked"))
    assert masked[:, :3].isneginf().all() and (masked[:, 3:] == x[:, 3:]).all()
    constant, _ = draw(distributions.CONSTANT_ROWS)
    assert (constant[1] == x[1, 0]).all() and (constant[4] == x[4, 0]).all()
    assert (constant[[0, 2, 3, 5]] == x[[0, 2, 3, 5]]).all()
    heavy, _ = draw(distributions.HEAVY_TAILS)
    ratio = (heavy.abs() / x.abs().max()).flatten()
    assert (heavy.sign() == x.sign()).all()
    assert ratio.min() >= 1.0 and ratio.max() <= 100.0
    assert ratio.median() < 2.0 < ratio.max()
    near, _ = draw(distributions.NEAR_LIMIT)
    largest = torch.finfo(torch.float32).max
    assert near.abs().max().item() == pytest.approx(0.45 * largest, rel=1e-6)
    assert near.isfinite().all()
    infinite, _ = draw(distributions.INFINITIES)
    flat = infinite.flatten()
    assert flat[::7].isposinf().all() and flat[3::7].isneginf().all()
    assert flat.isinf().sum() == len(flat[::7]) + len(flat[3::7])
    nan, _ = draw(distributions.NAN)
    assert nan.isnan().nonzero().tolist() == [[4, 8]]
    assert (nan[~nan.isnan()] == x[~nan.isnan()]).all()


def test_the_accumulator_limits_reach_it_and_stay_finite_in_float32():
    """A row sum, a matmul's output or an RMS norm's sum of squares lands at
    45% of the limit: as far as float32 accumulation goes exactly."""
    gemm, shape = kernels.get("gemm"), {"M": 6, "N": 5, "K": 40}
    for dtype in ("float16", "bfloat16", "float32"):
        a, b = distributions.draw(gemm, shape, dtype, 3, "cpu", distributions.ROW_LIMIT)
        bound = (a.double().abs() @ b.double().abs()).max().item()
        assert bound <= 0.45 * torch.finfo(a.dtype).max
        assert bound >= 0.3 * torch.finfo(a.dtype).max
        assert (a.float() @ b.float()).isfinite().all()
    rmsnorm, shape = kernels.get("rmsnorm"), {"M": 4, "N": 64}
    half, _ = distributions.draw(
        rmsnorm, shape, "float16", 3, "cpu", distributions.SQUARE_LIMIT
    )
    assert half.abs().max().item() == pytest.approx(0.45 * 65504, rel=1e-3)
    wide, _ = distributions.draw(
        rmsnorm, shape, "float32", 3, "cpu", distributions.SQUARE_LIMIT
    )
    squares = wide.double().square().sum(-1).max().item()
    assert squares == pytest.approx(0.45 * torch.finfo(torch.float32).max, rel=1e-3)
    assert wide.square().sum(-1).isfinite().all()


@pytest.mark.parametrize("name", sorted(kernels.OPERATORS))
def test_every_operator_checks_zero_rows_and_another_distribution(name):
    names = [d.name for d in distributions.checked_on(name)]
    assert names[0] == "uniform"
    assert "zero_rows" in names and len(names) >= 3


def test_the_library_revisions_do_not_move_with_the_distributions():
    """The distributions are the judge's: adding one leaves every library
    revision, and the evidence recorded for it, current."""
    from runners.kernels.revision import library_source

    for name in kernels.OPERATORS:
        assert "distributions" not in library_source(name)


def test_nan_in_a_few_rows_lands_in_the_last_and_never_in_a_lone_row():
    op = kernels.get("softmax")
    for rows, expected in ((1, 0), (2, 1), (4, 1), (5, 1), (10, 2)):
        x, *_ = distributions.draw(
            op, {"M": rows, "N": 8}, "float32", 3, "cpu", distributions.NAN
        )
        assert x.isnan().any(-1).sum().item() == expected
        if 2 <= rows < 5:
            assert x[-1].isnan().any()


@pytest.mark.parametrize("name", ["gemm", "softmax", "elementwise_add", "rmsnorm"])
def test_input_sets_are_the_draws_with_the_uniform_one_hashed_once(name):
    """What the library's validation runs on (the uniform draw hashed once,
    the first input copied and shaped per distribution) is, bit for bit,
    what drawing each distribution whole gives, and the shaping never
    reaches the uniform set or the inputs it shares."""
    op = kernels.get(name)
    shape = {d: 13 for d in op.dims}
    sets = list(distributions.input_sets(op, shape, "float16", 9, "cpu"))
    assert [d for d, _ in sets] == list(distributions.checked_on(name))
    for distribution, inputs in sets:
        drawn = distributions.draw(op, shape, "float16", 9, "cpu", distribution)
        assert len(inputs) == len(drawn)
        for got, want in zip(inputs, drawn, strict=True):
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    uniform = sets[0][1]
    for _, inputs in sets[1:]:
        assert all(a is b for a, b in zip(inputs[1:], uniform[1:], strict=True))
        assert inputs[0] is not uniform[0]
