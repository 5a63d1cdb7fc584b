"""Runner endpoints under /api/v1/: registration, heartbeats, signed result
upload (offline bundles), and the signed requests through which a runner
worker, which holds no database credentials, claims jobs and recovers after
a (re)connect. Bad input is a 4xx with the reason, never a 5xx."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from ninja import Body, Field, Router, Schema, Status

from matrix.api_errors import Problem
from matrix.fleet import keys, services

router = Router(tags=["runners"])


class Registration(Schema):
    token: str
    name: str
    public_key: str
    inventory: dict


class HostedToolchain(Schema):
    # None for a toolchain this server records only once the runner is
    # approved; the fingerprint, which jobs name, is known from the start.
    id: int | None
    name: str
    fingerprint: str
    interpreter: str


class Registered(Schema):
    id: int
    name: str
    health: str = Field(description="pending: no queue until a runner admin approves")
    key_fingerprint: str
    queues: list[str]
    server_public_key: str
    heartbeat_s: float
    toolchains: list[HostedToolchain]


class HeartbeatReply(Schema):
    name: str
    state: str
    health: str


class Refusal(Schema):
    index: int
    reason: str


class JobKey(Schema):
    job: int
    attempt: int


class ClaimReply(Schema):
    claimed: list[JobKey]
    held: list[JobKey]
    health: str


class RecoverReply(Schema):
    requeued: int
    lost: int
    republished: int


class OutboxReply(Schema):
    running: list[JobKey]


class BrokerLogin(Schema):
    username: str
    password: str
    vhost: str


class QueuesReply(Schema):
    name: str
    queues: list[str]
    health: str
    broker: BrokerLogin | None = Field(
        None,
        description="the runner's own RabbitMQ login, limited to its queues; "
        "null where runners keep the broker URL they were configured with",
    )
    ingest: str = Field(
        "control",
        description="the queue the runner sends its signed results to: "
        "`control`, or one of the ingest queues when the server has several",
    )


class UploadReply(Schema):
    stored: int
    duplicate: int
    refused: list[Refusal]


def _problem(exc: Exception) -> Status:
    if isinstance(exc, PermissionDenied):
        return Status(403, {"detail": str(exc)})
    code = 409 if isinstance(exc, services.Conflict) else 400
    return Status(code, {"detail": "; ".join(exc.messages)})


@router.post(
    "/runners/register",
    response={201: Registered, 400: Problem, 403: Problem, 409: Problem},
    auth=None,
)
def register(request, body: Registration):
    """Exchange a single-use registration token for a runner record. The
    runner is pending: it has no queue until a runner admin approves its
    inventory (devices, toolchains, host, key fingerprint)."""
    try:
        runner = services.runner_register(
            token=body.token,
            name=body.name,
            public_key=body.public_key,
            inventory=body.inventory,
        )
    except (PermissionDenied, ValidationError) as exc:
        return _problem(exc)
    return Status(
        201,
        {
            "id": runner.pk,
            "name": runner.name,
            "health": runner.health,
            "key_fingerprint": runner.key_fingerprint,
            # Empty until a runner admin approves what it claims.
            "queues": [],
            "server_public_key": keys.server_public_key(),
            "heartbeat_s": services.heartbeat_interval_s(),
            "toolchains": services.hosted_toolchains(runner),
        },
    )


SIGNED_REPLIES = {400: Problem, 403: Problem, 409: Problem}


def _signed(service, envelope):
    """Answer a runner's signed request with what ``service`` returns; a
    refusal is a 4xx with the reason."""
    if not isinstance(envelope, dict):
        return Status(400, {"detail": "expected a signed envelope (a JSON object)"})
    try:
        return Status(200, service(envelope=envelope))
    except (PermissionDenied, ValidationError) as exc:
        return _problem(exc)


def _heartbeat(*, envelope) -> dict:
    runner = services.runner_heartbeat(envelope=envelope)
    return {"name": runner.name, "state": runner.state, "health": runner.health}


@router.post(
    "/runners/heartbeat",
    response={200: HeartbeatReply, **SIGNED_REPLIES},
    auth=None,
)
def heartbeat(request, envelope: Body[Any]):
    """A runner's signed heartbeat; its sequence must grow."""
    return _signed(_heartbeat, envelope)


@router.post("/runners/claim", response={200: ClaimReply, **SIGNED_REPLIES}, auth=None)
def jobs_claim(request, envelope: Body[Any]):
    """Claim the jobs of a message (signed request, payload ``{"kind":
    "claim", "runner", "jobs": [{"job", "attempt"}, ...]}``): each is taken
    atomically, only from the runner's queues; ``held`` are those it already
    had; ``health`` is ``maintenance`` or ``pending`` (not yet approved) when
    the runner may take nothing now."""
    return _signed(services.jobs_claim, envelope)


@router.post(
    "/runners/recover", response={200: RecoverReply, **SIGNED_REPLIES}, auth=None
)
def runner_recover(request, envelope: Body[Any]):
    """A runner's worker connected to the broker (signed request, payload
    ``{"kind": "recover", "runner", "restarted": bool}``): after a restart
    its running jobs get another attempt; queued jobs on its queues are sent
    again."""
    return _signed(services.runner_reconnect, envelope)


@router.post(
    "/runners/outbox", response={200: OutboxReply, **SIGNED_REPLIES}, auth=None
)
def outbox_pending(request, envelope: Body[Any]):
    """Which of the runner's kept results are still awaited (signed
    request, payload ``{"kind": "outbox", "runner", "jobs": [...]}``): the
    jobs still running for it at that attempt."""
    return _signed(services.outbox_pending, envelope)


@router.post(
    "/runners/queues", response={200: QueuesReply, **SIGNED_REPLIES}, auth=None
)
def runner_queues(request, envelope: Body[Any]):
    """The queues the runner's worker consumes, the runner's health and,
    where the server gives each runner a broker user of its own, that
    user's login, and the queue its results go to (signed request, payload ``{"kind": "queues", "runner"}``);
    a pending runner has none until it is approved."""
    return _signed(services.runner_queues, envelope)


@router.post(
    "/results",
    response={200: UploadReply, 400: Problem, 403: Problem, 409: Problem},
    auth=None,
)
def results_upload(request, bundle: Body[dict]):
    """Import signed results (an offline bundle: ``{"results": [envelope,
    ...]}``) with the checks the control worker applies. Each envelope is
    judged alone; one already stored (a bundle sent again after a lost
    reply) counts as ``duplicate``; when none is accepted the first refusal
    is the answer. A body over 2.5 MB is a 413: send smaller batches."""
    envelopes = bundle.get("results")
    if not isinstance(envelopes, list) or not envelopes:
        return Status(
            400, {"detail": 'expected {"results": [signed result envelope, ...]}'}
        )
    if len(envelopes) > 10_000:
        return Status(
            400, {"detail": "at most 10000 results per upload; split the bundle"}
        )
    outcomes = services.results_ingest(envelopes=envelopes)
    refused = [
        {"index": i, "reason": o.reason}
        for i, o in enumerate(outcomes)
        if o.status == "refused"
    ]
    if len(refused) == len(outcomes):
        first = next(o for o in outcomes if o.status == "refused")
        return Status(first.code, {"detail": first.reason})
    return Status(
        200,
        {
            "stored": sum(o.status == "stored" for o in outcomes),
            "duplicate": sum(o.status == "duplicate" for o in outcomes),
            "refused": refused,
        },
    )
