"""The runner's side of the protocol with the server: the envelopes it
signs, the names of the Celery tasks it sends and runs, and the words the
server answers with. The server checks what arrives against the same names
(``matrix/fleet/services/envelopes.py``); a message in flight keeps its
meaning across an upgrade of either side only while these stay as they are.
"""

from __future__ import annotations

import re

from celery import current_app

from runners import signing

# Celery task names: wire names, not module paths.
EXECUTE_JOB = "runners.execute_job"  # on a runner queue, run by the runner
INGEST_RESULT = "runners.ingest_result"  # on CONTROL, run by the control worker
HEARTBEAT = "runners.heartbeat"  # on CONTROL
REAP = "runners.reap"  # on CONTROL, sent by the control worker's beat
CONTROL = "control"

# Requests a runner makes over HTTP, to /api/v1/runners/<kind>.
REQUEST_KINDS = ("claim", "recover", "outbox", "queues")

# The server's words for a runner's health (Runner.Health on the server).
ACTIVE = "active"
PENDING = "pending"


def result_envelope(*, job: dict, result: dict, runner_name: str, key) -> dict:
    """A runner signs what its harness produced for one job attempt."""
    return signing.envelope_sign(
        payload={
            "kind": "result",
            "runner": runner_name,
            "job": job["job"],
            "attempt": job["attempt"],
            "result": result,
        },
        signer=runner_name,
        key=key,
    )


def heartbeat_envelope(*, runner_name: str, sequence: int, state: str, key) -> dict:
    return signing.envelope_sign(
        payload={
            "kind": "heartbeat",
            "runner": runner_name,
            "sequence": sequence,
            "state": state,
        },
        signer=runner_name,
        key=key,
    )


def request_envelope(*, kind: str, runner_name: str, key, **fields) -> dict:
    """A runner signs a request to the server's HTTP API."""
    if kind not in REQUEST_KINDS:
        raise ValueError(f"unknown request kind {kind!r}")
    return signing.envelope_sign(
        payload={"kind": kind, "runner": runner_name, **fields},
        signer=runner_name,
        key=key,
    )


# Celery settings of the agent's own: the queue its results go to, as the
# server's queues reply says (``runners.cli``); and, on a runner's own
# broker login, to publish to a queue's exchange by name, never through the
# default exchange (``runners.broker_login``).
INGEST_QUEUE = "tilematrix_ingest_queue"
PUBLISH_BY_NAME = "tilematrix_publish_by_name"


def ingest_queue_valid(name) -> bool:
    return isinstance(name, str) and (
        name == CONTROL or re.fullmatch(r"ingest\.[0-9]{1,2}", name) is not None
    )


def results_queue() -> str:
    """The control queue, or the ingest queue the server gave this runner
    (``matrix/fleet/ingest_queues.py``)."""
    return current_app.conf.get(INGEST_QUEUE) or CONTROL


def control_send(task: str, message, *, queue: str = CONTROL, **options) -> None:
    """Send ``message`` to the control worker's ``task``, by its wire name,
    on ``queue`` (the control queue or an ingest queue): the agent holds no
    server code. Where a process holds that task too (the test suite runs
    the whole chain in one process), the send runs it as the app says, in
    place when eager."""
    route = (
        {"exchange": queue, "routing_key": queue}
        if current_app.conf.get(PUBLISH_BY_NAME)
        else {}
    )
    current_app.signature(task).apply_async(
        args=[message], queue=queue, **route, **options
    )
