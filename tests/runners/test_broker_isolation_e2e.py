"""A deployment on the real RabbitMQ with a broker user per runner: a runner
worker given only its own login (its host knows the broker's address, not a
password) does its work, pauses and resumes through its own mailbox, and a
revocation closes its connection (issue 40, part 3)."""

from __future__ import annotations

import signal

import pytest

from .cluster import Cluster, rabbit_admin, rabbitmq_or_skip
from .test_worker_e2e import online, smoke_cells


@pytest.fixture(scope="module")
def cluster():
    rabbitmq_or_skip()
    cluster = Cluster(broker="rabbitmq")
    try:
        cluster.start_web()
        cluster.start_control()
        yield cluster
    finally:
        cluster.close()


def test_a_runner_works_pauses_and_resumes_on_its_own_login(cluster):
    cluster.register("iso-a")
    cluster.start_runner("iso-a", TILEMATRIX_EDGE_HARNESS_DELAY_S="0.05")
    online(cluster, "iso-a")  # its signed heartbeats reach the control queue
    user = f"runner.iso-a@{cluster.rabbit_vhost}"
    assert f"connects as broker user {user}" in cluster.log("runner:iso-a")
    connections = rabbit_admin(
        "GET", f"connections/username/{user.replace('@', '%40')}"
    )
    assert connections, "the worker is not connected as its own user"

    sweep = cluster.plan(smoke_cells("backend='c'", limit=2))
    cluster.wait_finished(sweep, timeout=180)
    assert {state for _, state, _, _ in cluster.jobs(sweep)} == {"done"}
    assert set(cluster.results_per_job(sweep).values()) == {1}

    # Maintenance: the worker gives its message back and cancels its own
    # consumers, then adds them again, through its own mailbox.
    cluster.manage("runner", "maintenance", "iso-a", "on")
    paused = cluster.plan(smoke_cells("backend='c'", limit=1))
    cluster.wait(
        lambda: "runner iso-a is in maintenance" in cluster.log("runner:iso-a"),
        timeout=120,
        what="the runner in maintenance to give a message back",
    )
    cluster.manage("runner", "maintenance", "iso-a", "off")
    cluster.wait(
        lambda: "runner iso-a is active again" in cluster.log("runner:iso-a"),
        timeout=60,
        what="the worker to read its queues again",
    )
    cluster.wait_finished(paused, timeout=180)
    assert {state for _, state, _, _ in cluster.jobs(paused)} == {"done"}

    # A claim the server cannot answer: the message is retried through the
    # runner's own queue's exchange (the only one it may publish to).
    cluster.kill("web", signal.SIGTERM)
    retried = cluster.plan(smoke_cells("backend='c'", limit=1))
    cluster.wait(
        lambda: "claim not answered" in cluster.log("runner:iso-a"),
        timeout=60,
        what="a claim left unanswered",
    )
    cluster.start_web()
    cluster.wait_finished(retried, timeout=180)
    assert {state for _, state, _, _ in cluster.jobs(retried)} == {"done"}
    log = cluster.log("runner:iso-a")
    assert "ACCESS_REFUSED" not in log, log[-3000:]


def test_revoking_a_runner_closes_its_broker_connections(cluster):
    cluster.register("iso-b")
    cluster.start_runner("iso-b", TILEMATRIX_EDGE_HARNESS_DELAY_S="0.05")
    online(cluster, "iso-b")

    said = cluster.manage("runner", "revoke", "iso-b").stdout

    assert "its broker user is deleted and" in said
    closed = int(said.split("deleted and ")[1].split()[0])
    assert closed >= 1, said
    user = f"runner.iso-b@{cluster.rabbit_vhost}".replace("@", "%40")
    assert rabbit_admin("GET", f"connections/username/{user}") == []
    # Its worker cannot connect again: its user is gone.
    cluster.wait(
        lambda: "ACCESS_REFUSED" in cluster.log("runner:iso-b"),
        timeout=60,
        what="the revoked runner's reconnection refused",
    )
