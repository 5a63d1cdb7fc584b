"""On a CUDA host (the H200): a call of decode size is timed without the
host's launch in it, and a call a CUDA graph cannot capture is still timed,
leaving the GPU usable for the next job."""

from __future__ import annotations

import time

import pytest

from runners.harness import timing

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HOST_DELAY_S = 200e-6


def input_sets(count: int = 4, n: int = 4096):
    return [
        (
            torch.randn(n, device="cuda", dtype=torch.float16),
            torch.randn(n, device="cuda", dtype=torch.float16),
        )
        for _ in range(count)
    ]


def test_a_decode_sized_call_is_timed_without_the_host_launching_it():
    """The host takes 200 us to launch each call of a kernel of a few
    microseconds: timed one by one, the call would read about 0.2 ms."""
    out = torch.empty(4096, device="cuda", dtype=torch.float16)

    def slow_to_launch(a, b):
        time.sleep(HOST_DELAY_S)
        torch.add(a, b, out=out)

    ms = timing.median(timing.time_gpu(slow_to_launch, input_sets(), repeats=50))
    assert 0 < ms < HOST_DELAY_S * 1e3 / 4


def test_a_slow_first_call_does_not_decide_how_the_rest_are_timed():
    """A library's first call in a dtype loads its kernels (milliseconds);
    the calls after it are of decode size and are timed as such."""
    out = torch.empty(4096, device="cuda", dtype=torch.float16)
    calls = []

    def loads_on_first_call(a, b):
        if not calls:
            time.sleep(0.02)
        calls.append(1)
        time.sleep(HOST_DELAY_S)
        torch.add(a, b, out=out)

    ms = timing.median(timing.time_gpu(loads_on_first_call, input_sets(), repeats=50))
    assert 0 < ms < HOST_DELAY_S * 1e3 / 4


def test_a_call_a_graph_cannot_capture_is_timed_call_by_call():
    def syncs_the_host(a, b):
        return (a + b).sum().item()

    stream = torch.cuda.current_stream()
    ms = timing.median(timing.time_gpu(syncs_the_host, input_sets(), repeats=20))
    assert ms > 0
    # The refused capture leaves the device as it was: the same stream,
    # random draws (which failed after it before), and the next call graphed.
    assert torch.cuda.current_stream() == stream
    assert torch.randn(8, device="cuda").isfinite().all()
    out = torch.empty(4096, device="cuda", dtype=torch.float16)
    sets = input_sets()
    graph = timing.graphed(lambda a, b: torch.add(a, b, out=out), sets, calls=8)
    assert graph is not None
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, sets[7 % len(sets)][0] + sets[7 % len(sets)][1])
