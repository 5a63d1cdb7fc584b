"""Several runs decide a verdict: a kernel right on some runs of an input
set and wrong on others (a race) is `unstable`, with its failure rate and
a 95% interval, never a lucky `pass` or an unlucky `mismatch`."""

from __future__ import annotations

import time

import pytest

from runners import kernels
from runners.harness import compare, stages
from runners.harness.result import new_result
from tests.harness.helpers import library_job

SHAPE = {"M": 4, "N": 6}


def _racy_add(wrong_calls: set[int]):
    """elementwise_add as a Python callable that writes garbage on the
    calls numbered in ``wrong_calls`` (0 is the first)."""
    calls = []

    def kernel(a, b, c):
        c.copy_(a - b if len(calls) in wrong_calls else a + b)
        calls.append(1)

    return kernel


def _validate(kernel) -> dict:
    job = {**library_job("elementwise_add", SHAPE), "stage": "validate"}
    job["repeats"] = 2
    operator = kernels.get("elementwise_add")
    tolerance = operator.tolerances["float32"]
    return stages._validate(job, operator, kernel, tolerance, new_result(job))


def test_a_kernel_wrong_on_one_run_in_three_is_unstable_with_its_interval():
    result = _validate(_racy_add({1}))
    assert result["status"] == "unstable"
    message = result["error"]["message"]
    assert message.startswith("1 of 3 runs wrong, failure rate 33% (95% interval ")
    assert "6%-79%" in message


def test_a_kernel_wrong_on_every_run_is_a_mismatch():
    result = _validate(_racy_add({0, 1, 2}))
    assert result["status"] == "mismatch"


def test_a_kernel_right_on_every_run_of_every_distribution_passes():
    result = _validate(_racy_add(set()))
    assert result["status"] == "pass"
    assert result["distributions"] == [
        "uniform",
        "zero rows",
        "constant rows",
        "outliers x1000",
        "heavy tails x100",
        "near the dtype's limit (45% of it)",
        "infinities",
        "NaN",
    ]


def test_a_race_on_a_later_distribution_names_it():
    # Three runs on the uniform draw pass; the fifth call is the second run
    # on zero rows.
    result = _validate(_racy_add({4}))
    assert result["status"] == "unstable"
    assert result["error"]["message"].endswith("(on zero rows inputs)")


def test_only_runs_whose_outputs_differ_from_the_first_are_compared_again(
    monkeypatch,
):
    compared = []
    real = compare.compare_outputs

    def counted(names, outs, refs, tolerance):
        compared.append(1)
        return real(names, outs, refs, tolerance)

    monkeypatch.setattr(compare, "compare_outputs", counted)
    # Right on every run: once for each distribution, except where the
    # outputs hold NaN (the NaN draw), which never count as the same.
    assert _validate(_racy_add(set()))["status"] == "pass"
    assert len(compared) == 7 + 3
    compared.clear()
    # The second run differs from the first and is compared; the third
    # repeats the first and takes its verdict.
    assert _validate(_racy_add({1}))["status"] == "unstable"
    assert len(compared) == 2


def test_outputs_are_the_same_only_element_for_element():
    import torch

    a = torch.tensor([[1.0, -0.0], [2.0, 3.0]])
    assert compare.same_outputs([a], [a.clone()])
    assert not compare.same_outputs([a], [a + 1e-7])
    assert not compare.same_outputs([a], [a.double()])
    assert not compare.same_outputs([a], [a.reshape(4)])
    assert not compare.same_outputs([a, a], [a])
    nan = torch.tensor([float("nan")])
    assert not compare.same_outputs([nan], [nan.clone()])


@pytest.mark.parametrize(
    ("failures", "runs", "low", "high"),
    [(0, 3, 0.0, 0.5615), (1, 3, 0.0615, 0.7923), (3, 3, 0.4385, 1.0)],
)
def test_the_wilson_interval_of_a_failure_rate(failures, runs, low, high):
    assert compare.wilson_interval(failures, runs) == pytest.approx(
        (low, high), abs=1e-4
    )


def test_a_short_cpu_call_is_timed_until_its_budget_is_spent():
    from runners.harness import timing

    calls, slow = [], []

    def slow_call(i):
        slow.append(i)
        time.sleep(0.004)

    timing.time_cpu(calls.append, repeats=5)
    # A call of a microsecond or less: the most calls, not 5 (1 warm-up).
    assert len(calls) == 1 + timing.CPU_MAX_REPEATS
    timing.time_cpu(slow_call, repeats=5)
    # 4 ms calls: 5 of them already spend the budget's 20 ms.
    assert len(slow) == 1 + 5
