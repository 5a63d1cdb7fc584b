"""Deliveries: email through a real SMTP server, webhooks to a real HTTP
receiver, signed; retried with backoff, every attempt logged; messages go
to the subscriptions whose scope they touch, once per happening."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from matrix.fleet.models import Runner
from matrix.models import DeviceType, Operator
from matrix.models.notifications import (
    Delivery,
    DeliveryAttempt,
    Notification,
    Subscription,
)
from matrix.notifications import services, watch
from matrix.notifications.channels import signature, signature_valid

from .conftest import COMPILE_ERROR, claimed, ingest, new_revision

pytestmark = pytest.mark.django_db


def publish(**scope):
    return services.notification_publish(
        topic="alert",
        key="alert:test:1",
        subject="New alert #1",
        text="3 cells turned compile error",
        link="http://localhost:8000/alerts/1/",
        scope=scope,
    )


def test_a_webhook_is_slack_compatible_and_signed(reviewer, hooks, deliveries_run):
    hook = Subscription.objects.create(
        user=reviewer, channel="webhook", url=hooks.address, topics=["alert"]
    )

    deliveries_run(publish)

    (request,) = hooks.requests
    body = json.loads(request["body"])
    assert body["text"].startswith("*New alert #1*")
    timestamp = request["headers"]["X-TileMatrix-Timestamp"]
    sent = request["headers"]["X-TileMatrix-Signature"]
    assert sent == signature(hook.secret, timestamp, request["body"])
    assert signature_valid(hook.secret, timestamp, request["body"], sent)
    # Another secret, or the body changed, does not verify.
    assert not signature_valid("other", timestamp, request["body"], sent)
    assert not signature_valid(hook.secret, timestamp, request["body"] + b" ", sent)


def test_an_old_timestamp_does_not_verify():
    old = str(int(timezone.now().timestamp()) - 3600)
    body = b'{"text": "x"}'
    assert not signature_valid("s", old, body, signature("s", old, body))


def test_email_goes_through_a_real_smtp_server(reviewer, smtp, deliveries_run):
    Subscription.objects.create(
        user=reviewer, channel="email", email="r@example.com", topics=["alert"]
    )

    deliveries_run(publish)

    (message,) = smtp.messages
    assert message["to"] == ["r@example.com"]
    assert "Subject: New alert #1" in message["body"]
    assert "http://localhost:8000/alerts/1/" in message["body"]
    (attempt,) = DeliveryAttempt.objects.all()
    assert attempt.ok and attempt.channel == "email"


def test_a_failing_hook_is_retried_and_every_attempt_logged(
    reviewer, hooks, deliveries_run
):
    Subscription.objects.create(
        user=reviewer, channel="webhook", url=hooks.address, topics=["alert"]
    )
    hooks.answers = [500, 503]

    deliveries_run(publish)

    attempts = list(DeliveryAttempt.objects.order_by("number"))
    assert [(a.number, a.ok) for a in attempts] == [(1, False), (2, False), (3, True)]
    assert "HTTP 500" in attempts[0].detail
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts) == ("sent", 3)
    assert len(hooks.requests) == 3


def test_an_unreachable_hook_is_given_up_after_the_last_attempt(
    reviewer, deliveries_run
):
    Subscription.objects.create(
        user=reviewer,
        channel="webhook",
        url="http://127.0.0.1:9/nothing-listens",
        topics=["alert"],
    )

    deliveries_run(publish)

    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts) == ("failed", services.MAX_ATTEMPTS)
    assert "unreachable" in delivery.last_error
    assert DeliveryAttempt.objects.count() == services.MAX_ATTEMPTS


def test_a_delivery_attempted_again_after_it_was_sent_sends_nothing(
    reviewer, hooks, deliveries_run
):
    Subscription.objects.create(
        user=reviewer, channel="webhook", url=hooks.address, topics=["alert"]
    )
    deliveries_run(publish)
    delivery = Delivery.objects.get()

    again = services.delivery_attempt(delivery_id=delivery.pk)

    assert not again.sent and not again.retry
    assert len(hooks.requests) == 1


def test_a_happening_is_told_once(reviewer, hooks, deliveries_run):
    Subscription.objects.create(
        user=reviewer, channel="webhook", url=hooks.address, topics=["alert"]
    )

    deliveries_run(publish)
    assert deliveries_run(publish) is None

    assert len(hooks.requests) == 1


def test_subscriptions_get_only_what_their_scope_touches(catalog, reviewer, owner):
    cuda = DeviceType.objects.filter(backend="cuda").first()
    gemm = Operator.objects.get(name="gemm")
    wanted = [
        Subscription.objects.create(
            user=reviewer, channel="email", email="a@x.org", topics=["alert"]
        ),
        Subscription.objects.create(
            user=reviewer,
            channel="email",
            email="b@x.org",
            topics=["alert"],
            backend="c",
        ),
    ]
    for unwanted in (
        {"backend": "cuda"},
        {"device_type": cuda},
        {"operator": gemm},
        {"model": "llama-3-8b"},
        {"topics": ["sweep"]},
        {"active": False},
    ):
        Subscription.objects.create(
            user=owner,
            channel="email",
            email="n@x.org",
            **{"topics": ["alert"], **unwanted},
        )

    notification = publish(
        backends=["c"], device_types=[], operators=["softmax"], models=["mixtral"]
    )

    assert {d.subscription for d in notification.deliveries.all()} == set(wanted)


def test_a_new_alert_tells_the_subscribers_once_reopened_again(
    cpu_runner, green, reviewer, hooks, deliveries_run
):
    from matrix.revisions import make_current

    Subscription.objects.create(
        user=reviewer, channel="webhook", url=hooks.address, topics=["alert"]
    )
    shapes = green(2)
    broken = new_revision()
    deliveries_run(
        ingest,
        cpu_runner,
        claimed(cpu_runner, shapes),
        status="compile_error",
        **COMPILE_ERROR,
    )
    new_revision()
    deliveries_run(ingest, cpu_runner, claimed(cpu_runner, shapes))  # fixed
    make_current(broken, ["c"])
    deliveries_run(
        ingest,
        cpu_runner,
        claimed(cpu_runner, shapes),
        status="compile_error",
        **COMPILE_ERROR,
    )

    subjects = [json.loads(r["body"])["subject"] for r in hooks.requests]
    assert len(subjects) == 2
    assert "New alert" in subjects[0] and "Reopened alert" in subjects[1]


def test_a_sweep_finished_with_failures_is_told(
    cpu_runner, reviewer, hooks, deliveries_run
):
    from .conftest import served_shapes

    Subscription.objects.create(
        user=reviewer, channel="webhook", url=hooks.address, topics=["sweep"]
    )
    jobs = claimed(cpu_runner, served_shapes(3))

    deliveries_run(ingest, cpu_runner, jobs[:2])
    assert not hooks.requests  # one job still running
    deliveries_run(
        ingest, cpu_runner, jobs[2:], status="compile_error", **COMPILE_ERROR
    )

    (request,) = hooks.requests
    body = json.loads(request["body"])
    assert body["data"] == {
        "sweep": jobs[0].sweep_id,
        "failing": 1,
        "statuses": {"compile_error": 1},
    }


def test_runners_silent_or_waiting_too_long_are_told_once(register, reviewer, settings):
    Subscription.objects.create(
        user=reviewer, channel="email", email="r@x.org", topics=["runner"]
    )
    settings.TILEMATRIX_NOTIFY_RUNNER_OFFLINE_S = 600
    settings.TILEMATRIX_NOTIFY_RUNNER_PENDING_S = 3600
    silent = register(name="silent-1").runner
    waiting = register(name="waiting-1", approved=False, online=False).runner
    fresh = register(name="fresh-1", approved=False, online=False).runner
    long_ago = timezone.now() - timedelta(hours=2)
    Runner.objects.filter(pk=silent.pk).update(state="offline", last_heartbeat=long_ago)
    Runner.objects.filter(pk=waiting.pk).update(created_at=long_ago)

    assert sorted(watch.runners_watch()) == ["silent-1", "waiting-1"]
    watch.runners_watch()

    subjects = sorted(Notification.objects.values_list("subject", flat=True))
    assert len(subjects) == 2
    assert "silent-1 has been offline for more than 10 minutes" in subjects[0]
    assert "waiting-1 has waited for approval" in subjects[1]
    assert fresh.name not in " ".join(subjects)
