"""A refused action says why in words that fit the person refused, and an
expected refusal leaves one line in the log, not a traceback."""

from __future__ import annotations

import logging

import pytest
from django.urls import reverse

from matrix.gate.services import proposal_open
from matrix.models.gate import Approval

ROLE_HINT = "an admin can give your account the role it needs"


@pytest.fixture
def green(world):
    world.green(world.old)
    world.green(world.new)
    return proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )


def tracebacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info]


def test_a_self_approval_is_refused_in_words_without_a_traceback(
    client, world, green, caplog
):
    client.force_login(world.owner)  # a reviewer too: only the rule stops them
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client.post(
            reverse("upgrade-decide", args=[green.pk]),
            {"decision": "approve", "comment": "mine"},
            HTTP_HX_REQUEST="true",
        )
    assert response.status_code == 403
    body = response.content.decode()
    assert (
        "<p data-reason>You proposed this upgrade, so your decision cannot count: "
        "another reviewer approves or rejects it</p>"
    ) in body
    # No role would change the answer: the page does not suggest one.
    assert ROLE_HINT not in body
    assert tracebacks(caplog) == []
    assert [r.getMessage() for r in caplog.records] == [
        f"Forbidden: /upgrades/{green.pk}/decide/"
    ]
    assert not Approval.objects.exists()


def test_a_missing_role_still_points_at_an_admin(
    client, outsider, world, green, caplog
):
    client.force_login(outsider)
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client.post(
            reverse("upgrade-decide", args=[green.pk]),
            {"decision": "approve", "comment": "hi"},
        )
    assert response.status_code == 403
    body = response.content.decode()
    assert "only reviewers decide on upgrades" in body
    assert ROLE_HINT in body
    assert tracebacks(caplog) == []


def test_an_admin_is_not_told_to_ask_an_admin(client, admin_user, world, green):
    green.proposer = admin_user
    green.save(update_fields=["proposer"])
    client.force_login(admin_user)
    response = client.post(
        reverse("upgrade-exception", args=[green.pk]), {"backend": "c", "reason": "x"}
    )
    assert response.status_code == 403
    body = response.content.decode()
    assert "You proposed this upgrade, so another reviewer grants any exception" in body
    assert ROLE_HINT not in body


def test_the_api_still_answers_a_refusal_in_json(client, outsider, settings):
    settings.TILEMATRIX_ANONYMOUS_READ = False
    client.force_login(outsider)
    response = client.post(
        "/api/v1/kernels",
        {"operator": "gemm", "source": "x", "backends": ["cuda"]},
        content_type="application/json",
    )
    assert response.status_code == 403
    assert response["Content-Type"].startswith("application/json")
