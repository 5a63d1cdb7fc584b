"""Signed envelopes from runners: who signed one, whether the signature and
its age hold, and the envelopes a runner sends (its side of the protocol)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError

from runners import signing
from runners.models import Runner

# Offline bundles travel by hand from labs without a network path, so a
# result may be weeks old when it arrives; its nonce still makes it single-use.
RESULT_MAX_AGE_S = 90 * 24 * 3600
HEARTBEAT_MAX_AGE_S = 300
# Requests a runner makes over HTTP (claim, recover, outbox, queues) are
# answered at once: a few minutes cover clock skew, and their nonces are
# remembered for that long (SpentNonce), so each is accepted once.
REQUEST_MAX_AGE_S = 300
REQUEST_KINDS = ("claim", "recover", "outbox", "queues")


def envelope_runner(envelope, runners: dict | None = None) -> Runner:
    """The signer's Runner, from ``runners`` (by name) when given, so that
    checking a batch makes no query per envelope. A malformed envelope is a
    ValidationError; an unknown or revoked signer is PermissionDenied."""
    try:
        name = signing.envelope_signer(envelope)
    except signing.EnvelopeError as exc:
        raise ValidationError(str(exc)) from None
    if runners is not None:
        runner = runners.get(name)
    else:
        runner = Runner.objects.filter(name=name).first()
    if runner is None:
        raise PermissionDenied(f"unknown runner {name!r}")
    if runner.revoked_at is not None:
        raise PermissionDenied(f"runner {name!r} is revoked")
    return runner


def payload_verify(envelope, runner: Runner, *, kind: str, max_age_s: float) -> dict:
    """The payload of an envelope that ``runner`` signed, of the expected
    kind and naming that runner."""
    try:
        payload = signing.envelope_verify(
            envelope, public_key=runner.public_key, max_age_s=max_age_s
        )
    except signing.EnvelopeError as exc:
        raise PermissionDenied(str(exc)) from None
    if payload.get("kind") != kind:
        raise ValidationError(
            f"expected a {kind} envelope, got {payload.get('kind')!r}"
        )
    if payload.get("runner") != runner.name:
        raise PermissionDenied("the payload names a different runner than its signer")
    return payload


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
