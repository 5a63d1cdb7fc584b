"""The binary search on verdicts, and the order of TileLang releases."""

from __future__ import annotations

import pytest

from matrix.bisection.releases import release_key, releases_between
from matrix.bisection.search import decide, verdict_of

G, B, S = "good", "bad", "skip"


def run(truth: list[str], hosted: set[int] | None = None) -> tuple[list[int], object]:
    """Bisect a ladder whose rungs would answer ``truth``; the rungs tested,
    in order, and the decision that ended it."""
    hosted = set(range(len(truth))) if hosted is None else hosted
    verdicts: dict[int, str] = {}
    order = []
    while True:
        decision = decide(
            rungs=len(truth), verdicts=verdicts, testable=hosted - set(verdicts)
        )
        if decision.rung is None:
            return order, decision
        order.append(decision.rung)
        verdicts[decision.rung] = truth[decision.rung]


def test_it_halves_the_range_each_step():
    # 17 releases, the change at the 12th: the ends, then four halvings.
    truth = [G] * 12 + [B] * 5
    order, decision = run(truth)
    assert order == [0, 16, 8, 12, 10, 11]
    assert (decision.state, decision.old, decision.new) == ("found", 11, 12)


def test_a_fix_is_found_the_same_way():
    order, decision = run([B, B, G])
    assert order == [0, 2, 1]
    assert (decision.state, decision.old, decision.new) == ("found", 1, 2)


def test_untested_rungs_leave_a_range():
    order, decision = run([B, B, B, G, G], hosted={0, 4, 1})
    assert order == [0, 4, 1]
    assert (decision.state, decision.old, decision.new) == ("narrowed", 1, 4)


def test_a_rung_with_no_verdict_is_skipped_around():
    order, decision = run([G, S, B, B, B])
    assert order == [0, 4, 2, 1]
    assert (decision.state, decision.old, decision.new) == ("narrowed", 0, 2)


def test_ends_that_agree_say_no_change_and_an_untestable_end_stops():
    assert run([G, B, G])[1].state == "no_change"
    _, stopped = run([G, G, B], hosted={0, 1})
    assert (stopped.state, stopped.end) == ("stopped", 2)
    _, skipped = run([S, G, B])
    assert (skipped.state, skipped.end) == ("stopped", 0)


@pytest.mark.parametrize(
    "status, verdict",
    [
        ("pass", "good"),
        ("compile_error", "bad"),
        ("mismatch", "bad"),
        ("unstable", "bad"),
        ("timeout", "bad"),
        ("infra_error", "skip"),
        ("unsupported", "skip"),
        ("lowered", "skip"),
        ("built", "skip"),
    ],
)
def test_what_each_status_says(status, verdict):
    assert verdict_of(status) == verdict


def test_releases_are_ordered_as_numbers_with_their_post_releases():
    assert release_key("0.1.10") > release_key("0.1.9")
    assert release_key("0.1.7") < release_key("0.1.7.post1") < release_key("0.1.8")
    assert release_key("0.1.15+cu128") is None and release_key("") is None
    assert releases_between("0.1.13", "0.1.15", []) == ["0.1.14"]
    assert releases_between("0.1.6.post2", "0.1.8", ["0.1.7.post9"]) == [
        "0.1.7",
        "0.1.7.post1",
        "0.1.7.post2",
        "0.1.7.post3",
        "0.1.7.post9",
    ]
