"""Registration: single-use tokens exchanged for a Runner that holds the
runner's public key, device types and toolchains; approval or refusal of
what it claims by a runner admin; and revocation.

A registered runner is pending: it may say it has any device and any
toolchain fingerprint (a token proves only that an admin let someone
register), so it gets no queue, claims nothing and is planned no bundle
until a runner admin has seen its inventory and approved it."""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from matrix.fleet import broker_access
from matrix.fleet.models import RegistrationToken, Runner, RunnerToolchain, token_digest
from matrix.fleet.services.errors import Conflict
from matrix.fleet.services.liveness import bundle_jobs_lose
from matrix.models import AuditEvent, Backend, DeviceType, Toolchain, fingerprint_of
from matrix.services import toolchain_register
from runners import signing
from runners.harness.fingerprint import TOOLCHAIN_KEYS

log = logging.getLogger(__name__)

INVENTORY_MAX_BYTES = 64 * 1024
# A petabyte: far above any device, far below what the database column holds.
DEVICE_MEMORY_MAX_GB = 1_000_000
INVENTORY_MAX_DEVICES = 64
INVENTORY_MAX_TOOLCHAINS = 16
# The Toolchain row keeps the TileLang version in a column of this width;
# the other components are versions in JSON.
TILELANG_VERSION_MAX = Toolchain._meta.get_field("tilelang_version").max_length
COMPONENT_MAX = 120
HOSTNAME_MAX = 253


@transaction.atomic
def token_create(*, expires: timedelta, created_by=None) -> str:
    """A new single-use registration token; only its digest is stored."""
    if expires <= timedelta(0):
        raise ValidationError("a token must expire in the future")
    # Hex: a token starting with "-" would read as an option on a command line.
    token = secrets.token_hex(32)
    record = RegistrationToken.objects.create(
        digest=token_digest(token),
        created_by=created_by,
        expires_at=timezone.now() + expires,
    )
    AuditEvent.record(
        actor=created_by,
        verb="token.create",
        obj=record,
        after={"expires_at": record.expires_at.isoformat()},
    )
    return token


@transaction.atomic
def token_create_unless_just_made(
    *, expires: timedelta, created_by, within: timedelta
) -> str | None:
    """A token for ``created_by``, or None where they had one made less than
    ``within`` ago: the second click of a double click, however late its
    request comes (after the first's answer, on a fast server), makes none.
    The user's row is locked so two such requests at once make one token."""
    get_user_model().objects.select_for_update().filter(pk=created_by.pk).first()
    recent = RegistrationToken.objects.filter(
        created_by=created_by, created_at__gt=timezone.now() - within
    )
    if recent.exists():
        return None
    return token_create(expires=expires, created_by=created_by)


def _clean_device(i: int, raw) -> dict:
    if not isinstance(raw, dict):
        raise ValidationError(f"inventory.devices[{i}] must be an object")
    backend = raw.get("backend")
    if backend not in Backend.values:
        raise ValidationError(
            f"inventory.devices[{i}].backend must be one of {Backend.values}"
        )
    clean = {"backend": backend}
    for field, limit in (("vendor", 40), ("model", 80), ("arch", 40)):
        value = raw.get(field, "")
        if not isinstance(value, str) or len(value) > limit:
            raise ValidationError(
                f"inventory.devices[{i}].{field} must be text of at most {limit} characters"
            )
        clean[field] = value.strip()
    if not clean["vendor"] or not clean["model"]:
        raise ValidationError(f"inventory.devices[{i}] needs a vendor and a model")
    memory = raw.get("memory_gb")
    if memory is not None and (
        isinstance(memory, bool)
        or not isinstance(memory, int)
        or not 0 <= memory <= DEVICE_MEMORY_MAX_GB
    ):
        raise ValidationError(
            f"inventory.devices[{i}].memory_gb must be a whole number of "
            f"gigabytes from 0 to {DEVICE_MEMORY_MAX_GB}"
        )
    clean["memory_gb"] = memory
    return clean


