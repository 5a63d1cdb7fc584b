"""Runner hosts: registered machines that own devices and toolchains and run
validation jobs. Two fields, as in a device lab: ``state`` is set by the
machine, ``health`` by an admin; every change is an audit event, except a
runner's own steps between online and busy (its load, heartbeat by
heartbeat, not an event). A runner starts ``pending``: what it claims to
have (devices, toolchains, host, key) is only its word until a runner admin
has seen it and approved it."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models
from django.utils import timezone

from matrix.models import (
    AuditEvent,
    DeviceType,
    Toolchain,
    choices_check,
    fingerprint_of,
)
from runners import signing


class RunnerQuerySet(models.QuerySet):
    def routable(self):
        """Runners that may be given work: active, not revoked."""
        return self.filter(health=RunnerHealth.ACTIVE, revoked_at__isnull=True)

    def online(self):
        return self.routable().exclude(state=RunnerState.OFFLINE)

    def queues_read(self) -> set[str]:
        """Every queue some runner of this set consumes, in three queries."""
        runners = self.prefetch_related("device_types", "toolchains")
        return {queue for runner in runners for queue in runner.queues()}


# What an inventory says of a device, as a DeviceType holds it.
DEVICE_FIELDS = ("vendor", "model", "arch", "backend", "memory_gb")


class RunnerState(models.TextChoices):
    ONLINE = "online"
    OFFLINE = "offline"
    BUSY = "busy"


class RunnerHealth(models.TextChoices):
    PENDING = "pending", "pending approval"
    ACTIVE = "active"
    MAINTENANCE = "maintenance"
    RETIRED = "retired"
    # A lab runner whose results reached this server only in evidence files
    # (``evidence import``): its columns are shown, it is given no queue.
    EVIDENCE = "evidence", "offline lab (evidence only)"


class Runner(models.Model):
    State = RunnerState
    Health = RunnerHealth

    name = models.SlugField(max_length=60, unique=True)
    # Unique: a key is one runner's identity (see runner_register).
    public_key = models.CharField(
        max_length=64, unique=True, help_text="Ed25519 public key, hex"
    )
    state = models.CharField(max_length=8, choices=State.choices, default=State.OFFLINE)
    health = models.CharField(
        max_length=12, choices=Health.choices, default=Health.PENDING
    )
    inventory = models.JSONField(default=dict, blank=True)
    device_types = models.ManyToManyField(
        DeviceType, blank=True, related_name="runners"
    )
    toolchains = models.ManyToManyField(
        Toolchain, through="RunnerToolchain", related_name="runners"
    )
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    last_sequence = models.BigIntegerField(
        default=0, help_text="highest heartbeat sequence seen"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = RunnerQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            choices_check("state", RunnerState, "runner_state_valid"),
            choices_check("health", RunnerHealth, "runner_health_valid"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        """This runner's own queue, for health probes."""
        return f"runner.{self.name}"

    @property
    def has_nvcc(self) -> bool:
        return bool(self.inventory.get("nvcc"))

    def queues(self) -> list[str]:
        """Every queue this runner's worker consumes: its own, one per
        (device type, toolchain) it can validate on, and the compile-only
        queue of each toolchain it hosts. Reads prefetched relations where
        the caller prefetched them (the runners page, ``queues_read``)."""
        toolchain_ids = sorted(t.pk for t in self.toolchains.all())
        device_type_ids = sorted(d.pk for d in self.device_types.all())
        names = [self.queue]
        names += [
            validate_queue(device_type_id=d, toolchain_id=t)
            for d in device_type_ids
            for t in toolchain_ids
        ]
        names += [compile_queue(toolchain_id=t) for t in toolchain_ids]
        if self.has_nvcc:
            names += [compile_queue(toolchain_id=t, nvcc=True) for t in toolchain_ids]
        return names

    def _change(
        self,
        field: str,
        value: str,
        *,
        actor=None,
        by_self=True,
        verb: str,
        audit: bool = True,
    ) -> None:
        before = getattr(self, field)
        if before == value:
            return
        setattr(self, field, value)
        self.save(update_fields=[field])
        if not audit:
            return
        AuditEvent.record(
            actor=actor,
            # The runner's own transitions are its own; an admin's change
            # without a user (the command line) reads "system".
            actor_label=self.name if actor is None and by_self else "",
            verb=verb,
            obj=self,
            before={field: before},
            after={field: value},
        )

    def go_online(self) -> None:
        self._change(
            "state",
            self.State.ONLINE,
            verb="runner.online",
            audit=self.state == self.State.OFFLINE,
        )

    def go_offline(self) -> None:
        self._change("state", self.State.OFFLINE, verb="runner.offline")

    def go_busy(self) -> None:
        self._change(
            "state",
            self.State.BUSY,
            verb="runner.busy",
            audit=self.state == self.State.OFFLINE,
        )

    @property
    def key_fingerprint(self) -> str:
        return signing.key_fingerprint(self.public_key)

    @property
    def is_pending(self) -> bool:
        return self.health == RunnerHealth.PENDING and self.revoked_at is None

    @property
    def has_no_queue(self) -> bool:
        """Pending approval, or an offline lab known by its evidence."""
        return self.health in (RunnerHealth.PENDING, RunnerHealth.EVIDENCE)

    @property
    def is_refused(self) -> bool:
        return self.health == RunnerHealth.PENDING and self.revoked_at is not None

    def claimed_device_types(self) -> list[DeviceType]:
        """The device types its inventory names, unsaved: until a runner
        admin approves it, a runner adds no column to the matrix."""
        return [
            DeviceType(**{k: d.get(k) for k in DEVICE_FIELDS})
            for d in (self.inventory or {}).get("devices", [])
        ]

    def claimed_toolchains(self) -> list[Toolchain]:
        """The toolchains its inventory names, unsaved (see above)."""
        return [
            Toolchain(
                name=t["name"],
                tilelang_version=str(t["components"].get("tilelang") or ""),
                components=t["components"],
                fingerprint=fingerprint_of(t["components"]),
            )
            for t in (self.inventory or {}).get("toolchains", [])
        ]

    @property
    def shown_device_types(self):
        if self.health == RunnerHealth.PENDING:
            return self.claimed_device_types()
        return self.device_types.all()

    @property
    def shown_toolchains(self):
        if self.health == RunnerHealth.PENDING:
            return self.claimed_toolchains()
        return self.toolchains.all()

    def claims(self) -> dict:
        """What the runner says it has, as a runner admin reviews it: the
        record an approval or refusal keeps in the audit log."""
        inventory = self.inventory or {}
        host = inventory.get("host") or {}
        return {
            "host": host.get("hostname", ""),
            "key_fingerprint": self.key_fingerprint,
            "devices": [str(d) for d in self.claimed_device_types()],
            "toolchains": [
                {"name": t.name, "fingerprint": t.fingerprint}
                for t in self.claimed_toolchains()
            ],
            "nvcc": self.has_nvcc,
        }

    def set_health(self, health: str, *, by) -> None:
        self._change("health", health, actor=by, by_self=False, verb=f"runner.{health}")

    def approve(self, *, by=None) -> None:
        """Give a pending runner its queues, recording what was approved."""
        self.health = RunnerHealth.ACTIVE
        self.save(update_fields=["health"])
        AuditEvent.record(
            actor=by,
            verb="runner.approve",
            obj=self,
            before={"health": RunnerHealth.PENDING},
            after={"health": RunnerHealth.ACTIVE, "approved": self.claims()},
        )

    def refuse(self, *, by=None) -> None:
        """Refuse a pending runner: its key is revoked, so its next message
        is refused and its name stays taken."""
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
        AuditEvent.record(
            actor=by,
            verb="runner.refuse",
            obj=self,
            after={"revoked": True, "refused": self.claims()},
        )

    def revoke(self, *, by=None) -> None:
        if self.revoked_at:
            return
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
        AuditEvent.record(
            actor=by, verb="runner.revoke", obj=self, after={"revoked": True}
        )


