"""Two control workers on two ingest queues, in a deployment of real
processes on the real RabbitMQ (issue 40, part 5): the web server, a
control worker per ingest queue, and runner workers on broker users of
their own. Each runner's results take its own queue, and only the worker
serving that queue stores them: a queue whose worker is down holds its
results, and none is lost, until a worker serves it."""

from __future__ import annotations

import re
import sys
import zlib

import pytest

from .cluster import Cluster, rabbit_admin, rabbitmq_or_skip
from .test_worker_e2e import online, smoke_cells

PY = sys.executable


def runner_on(queue: int) -> str:
    """A runner name whose results go to ingest queue ``queue`` of two
    (``matrix.fleet.ingest_queues.of_runner``)."""
    return next(
        name
        for name in (f"shard-{i}" for i in range(100))
        if zlib.crc32(name.encode()) % 2 == queue
    )


def stored(cluster: Cluster, worker: str) -> int:
    """The results a control worker's log says it stored."""
    return sum(
        int(n)
        for n in re.findall(
            r"ingested \d+ result messages: (\d+) stored", cluster.log(worker)
        )
    )


@pytest.fixture(scope="module")
def cluster():
    rabbitmq_or_skip()
    cluster = Cluster(broker="rabbitmq")
    cluster.env["TILEMATRIX_INGEST_QUEUES"] = "2"
    try:
        cluster.start_web()
        # The first worker runs beat and serves ingest queue 0 (and the
        # control queue, as every control worker does).
        cluster.start(
            "control:0", [PY, "manage.py", "control", "work", "--ingest", "0"]
        )
        yield cluster
    finally:
        cluster.close()


def test_each_runners_results_are_stored_by_the_worker_of_its_queue(cluster):
    # The control worker bounds its queues as it starts.
    policies = cluster.wait(
        lambda: rabbit_admin("GET", f"policies/{cluster.rabbit_vhost}"),
        timeout=60,
        what="the control worker's queue cap",
    )
    assert [(p["name"], p["pattern"]) for p in policies] == [
        ("tilematrix-results-cap", r"^(control|ingest\.[0-9]+)$")
    ]
    zero, one = runner_on(0), runner_on(1)
    cluster.register(zero)
    cluster.register(one)

    # Runner `one`'s results go to ingest.1, which no worker serves yet:
    # its jobs run, and their results wait in the queue.
    cluster.start_runner(one, TILEMATRIX_EDGE_HARNESS_DELAY_S="0.05")
    online(cluster, one)  # its heartbeats take the control queue
    held = cluster.plan(smoke_cells("backend='c'", limit=2))

    def waiting() -> int:
        with cluster.connection() as connection:
            return connection.default_channel.queue_declare("ingest.1", passive=True)[1]

    cluster.wait(waiting, timeout=120, what="results waiting on ingest.1")
    assert sum(cluster.results_per_job(held).values()) == 0
    assert stored(cluster, "control:0") == 0

    # A second control worker serves ingest.1: it stores them.
    cluster.start(
        "control:1",
        [PY, "manage.py", "control", "work", "--ingest", "1", "--no-beat"],
    )
    cluster.wait_finished(held, timeout=180)
    assert {state for _, state, _, _ in cluster.jobs(held)} == {"done"}
    per_job = cluster.results_per_job(held)
    assert set(per_job.values()) == {1}
    assert stored(cluster, "control:1") == len(per_job)
    assert stored(cluster, "control:0") == 0

    # Runner `zero`'s results take ingest.0, and the first worker's.
    cluster.kill(f"runner:{one}")
    cluster.start_runner(zero, TILEMATRIX_EDGE_HARNESS_DELAY_S="0.05")
    online(cluster, zero)
    other = cluster.plan(smoke_cells("backend='c'", limit=2))
    cluster.wait_finished(other, timeout=180)
    assert {state for _, state, _, _ in cluster.jobs(other)} == {"done"}
    assert stored(cluster, "control:0") == len(cluster.results_per_job(other))
    assert stored(cluster, "control:1") == len(per_job)
    for runner in (zero, one):
        assert "ACCESS_REFUSED" not in cluster.log(f"runner:{runner}")
