"""Publishing a message to the subscriptions that want it, and delivering it.

``notification_publish`` runs in the caller's transaction (ingest's, a
decision's): it writes the message and one delivery per matching
subscription, and enqueues their sending once that transaction commits, so
nothing waits for a mail server. ``delivery_attempt`` is one try, logged
whatever comes of it; the task retries it with backoff."""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from matrix.models.notifications import (
    Channel,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Notification,
    Subscription,
    Topic,
)
from matrix.notifications import channels

DELIVER_TASK = "notifications.deliver"
# Attempts before a delivery is given up (the first try and the retries).
MAX_ATTEMPTS = 6


def notification_publish(
    *,
    topic: str,
    key: str,
    subject: str,
    text: str,
    link: str = "",
    scope: dict | None = None,
    data: dict | None = None,
    alert=None,
) -> Notification | None:
    """Write the message named ``key`` (once: None if it was published
    already) and a delivery to each active subscription it matches."""
    scope = scope or {}
    try:
        with transaction.atomic():
            notification = Notification.objects.create(
                topic=topic,
                key=key[:200],
                subject=subject[:200],
                text=text,
                link=link[:500],
                scope=scope,
                data=data or {},
                alert=alert,
            )
    except IntegrityError:
        return None  # told already
    wanted = [
        s
        for s in Subscription.objects.filter(active=True).select_related("operator")
        if s.matches(topic, scope)
    ]
    deliveries = Delivery.objects.bulk_create(
        [Delivery(notification=notification, subscription=s) for s in wanted]
    )
    deliveries_enqueue([d.pk for d in deliveries])
    return notification


def deliveries_enqueue(ids: list[int]) -> None:
    """Send each delivery by its task once the caller's transaction commits
    (by name: the sender need not import the task)."""
    if not ids:
        return
    from matrix.celery import app

    def send():
        for pk in ids:
            # A signature, not send_task: it runs in place where the app is
            # eager (the tests' control worker).
            app.signature(DELIVER_TASK).apply_async(args=[pk], queue="control")

    transaction.on_commit(send)


def test_send(*, subscription: Subscription, by) -> Notification:
    """A message to one subscription only, from its page's "send test"."""
    now = timezone.now()
    notification = Notification.objects.create(
        topic=Topic.TEST,
        key=f"test:{subscription.pk}:{now.isoformat()}",
        subject="TileMatrix test message",
        text=f"A test of {subscription.get_channel_display()} delivery to "
        f"{subscription.address}, sent by {by.get_username()}.",
        data={"subscription": subscription.pk},
    )
    delivery = Delivery.objects.create(
        notification=notification, subscription=subscription
    )
    deliveries_enqueue([delivery.pk])
    return notification


@dataclass
class Attempted:
    sent: bool
    # Another attempt is worth making (the channel failed, attempts left).
    retry: bool
    detail: str = ""


def delivery_attempt(*, delivery_id: int) -> Attempted:
    """One try at a pending delivery. It is claimed first (a conditional
    update of its attempt count), so a message delivered twice by the
    broker is sent once; the try is logged, sent or not."""
    row = (
        Delivery.objects.filter(pk=delivery_id).values_list("state", "attempts").first()
    )
    if row is None or row[0] != DeliveryState.PENDING:
        return Attempted(sent=False, retry=False, detail="nothing to send")
    number = row[1] + 1
    claimed = Delivery.objects.filter(
        pk=delivery_id, state=DeliveryState.PENDING, attempts=row[1]
    ).update(attempts=number)
    if not claimed:
        return Attempted(sent=False, retry=False, detail="another worker has it")
    delivery = Delivery.objects.select_related("notification", "subscription").get(
        pk=delivery_id
    )
    subscription, notification = delivery.subscription, delivery.notification
    started = time.monotonic()
    try:
        if subscription.channel == Channel.EMAIL:
            detail = channels.email_send(
                to=subscription.email, notification=notification
            )
        else:
            detail = channels.webhook_post(
                url=subscription.url,
                secret=subscription.secret,
                notification=notification,
            )
        ok = True
    except channels.DeliveryError as exc:
        detail, ok = str(exc), False
    duration_ms = (time.monotonic() - started) * 1000
    DeliveryAttempt.objects.create(
        delivery=delivery,
        number=number,
        channel=subscription.channel,
        ok=ok,
        detail=detail[:500],
        duration_ms=duration_ms,
    )
    if ok:
        Delivery.objects.filter(pk=delivery_id).update(
            state=DeliveryState.SENT, sent_at=timezone.now(), last_error=""
        )
        return Attempted(sent=True, retry=False, detail=detail)
    final = number >= MAX_ATTEMPTS
    Delivery.objects.filter(pk=delivery_id).update(
        last_error=detail[:500],
        **({"state": DeliveryState.FAILED} if final else {}),
    )
    return Attempted(sent=False, retry=not final, detail=detail)
