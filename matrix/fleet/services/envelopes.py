"""Signed envelopes from runners: who signed one, whether the signature and
its age hold, whether the payload's fields have the types and ranges the
server stores. A runner makes them with ``runners.protocol``."""

from __future__ import annotations

import json

from django.core.exceptions import PermissionDenied, ValidationError

from matrix.fleet.models import Runner, RunnerState
from matrix.models import ID_MAX
from runners import signing

# Offline bundles travel by hand from labs without a network path, so a
# result may be weeks old when it arrives; its nonce still makes it single-use.
# A live upload (POST /api/v1/results, the control queue) older than this is
# refused; an archived evidence file (`evidence import`) has no age limit.
RESULT_MAX_AGE_S = 90 * 24 * 3600
HEARTBEAT_MAX_AGE_S = 300
# Requests a runner makes over HTTP (claim, recover, outbox, queues) are
# answered at once: a few minutes cover clock skew, and their nonces are
# remembered for that long (SpentNonce), so each is accepted once.
REQUEST_MAX_AGE_S = 300
# A message carries at most 25 jobs; an outbox left by a long outage is
# sent in slices of this size.
REQUEST_MAX_JOBS = 500

# Ids and the heartbeat sequence are stored in signed 64-bit columns
# (ID_MAX), an attempt in a small one: a larger number cannot be stored, and
# failing on it inside the database would fail the whole request.
ATTEMPT_MAX = 2**15 - 1
HEARTBEAT_STATES = (RunnerState.ONLINE, RunnerState.BUSY)
_ABSENT = object()


def shown(value) -> str:
    """A payload value as a refusal quotes it: JSON, cut short."""
    if value is _ABSENT:
        return "nothing"
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole_number(field: str, value, maximum: int) -> None:
    # A bool is an int in Python: "job": true must not read as job 1.
    if type(value) is not int or not 0 < value <= maximum:
        raise ValidationError(
            f"{field} must be a whole number from 1 to {maximum}, got {shown(value)}"
        )


def _identifier(field: str, value) -> None:
    _whole_number(field, value, ID_MAX)


def _attempt(field: str, value) -> None:
    _whole_number(field, value, ATTEMPT_MAX)


def _object(field: str, value) -> None:
    if not isinstance(value, dict):
        raise ValidationError(f"{field} must be an object, got {shown(value)}")


def _boolean(field: str, value) -> None:
    if not isinstance(value, bool):
        raise ValidationError(f"{field} must be true or false, got {shown(value)}")


def _heartbeat_state(field: str, value) -> None:
    if value not in HEARTBEAT_STATES:
        raise ValidationError(
            f"{field} must be one of {', '.join(HEARTBEAT_STATES)}, got {shown(value)}"
        )


def _job_keys(field: str, value) -> None:
    if not isinstance(value, list) or not value:
        raise ValidationError(
            f'{field} must be a list of {{"job": ID, "attempt": N}}, got {shown(value)}'
        )
    if len(value) > REQUEST_MAX_JOBS:
        raise ValidationError(f"at most {REQUEST_MAX_JOBS} {field} per request")
    for i, key in enumerate(value):
        _object(f"{field}[{i}]", key)
        _identifier(f"{field}[{i}].job", key.get("job", _ABSENT))
        _attempt(f"{field}[{i}].attempt", key.get("attempt", _ABSENT))


# The fields of each kind of payload a runner signs and what each must be.
# Every runner message passes payload_verify, so this is the one place they
# are checked: a service reads them as the types written here.
PAYLOAD_FIELDS = {
    "heartbeat": {"sequence": _identifier, "state": _heartbeat_state},
    "result": {"job": _identifier, "attempt": _attempt, "result": _object},
    "claim": {"jobs": _job_keys},
    "recover": {"restarted": _boolean},
    "outbox": {"jobs": _job_keys},
    "queues": {},
}


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
        raise PermissionDenied(
            f"runner {name!r} is {'refused' if runner.is_refused else 'revoked'}"
        )
    return runner


def payload_verify(envelope, runner: Runner, *, kind: str, max_age_s: float) -> dict:
    """The payload of an envelope that ``runner`` signed, of the expected
    kind, naming that runner, its fields as PAYLOAD_FIELDS says."""
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
    for field, check in PAYLOAD_FIELDS[kind].items():
        check(field, payload.get(field, _ABSENT))
    return payload
