"""Warm library children (runners/harness/warm.py): a runner's worker runs
one message after another, and a child kept from the last one takes the
next without starting again (the sandbox, Python, torch and TileLang).
Real children through the real sandbox; a child that failed, or one
started with another environment, is never given a batch."""

from __future__ import annotations

import os

import pytest

from runners.harness import children, warm
from runners.harness.sandbox import run_batch
from tests.harness.helpers import library_job


@pytest.fixture
def started(monkeypatch) -> list:
    """Every harness child started, in order."""
    found = []

    class Counted(children.Child):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            found.append(self)

    monkeypatch.setattr(children, "Child", Counted)
    return found


def batch(rows: int) -> list[dict]:
    return [library_job("row_sum", {"M": rows, "N": n}) for n in (17, 33, 96)]


def test_the_next_batch_runs_in_the_child_kept_from_the_last(cache_dir, started):
    first = run_batch(batch(3), cache_dir=cache_dir, keep_warm=True)
    second = run_batch(batch(5), cache_dir=cache_dir, keep_warm=True)
    assert [r["status"] for r in first + second] == ["pass"] * 6
    assert len(started) == 1 and started[0].proc.poll() is None
    # Its start was accounted to the first batch only.
    assert sum(r["timings"]["overhead_s"] for r in second) < 0.5
    assert second[0]["sandbox"] == first[0]["sandbox"]


def test_without_keep_warm_every_batch_starts_its_own_child(cache_dir, started):
    run_batch(batch(3), cache_dir=cache_dir)
    run_batch(batch(3), cache_dir=cache_dir)
    assert len(started) == 2 and warm.idle_count() == 0
    assert all(child.proc.poll() is not None for child in started)


def test_a_child_that_timed_out_is_not_kept(cache_dir, started):
    # Too short a timeout for a shape compiled nowhere yet: the child is
    # killed in the middle of its job.
    slow = library_job("softmax", {"M": 3, "N": 1031}, timeout_s=0.05)
    (result,) = run_batch([slow], cache_dir=cache_dir, keep_warm=True)
    assert result["status"] == "timeout"
    assert warm.idle_count() == 0
    after = run_batch(batch(3), cache_dir=cache_dir, keep_warm=True)
    assert [r["status"] for r in after] == ["pass"] * 3
    assert len(started) == 2


def test_a_changed_environment_or_target_gets_a_fresh_child(
    cache_dir, started, monkeypatch
):
    run_batch(batch(3), cache_dir=cache_dir, keep_warm=True)
    # Another value than the one the suite runs with (make test sets one).
    threads = int(os.environ.get("OMP_NUM_THREADS") or 1) + 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    run_batch(batch(3), cache_dir=cache_dir, keep_warm=True)
    assert len(started) == 2
    # Both are kept, each for the environment it was started with.
    assert warm.idle_count() == 2


def test_an_idle_child_kept_too_long_is_ended_not_used(cache_dir, started, monkeypatch):
    run_batch(batch(3), cache_dir=cache_dir, keep_warm=True)
    monkeypatch.setattr(warm, "IDLE_S", 0.0)
    run_batch(batch(3), cache_dir=cache_dir, keep_warm=True)
    assert len(started) == 2
    assert started[0].proc.poll() is not None