def _clean_toolchain(i: int, raw) -> dict:
    if not isinstance(raw, dict):
        raise ValidationError(f"inventory.toolchains[{i}] must be an object")
    name, interpreter = raw.get("name"), raw.get("interpreter")
    components, harness_hash = raw.get("components"), raw.get("fingerprint", "")
    if not isinstance(name, str) or not 0 < len(name) <= 80:
        raise ValidationError(f"inventory.toolchains[{i}].name must be 1-80 characters")
    if not isinstance(interpreter, str) or not interpreter.startswith("/"):
        raise ValidationError(
            f"inventory.toolchains[{i}].interpreter must be an absolute path"
        )
    if not isinstance(components, dict) or not components.get("tilelang"):
        raise ValidationError(
            f"inventory.toolchains[{i}].components must name at least tilelang"
        )
    if not isinstance(harness_hash, str) or len(harness_hash) > 64:
        raise ValidationError(f"inventory.toolchains[{i}].fingerprint must be a hash")
    # Only the toolchain itself identifies it: the same toolchain on two hosts
    # with different GPUs or kernels must match one Toolchain row.
    components = {k: components.get(k) for k in TOOLCHAIN_KEYS}
    for key, value in components.items():
        limit = TILELANG_VERSION_MAX if key == "tilelang" else COMPONENT_MAX
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            raise ValidationError(
                f"inventory.toolchains[{i}].components.{key} must be a version "
                f"of at most {limit} characters, or null"
            )
    return {
        "name": name,
        "interpreter": interpreter[:300],
        "components": components,
        "harness_fingerprint": harness_hash,
    }


def inventory_clean(inventory) -> dict:
    """Check an inventory's size and shape; raise ValidationError naming the
    first problem."""
    if not isinstance(inventory, dict):
        raise ValidationError("inventory must be a JSON object")
    text = signing.canonical(inventory)
    if b"\\u0000" in text:
        # PostgreSQL keeps no NUL in text or JSON: refused here rather than
        # failing as a server error when the inventory is stored.
        raise ValidationError("inventory may not contain NUL characters")
    size = len(text)
    if size > INVENTORY_MAX_BYTES:
        raise ValidationError(
            f"inventory is {size} bytes; the limit is {INVENTORY_MAX_BYTES}"
        )
    devices, toolchains = inventory.get("devices"), inventory.get("toolchains")
    if not isinstance(devices, list) or not isinstance(toolchains, list):
        raise ValidationError("inventory needs lists 'devices' and 'toolchains'")
    if len(devices) > INVENTORY_MAX_DEVICES:
        raise ValidationError(
            f"inventory lists more than {INVENTORY_MAX_DEVICES} devices"
        )
    if not toolchains:
        raise ValidationError(
            "inventory lists no toolchain: the runner could run nothing"
        )
    if len(toolchains) > INVENTORY_MAX_TOOLCHAINS:
        raise ValidationError(
            f"inventory lists more than {INVENTORY_MAX_TOOLCHAINS} toolchains"
        )
    host = inventory.get("host", {})
    if not isinstance(host, dict):
        raise ValidationError("inventory.host must be an object")
    hostname = host.get("hostname", "")
    if not isinstance(hostname, str) or len(hostname) > HOSTNAME_MAX:
        raise ValidationError(
            f"inventory.host.hostname must be a host name of at most "
            f"{HOSTNAME_MAX} characters"
        )
    return {
        "devices": [_clean_device(i, d) for i, d in enumerate(devices)],
        "toolchains": [_clean_toolchain(i, t) for i, t in enumerate(toolchains)],
        "nvcc": bool(inventory.get("nvcc", False)),
        "host": host,
    }


def _public_key_clean(public_key) -> str:
    try:
        if not isinstance(public_key, str) or len(bytes.fromhex(public_key)) != 32:
            raise ValueError
    except ValueError:
        raise ValidationError(
            "public_key must be a 32-byte Ed25519 key in hex"
        ) from None
    return public_key.lower()


def _refuse_taken(name: str, public_key: str) -> None:
    named = Runner.objects.filter(name=name).first()
    if named is not None:
        # A revoked runner keeps its name: its results and audit trail say it.
        revoked = (
            " and revoked; register under another name" if named.revoked_at else ""
        )
        raise Conflict(f"a runner named {name!r} is already registered{revoked}")
    # A key is one runner's identity: under two names its holder speaks for
    # both, and revoking one would leave the key trusted through the other.
    holder = Runner.objects.filter(public_key=public_key).first()
    if holder is not None:
        revoked = " (revoked)" if holder.revoked_at else ""
        raise Conflict(
            f"this public key is already runner {holder.name!r}'s{revoked}: "
            "each runner makes a key pair of its own"
        )


