"""The device lock: library children compile side by side, check their
outputs on the device together, and time kernels on it alone: no timing
ever shares the device, and a stream of checks cannot keep one waiting."""

from __future__ import annotations

import itertools
import multiprocessing
import time

import torch  # noqa: F401  (before the forks: device_turn imports it)

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


def hold(lock_path, shared, events, name, barrier=None, seconds=0.4) -> None:
    import os

    os.environ[DEVICE_LOCK_ENV] = lock_path
    events.put((name, "asking", time.monotonic()))
    with device_turn("mps", shared=shared):
        events.put((name, "start", time.monotonic()))
        if barrier is not None:
            barrier.wait(timeout=20)  # every check holds the device at once
        time.sleep(seconds)
        events.put((name, "end", time.monotonic()))


class Turns:
    """Children holding one device lock, and what each said when."""

    def __init__(self, tmp_path):
        # Forked: torch, which device_turn imports, is imported once here.
        self.context = multiprocessing.get_context("fork")
        self.events, self.lock = self.context.Queue(), str(tmp_path / "lock")
        self.children, self.seen = [], {}

    def start(self, name: str, *, shared: bool, **how) -> None:
        child = self.context.Process(
            target=hold, args=(self.lock, shared, self.events, name), kwargs=how
        )
        child.start()
        self.children.append(child)

    def until(self, name: str, what: str) -> None:
        while what not in self.seen.get(name, {}):
            said, event, at = self.events.get(timeout=60)
            self.seen.setdefault(said, {})[event] = at

    def all_ended(self) -> dict:
        for child in self.children:
            child.join(timeout=60)
        assert [child.exitcode for child in self.children] == [0] * len(self.children)
        while not self.events.empty() or any(
            "end" not in turn for turn in self.seen.values()
        ):
            said, event, at = self.events.get(timeout=60)
            self.seen.setdefault(said, {})[event] = at
        return self.seen


def test_checks_hold_the_device_together_and_a_timing_holds_it_alone(tmp_path):
    turns = Turns(tmp_path)
    # A check that held the device alone would break the barrier.
    barrier = turns.context.Barrier(3)
    for i in range(3):
        turns.start(f"check{i}", shared=True, barrier=barrier)
    turns.until("check0", "start")
    turns.start("time0", shared=False)
    turns.start("time1", shared=False)
    seen = turns.all_ended()
    assert len(seen) == 5
    for name in ("time0", "time1"):
        alone = seen[name]
        for other, turn in seen.items():
            if other != name:
                assert turn["end"] <= alone["start"] or turn["start"] >= alone["end"]


def test_a_timing_waiting_for_the_device_goes_before_checks_that_ask_after_it(
    tmp_path,
):
    turns = Turns(tmp_path)
    turns.start("first check", shared=True, seconds=2.0)
    turns.until("first check", "start")
    turns.start("timing", shared=False)
    turns.until("timing", "asking")
    time.sleep(0.2)  # the timing waits on the lock while the first check holds it
    turns.start("later check", shared=True)
    seen = turns.all_ended()
    assert seen["later check"]["asking"] < seen["first check"]["end"]
    # Without the turnstile the later check would have joined the first.
    assert seen["later check"]["start"] >= seen["timing"]["end"]


def test_on_a_mocked_80_gb_gpu_a_vocabulary_gemm_is_checked_alone(monkeypatch):
    import torch

    from runners.harness import tensors
    from runners.harness.stages import _fits_beside_others
    from runners.kernels import get

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index: type("Properties", (), {"total_memory": 80 * 2**30}),
    )
    gemm = get("gemm")

    def specs(shape: dict) -> list[dict]:
        return [
            tensors.spec_dict(s)
            for s in [*gemm.inputs(shape, "float16"), *gemm.outputs(shape, "float16")]
        ]

    decode = {"M": 16, "N": 4096, "K": 14336}
    vocabulary = {"M": 1, "N": 128256, "K": 4096}
    assert _fits_beside_others(specs(decode), "cuda")
    assert not _fits_beside_others(specs(vocabulary), "cuda")
    assert not _fits_beside_others(specs(decode), "cpu")
