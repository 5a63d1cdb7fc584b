"""The device lock: library children compile side by side but take the
device in turn, so no two validate or time kernels on it at once."""

from __future__ import annotations

import itertools
import multiprocessing
import time

from runners.harness.stages import DEVICE_LOCK_ENV, device_turn


def hold_the_device(lock_path: str, queue) -> None:
    import os

    os.environ[DEVICE_LOCK_ENV] = lock_path
    # "mps" stands for any device here: the lock is what is under test, and
    # this host has no GPU to synchronize.
    with device_turn("mps"):
        start = time.monotonic()
        time.sleep(0.3)
        queue.put((start, time.monotonic()))


def test_children_sharing_a_device_lock_never_hold_it_together(tmp_path):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    children = [
        context.Process(target=hold_the_device, args=(str(tmp_path / "lock"), queue))
        for _ in range(3)
    ]
    for child in children:
        child.start()
    turns = sorted(queue.get(timeout=30) for _ in children)
    for child in children:
        child.join(timeout=30)
    assert all(child.exitcode == 0 for child in children)
    for (_, first_end), (second_start, _) in itertools.pairwise(turns):
        assert second_start >= first_end


def test_cpu_jobs_and_unlocked_children_take_no_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(DEVICE_LOCK_ENV, str(tmp_path / "lock"))
    with device_turn("cpu"):
        pass
    monkeypatch.delenv(DEVICE_LOCK_ENV)
    with device_turn("mps"):
        pass
    assert not (tmp_path / "lock").exists()
