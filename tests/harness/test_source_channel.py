"""The kernel source a cell page shows is the one the executor built, sent
before the kernel first ran: a kernel's native code can write past its
buffers into the executor's memory, so what the executor's result says
afterwards is not taken. Driven through the supervisor with a child that
says what a corrupted executor would."""

from __future__ import annotations

import time

from runners.harness import children
from runners.harness.job import parse_job
from runners.harness.result import new_result
from tests.harness.helpers import library_job


def add_job() -> dict:
    return parse_job(library_job("elementwise_add", {"M": 4, "N": 8}))


BUILT = "// the code the executor built\nvoid add(float* A) {}"


class ScriptedChild:
    """A child that sends ``messages``, as the child's protocol does."""

    untrusted = True

    def __init__(self, mode: str, messages: list[dict]):
        self.mode, self.messages, self.notes = mode, list(messages), []

    def next_message(self, deadline):
        return self.messages.pop(0) if self.messages else "eof"

    def go(self):
        pass

    def kill(self):
        pass

    def wait_exit(self, deadline):
        return True


def supervised(mode: str, job: dict, *said) -> dict:
    result = new_result(job)
    result.update(status="pass", stage_reached="validate", kernel_source="pwned")
    messages = [
        {"event": "start", "index": 0},
        *({"event": "stage", "index": 0, **s} for s in said),
        {"event": "result", "index": 0, "result": result},
    ]
    spawned = children.Spawned(
        child=ScriptedChild(mode, messages),
        base="/nonexistent",
        identity=None,
        private=(),
        born=time.perf_counter(),
        toolchain={"hash": "t", "components": {}},
    )
    [finished] = children._supervise(
        spawned, [job], [60.0], on_waiting=None, on_result=lambda i, r: None
    )
    return finished


def test_the_executor_source_sent_before_the_kernel_ran_is_the_one_kept():
    job = add_job()
    result = supervised(
        "executor",
        job,
        {"stage": "build"},
        {"stage": "validate", "kernel_source": BUILT},
        # Said again, once the kernel ran: not taken.
        {"stage": "validate", "kernel_source": "pwned too"},
    )
    assert result["kernel_source"] == BUILT


def test_an_executor_that_never_sent_its_source_before_running_shows_none():
    job = add_job()
    result = supervised("executor", job, {"stage": "validate"})
    assert result["kernel_source"] is None


def test_a_library_child_keeps_the_source_in_its_result():
    # Library kernels are the project's own reviewed code.
    job = add_job()
    result = supervised("library", job, {"stage": "validate"})
    assert result["kernel_source"] == "pwned"