@transaction.atomic
def runner_register(*, token: str, name: str, public_key: str, inventory) -> Runner:
    """Exchange a registration token for a pending Runner holding the
    runner's public key and its inventory. Its device types and toolchains
    become rows (matrix columns, form choices) when it is approved, never
    before: a refused claim leaves nothing behind."""
    if not isinstance(token, str) or not token:
        raise PermissionDenied("a registration token is required")
    record = (
        RegistrationToken.objects.select_for_update()
        .filter(digest=token_digest(token))
        .first()
    )
    if record is None:
        raise PermissionDenied("unknown registration token")
    if record.used_at is not None:
        raise PermissionDenied("registration token already used")
    if record.expires_at <= timezone.now():
        raise PermissionDenied("registration token expired")
    try:
        Runner._meta.get_field("name").run_validators(name)
        if not name or len(name) > 60:
            raise ValidationError("name must be 1-60 characters")
    except ValidationError:
        raise ValidationError(
            "name must be 1-60 letters, digits, hyphens or underscores"
        ) from None
    public_key = _public_key_clean(public_key)
    clean = inventory_clean(inventory)
    _refuse_taken(name, public_key)

    _toolchains_check(clean["toolchains"])
    try:
        with transaction.atomic():
            runner = Runner.objects.create(
                name=name,
                public_key=public_key,
                inventory=clean,
                state=Runner.State.OFFLINE,
                health=Runner.Health.PENDING,
            )
    except IntegrityError:
        # Another registration took the name or the key since the check
        # above; the unique columns refused this one. Say which.
        _refuse_taken(name, public_key)
        raise
    record.used_at = timezone.now()
    record.used_by = runner
    record.save(update_fields=["used_at", "used_by"])
    AuditEvent.record(
        actor_label=name,
        verb="runner.register",
        obj=runner,
        after={
            "device_types": [str(d) for d in runner.claimed_device_types()],
            "toolchains": sorted({t["name"] for t in clean["toolchains"]}),
            "key_fingerprint": runner.key_fingerprint,
            "health": runner.health,
        },
    )
    return runner


def _toolchains_check(toolchains: list[dict]) -> None:
    """Refuse, at registration, a toolchain the approval could not record:
    a new fingerprint under a name another toolchain holds."""
    for spec in toolchains:
        fingerprint = fingerprint_of(spec["components"])
        if Toolchain.objects.filter(fingerprint=fingerprint).exists():
            continue
        if Toolchain.objects.filter(name=spec["name"]).exists():
            raise ValidationError(
                f"a toolchain named {spec['name']!r} already exists with other "
                "components; name this one differently"
            )


def _inventory_adopt(runner: Runner) -> None:
    """Make the approved inventory's device types and toolchains rows, and
    link them to the runner."""
    device_types = [
        DeviceType.objects.get_or_create(
            vendor=d.vendor,
            model=d.model,
            arch=d.arch,
            backend=d.backend,
            defaults={"memory_gb": d.memory_gb},
        )[0]
        for d in runner.claimed_device_types()
    ]
    runner.device_types.set(device_types)
    hosted = {}
    for spec in runner.inventory.get("toolchains", []):
        toolchain = Toolchain.objects.filter(
            fingerprint=fingerprint_of(spec["components"])
        ).first() or toolchain_register(
            name=spec["name"], components=spec["components"]
        )
        hosted.setdefault(toolchain.pk, (toolchain, spec))
    for toolchain, spec in hosted.values():
        RunnerToolchain.objects.update_or_create(
            runner=runner,
            toolchain=toolchain,
            defaults={
                "interpreter": spec["interpreter"],
                "harness_fingerprint": spec["harness_fingerprint"],
            },
        )


def hosted_toolchains(runner: Runner) -> list[dict]:
    """What a registering host keeps of its toolchains: the server's
    fingerprint of each (the one its jobs name) and its interpreter. The id
    is None until approval records a toolchain this server had not seen."""
    claimed = runner.claimed_toolchains()
    known = {
        fingerprint: (pk, name)
        for fingerprint, pk, name in Toolchain.objects.filter(
            fingerprint__in=[t.fingerprint for t in claimed]
        ).values_list("fingerprint", "pk", "name")
    }
    return [
        {
            # A toolchain the server knows keeps its name, as approval will.
            "id": known.get(t.fingerprint, (None, t.name))[0],
            "name": known.get(t.fingerprint, (None, t.name))[1],
            "fingerprint": t.fingerprint,
            "interpreter": spec["interpreter"],
        }
        for t, spec in zip(claimed, runner.inventory["toolchains"], strict=True)
    ]


