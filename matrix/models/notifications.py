"""Notifications: who wants to hear of what, the messages, and every attempt
to deliver one (``matrix.notifications`` writes and sends them)."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q

from matrix.models import Backend, choices_check


class Topic(models.TextChoices):
    ALERT = "alert", "new and reopened alerts"
    PROPOSAL = "proposal", "upgrades ready for a decision, and their outcome"
    RUNNER = "runner", "runners offline or pending approval too long"
    SWEEP = "sweep", "sweeps finished with failures"
    # A message sent from the notifications page to try a subscription.
    TEST = "test", "test message"


SUBSCRIBABLE = [t for t in Topic if t != Topic.TEST]


class Channel(models.TextChoices):
    EMAIL = "email"
    WEBHOOK = "webhook", "webhook (Slack / Mattermost compatible)"


def webhook_secret() -> str:
    return secrets.token_hex(32)


class Subscription(models.Model):
    """One person's wish to hear of some topics on one channel, narrowed to
    a backend, a device type, an operator or a served model (blank: all)."""

    Channel = Channel

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    channel = models.CharField(max_length=8, choices=Channel.choices)
    email = models.EmailField(blank=True)
    url = models.URLField(max_length=500, blank=True)
    # Signs each webhook body (HMAC-SHA256); shown to its owner only.
    secret = models.CharField(max_length=64, default=webhook_secret)
    topics = models.JSONField(default=list)
    backend = models.CharField(max_length=8, choices=Backend.choices, blank=True)
    device_type = models.ForeignKey(
        "matrix.DeviceType",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
    )
    operator = models.ForeignKey(
        "matrix.Operator",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
    )
    model = models.CharField(
        max_length=80, blank=True, help_text="a served model (profile or trace)"
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user", "pk"]
        constraints = [
            choices_check("channel", Channel, "subscription_channel_valid"),
            models.CheckConstraint(
                condition=(Q(channel=Channel.EMAIL) & ~Q(email=""))
                | (Q(channel=Channel.WEBHOOK) & ~Q(url="")),
                name="subscription_has_address",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} · {self.channel} → {self.address}"

    @property
    def address(self) -> str:
        return self.email if self.channel == Channel.EMAIL else self.url

    @property
    def scope_label(self) -> str:
        parts = [
            p
            for p in (
                self.backend,
                str(self.device_type) if self.device_type_id else "",
                self.operator.name if self.operator_id else "",
                self.model,
            )
            if p
        ]
        return " · ".join(parts) or "everything"

    def matches(self, topic: str, scope: dict) -> bool:
        """Whether a message on ``topic`` about ``scope`` is for this
        subscription. A scope names the backends, device type ids, operator
        names and models a message touches; one it leaves out (a proposal
        touches every operator) narrows nothing."""
        if not self.active or topic not in self.topics:
            return False
        for wanted, key in (
            (self.backend, "backends"),
            (self.device_type_id, "device_types"),
            (self.operator.name if self.operator_id else "", "operators"),
            (self.model, "models"),
        ):
            touched = scope.get(key)
            if wanted and touched is not None and wanted not in touched:
                return False
        return True


class Notification(models.Model):
    """One message about one happening, whoever it goes to. ``key`` names
    the happening, so that it is told once (one message per alert opened,
    not one per cell)."""

    topic = models.CharField(max_length=10, choices=Topic.choices)
    key = models.CharField(max_length=200, unique=True)
    subject = models.CharField(max_length=200)
    text = models.TextField()
    link = models.CharField(max_length=500, blank=True)
    scope = models.JSONField(default=dict, blank=True)
    data = models.JSONField(default=dict, blank=True)
    alert = models.ForeignKey(
        "matrix.Alert",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="notifications",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [choices_check("topic", Topic, "notification_topic_valid")]

    def __str__(self) -> str:
        return self.subject


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed", "failed (gave up)"


class Delivery(models.Model):
    """A notification on its way to one subscription."""

    State = DeliveryState

    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="deliveries"
    )
    subscription = models.ForeignKey(
        Subscription, on_delete=models.CASCADE, related_name="deliveries"
    )
    state = models.CharField(
        max_length=8, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["notification", "subscription"], name="delivery_once"
            ),
            choices_check("state", DeliveryState, "delivery_state_valid"),
        ]
        indexes = [models.Index(fields=["state"], name="delivery_state")]

    def __str__(self) -> str:
        return f"{self.notification} → {self.subscription.address}: {self.state}"


class DeliveryAttempt(models.Model):
    """One try at sending a delivery, whatever came of it. Append-only."""

    delivery = models.ForeignKey(
        Delivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    number = models.PositiveSmallIntegerField()
    channel = models.CharField(max_length=8, choices=Channel.choices)
    ok = models.BooleanField()
    detail = models.CharField(max_length=500, blank=True)
    duration_ms = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["delivery", "number"], name="delivery_attempt_once"
            )
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}: {'ok' if self.ok else 'failed'}"
