"""Runner endpoints under /api/v1/: registration, heartbeats and signed
result upload (offline bundles). Bad input is a 4xx with the reason, never
a 5xx."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError
from ninja import Body, Router, Schema, Status

from runners import services, signing

router = Router(tags=["runners"])


class Registration(Schema):
    token: str
    name: str
    public_key: str
    inventory: dict


class HostedToolchain(Schema):
    id: int
    name: str
    fingerprint: str
    interpreter: str


class Registered(Schema):
    id: int
    name: str
    queues: list[str]
    server_public_key: str
    heartbeat_s: float
    toolchains: list[HostedToolchain]


class Problem(Schema):
    detail: str


class HeartbeatReply(Schema):
    name: str
    state: str
    health: str


class Refusal(Schema):
    index: int
    reason: str


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
    """Exchange a single-use registration token for a runner record."""
    try:
        runner = services.runner_register(
            token=body.token,
            name=body.name,
            public_key=body.public_key,
            inventory=body.inventory,
        )
    except (PermissionDenied, ValidationError) as exc:
        return _problem(exc)
    hosted = runner.runnertoolchain_set.select_related("toolchain")
    return Status(
        201,
        {
            "id": runner.pk,
            "name": runner.name,
            "queues": runner.queues(),
            "server_public_key": signing.server_public_key(),
            "heartbeat_s": services.heartbeat_interval_s(),
            "toolchains": [
                {
                    "id": h.toolchain.pk,
                    "name": h.toolchain.name,
                    "fingerprint": h.toolchain.fingerprint,
                    "interpreter": h.interpreter,
                }
                for h in hosted
            ],
        },
    )


@router.post(
    "/runners/heartbeat",
    response={200: HeartbeatReply, 400: Problem, 403: Problem, 409: Problem},
    auth=None,
)
def heartbeat(request, envelope: Body[dict]):
    """A runner's signed heartbeat; its sequence must grow."""
    try:
        runner = services.runner_heartbeat(envelope=envelope)
    except (PermissionDenied, ValidationError) as exc:
        return _problem(exc)
    return Status(
        200, {"name": runner.name, "state": runner.state, "health": runner.health}
    )


@router.post(
    "/results",
    response={200: UploadReply, 400: Problem, 403: Problem, 409: Problem},
    auth=None,
)
def results_upload(request, bundle: Body[dict]):
    """Import signed results (an offline bundle: ``{"results": [envelope,
    ...]}``) with the checks the control worker applies. Each envelope is
    judged alone; when none is accepted the first refusal is the answer."""
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