def runner_evidence_adopt(runner: Runner) -> Runner:
    """The lab runner of an imported evidence file: its device types and
    toolchains become rows (its results are their cells) and it reads as an
    offline lab, with no queue and no approval waiting. The import is the
    server admin's deliberate act."""
    if runner.health != Runner.Health.PENDING or runner.revoked_at is not None:
        return runner
    _inventory_adopt(runner)
    runner.health = Runner.Health.EVIDENCE
    runner.save(update_fields=["health"])
    AuditEvent.record(
        verb="runner.evidence",
        obj=runner,
        before={"health": Runner.Health.PENDING},
        after={"health": runner.health, "claims": runner.claims()},
    )
    return runner


def _pending(name: str) -> Runner:
    runner = Runner.objects.select_for_update().filter(name=name).first()
    if runner is None:
        raise ValidationError(f"no runner named {name!r}")
    if runner.revoked_at is not None:
        raise ValidationError(
            f"runner {name!r} is {'refused' if runner.is_refused else 'revoked'}: "
            "it stays so"
        )
    if runner.health != Runner.Health.PENDING:
        raise ValidationError(
            f"runner {name!r} is not waiting for approval (it is {runner.health})"
        )
    return runner


@transaction.atomic
def runner_approve(*, name: str, by=None) -> Runner:
    """Approve a pending runner's inventory: from now on it has its queues,
    claims jobs and may be planned bundles. The audit event keeps what was
    approved (devices, toolchains, host, key fingerprint)."""
    runner = _pending(name)
    _inventory_adopt(runner)
    runner.approve(by=by)
    # Before the approval commits: a runner approved without its broker user
    # could not work, and the admin would not know why.
    try:
        broker_access.access_grant(runner)
    except broker_access.BrokerAdminError as exc:
        raise ValidationError(
            f"runner {name!r} not approved: its broker user could not be made ({exc})"
        ) from None
    return runner


@transaction.atomic
def runner_refuse(*, name: str, by=None) -> Runner:
    """Refuse a pending runner: it is revoked (its key refused at its next
    message, its name kept) and the audit event keeps what it claimed."""
    runner = _pending(name)
    runner.refuse(by=by)
    return runner


@transaction.atomic
def runner_revoke(*, name: str, by=None) -> Runner:
    runner = Runner.objects.select_for_update().filter(name=name).first()
    if runner is None:
        raise ValidationError(f"no runner named {name!r}")
    runner.revoke(by=by)
    runner.go_offline()
    try:
        runner.broker_connections_closed = broker_access.access_revoke(name)
    except broker_access.BrokerAdminError as exc:
        # The revocation stands (its signatures are refused from now on);
        # the reaper deletes the broker user once the broker answers.
        runner.broker_connections_closed = None
        log.error("runner %s revoked, its broker user not yet deleted: %s", name, exc)
    # Its results are refused from now on: its bundles will not come home.
    bundle_jobs_lose(
        runner=runner, reason=f"runner {name} was revoked before its bundle came home"
    )
    return runner


def broker_users_prune() -> int:
    """Delete the broker users (and close their connections) of runners
    that may no longer hold one: revoked, or gone. The backstop of a
    revocation whose broker part failed; 0 without per-runner users.

    A runner being approved has its user made before its approval commits,
    while ``runner_approve`` holds its row: seen from here it is still
    pending, and its user is not stale. So the rows of the runners waiting
    for approval are locked first: those held by an approval are kept, and
    the others stay locked until the prune is done, so no approval starts
    in between (an approval that has committed is read as approved)."""
    if not broker_access.enabled():
        return 0
    with transaction.atomic():
        waiting = Runner.objects.filter(
            revoked_at__isnull=True,
            health__in=[Runner.Health.PENDING, Runner.Health.EVIDENCE],
        )
        free = set(
            waiting.select_for_update(skip_locked=True).values_list("name", flat=True)
        )
        being_approved = set(waiting.values_list("name", flat=True)) - free
        approved = Runner.objects.filter(revoked_at__isnull=True).exclude(
            health__in=[Runner.Health.PENDING, Runner.Health.EVIDENCE]
        )
        keep = being_approved | set(approved.values_list("name", flat=True))
        return broker_access.users_prune(keep=keep)
