"""tilematrix_notifications_sent_total / _failed_total count delivery
attempts by channel, read off their log at scrape time."""

from __future__ import annotations

import pytest

from matrix.models.notifications import (
    Delivery,
    DeliveryAttempt,
    Notification,
    Subscription,
)

pytestmark = pytest.mark.django_db


def test_delivery_attempts_are_counted_by_channel_and_outcome(scrape, owner):
    hook = Subscription.objects.create(
        user=owner, channel="webhook", url="http://127.0.0.1:9/", topics=["alert"]
    )
    notification = Notification.objects.create(
        topic="alert", key="alert:1:opened:0", subject="s", text="t"
    )
    delivery = Delivery.objects.create(notification=notification, subscription=hook)
    for number, ok in ((1, False), (2, False), (3, True)):
        DeliveryAttempt.objects.create(
            delivery=delivery, number=number, channel="webhook", ok=ok
        )

    figures = scrape()

    assert (
        figures[("tilematrix_notifications_sent_total", (("channel", "webhook"),))] == 1
    )
    assert (
        figures[("tilematrix_notifications_failed_total", (("channel", "webhook"),))]
        == 2
    )
    assert (
        figures[("tilematrix_notifications_sent_total", (("channel", "email"),))] == 0
    )
    assert figures[("tilematrix_scrape_part_ok", (("part", "notifications"),))] == 1
