"""The runner's side of the protocol with the server: the envelopes it
signs, the names of the Celery tasks it sends and runs, and the words the
server answers with. The server checks what arrives against the same names
(``matrix/fleet/services/envelopes.py``); a message in flight keeps its
meaning across an upgrade of either side only while these stay as they are.
"""

from __future__ import annotations

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


def control_send(task: str, message, **options) -> None:
    """Send ``message`` to the control worker's ``task``, by its wire name:
    the agent holds no server code. Where a process holds that task too (the
    test suite runs the whole chain in one process), the send runs it as the
    app says, in place when eager. On a runner's own broker login it goes
    to the control exchange by name (``runners.broker_login``)."""
    route = current_app.conf.get("tilematrix_control_route") or {}
    current_app.signature(task).apply_async(
        args=[message], queue=CONTROL, **route, **options
    )