CONTROL_QUEUE = "control"


def validate_queue(*, device_type_id: int, toolchain_id: int) -> str:
    return f"validate.dt{device_type_id}.tc{toolchain_id}"


def compile_queue(*, toolchain_id: int, nvcc: bool = False) -> str:
    """Compile-only work any runner hosting the toolchain may take; `build`
    jobs for cuda need nvcc, so they have a queue of their own."""
    return f"compile.tc{toolchain_id}" + (".nvcc" if nvcc else "")


class RunnerToolchain(models.Model):
    """A toolchain hosted on a runner: its own interpreter environment."""

    runner = models.ForeignKey(Runner, on_delete=models.CASCADE)
    toolchain = models.ForeignKey(Toolchain, on_delete=models.PROTECT)
    interpreter = models.CharField(max_length=300)
    harness_fingerprint = models.CharField(
        max_length=64, blank=True, help_text="the harness's own hash of this toolchain"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["runner", "toolchain"], name="runner_toolchain_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.toolchain} on {self.runner}"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class RegistrationToken(models.Model):
    """Single-use, expiring; only its sha256 is stored."""

    digest = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.OneToOneField(
        Runner, null=True, blank=True, on_delete=models.SET_NULL, related_name="token"
    )

    def __str__(self) -> str:
        return f"token {self.digest[:8]}…"


class Receipt(models.Model):
    """The signed envelope a result arrived in: its nonce is unique, so a
    replayed envelope is recognised, and its signature is kept as evidence."""

    result = models.OneToOneField(
        "matrix.Result", on_delete=models.CASCADE, related_name="receipt"
    )
    runner = models.ForeignKey(
        Runner, on_delete=models.PROTECT, related_name="receipts"
    )
    nonce = models.CharField(max_length=64)
    signature = models.CharField(max_length=128)
    issued_at = models.CharField(max_length=40)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # A constraint rather than unique=True: on PostgreSQL that would
            # add a second, LIKE-ready index of every nonce that no query
            # reads and every result written maintains.
            models.UniqueConstraint(fields=["nonce"], name="receipt_nonce_unique"),
        ]

    def __str__(self) -> str:
        return f"receipt {self.nonce[:8]} from {self.runner_id}"


class SpentNonce(models.Model):
    """The nonce of a signed request a runner made over HTTP (claim, recover,
    outbox, queues): each is accepted once. Kept while an envelope with that
    nonce could still pass the freshness check, then pruned."""

    nonce = models.CharField(max_length=64, unique=True)
    runner = models.ForeignKey(Runner, on_delete=models.CASCADE, related_name="+")
    issued_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"nonce {self.nonce[:8]} from {self.runner_id}"
