"""Reviewers hear when an upgrade is ready for their decision, and of its
outcome, through the gate's own workflow."""

from __future__ import annotations

import pytest

from matrix.gate.services import proposal_approve, proposal_open
from matrix.models.notifications import Notification, Subscription
from tests.gate.conftest import people, world  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_ready_and_approved_are_told_to_subscribers_of_the_backend(world):  # noqa: F811
    reviewer = world.reviewers[0]
    Subscription.objects.create(
        user=reviewer,
        channel="email",
        email="r@x.org",
        topics=["proposal"],
        backend="c",
    )
    Subscription.objects.create(
        user=reviewer,
        channel="email",
        email="cuda@x.org",
        topics=["proposal"],
        backend="cuda",
    )
    world.green(world.old)
    world.green(world.new)

    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="clean diff")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")

    told = list(
        Notification.objects.filter(topic="proposal")
        .order_by("pk")
        .values_list("subject", flat=True)
    )
    assert [s.split(":")[0] for s in told] == [
        f"[TileMatrix] Upgrade #{proposal.pk} is ready for your decision",
        f"[TileMatrix] Upgrade #{proposal.pk} was approved",
    ]
    for notification in Notification.objects.filter(topic="proposal"):
        assert [d.subscription.email for d in notification.deliveries.all()] == [
            "r@x.org"
        ]
