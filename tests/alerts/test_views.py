"""The alerts page, an alert's page and its triage, GET /api/v1/alerts, and
the notifications page with its "send test"."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from matrix.alerts.reads import fixed_on_candidate
from matrix.models import AuditEvent, Status
from matrix.models.alerts import Alert, AlertCell, AlertState
from matrix.models.gate import Policy
from matrix.models.notifications import DeliveryAttempt, Subscription

from .conftest import COMPILE_ERROR, claimed, ingest, new_revision

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_alerts(cpu_runner, green):
    """A heavy alert (3 served cells) and a light one (1 cell)."""
    shapes = green(4)
    new_revision()
    jobs = claimed(cpu_runner, shapes)
    ingest(
        cpu_runner,
        jobs[:1],
        status="runtime_error",
        error={"message": "illegal address", "signature": "sig-light"},
    )
    ingest(cpu_runner, jobs[1:], status="compile_error", **COMPILE_ERROR)
    light = Alert.objects.get(signature="sig-light")
    heavy = Alert.objects.get(signature="sig-release")
    return heavy, light


@pytest.fixture
def reviewing(reviewer):
    reviewer.groups.add(Group.objects.get(name="reviewer"))
    return reviewer


def test_the_alerts_page_lists_the_most_served_weight_first(
    client, outsider, two_alerts, django_assert_max_num_queries
):
    heavy, light = two_alerts
    client.force_login(outsider)

    with django_assert_max_num_queries(12):
        body = client.get(reverse("alerts")).content.decode()

    assert body.index(f'href="/alerts/{heavy.pk}/"') < body.index(
        f'href="/alerts/{light.pk}/"'
    )
    assert "3 / 3" in body and "compile error" in body


def test_the_alerts_page_filters_by_state_and_refuses_an_unknown_one(
    client, outsider, two_alerts
):
    heavy, _ = two_alerts
    client.force_login(outsider)

    fixed = client.get(reverse("alerts"), {"state": "fixed"}).content.decode()
    assert f'href="/alerts/{heavy.pk}/"' not in fixed
    assert "No alerts in this state." in fixed
    # htmx asks for the rows alone.
    rows = client.get(
        reverse("alerts"), {"state": "new"}, headers={"HX-Request": "true"}
    ).content.decode()
    assert '<div id="alert-rows">' in rows
    assert f'href="/alerts/{heavy.pk}/"' in rows and "<html" not in rows
    response = client.get(reverse("alerts"), {"state": "closed"})
    assert response.status_code == 400
    assert b"state must be open or one of" in response.content


def test_an_alert_page_shows_its_cells_first_bad_result_and_history(
    client, outsider, two_alerts
):
    heavy, _ = two_alerts
    client.force_login(outsider)

    body = client.get(reverse("alert", args=[heavy.pk])).content.decode()

    assert "LLVM ERROR: cannot select fadd" in body  # the first bad result
    assert body.count("elementwise_add[") >= 3
    assert "alert.open" in body
    # An outsider reads, but is offered no triage.
    assert 'id="triage-acknowledged"' not in body


def test_a_reviewer_acknowledges_then_sends_upstream_with_a_link(
    client, reviewing, two_alerts
):
    heavy, _ = two_alerts
    client.force_login(reviewing)
    triage = reverse("alert-triage", args=[heavy.pk])

    client.post(triage, {"state": "acknowledged"})
    heavy.refresh_from_db()
    assert heavy.state == AlertState.ACKNOWLEDGED

    response = client.post(triage, {"state": "upstream"}, follow=True)
    assert b"upstream needs the link to the TileLang issue" in response.content
    heavy.refresh_from_db()
    assert heavy.state == AlertState.ACKNOWLEDGED

    link = "https://github.com/tile-ai/tilelang/issues/1234"
    client.post(triage, {"state": "upstream", "upstream_url": link})
    heavy.refresh_from_db()
    assert (heavy.state, heavy.upstream_url) == (AlertState.UPSTREAM, link)
    events = list(
        AuditEvent.objects.filter(verb__startswith="alert.", actor=reviewing)
        .order_by("pk")
        .values_list("verb", "before__state", "after__state")
    )
    assert events == [
        ("alert.acknowledged", "new", "acknowledged"),
        ("alert.upstream", "acknowledged", "upstream"),
    ]


def test_wont_fix_needs_a_reason_and_fixed_is_not_a_persons_choice(
    client, reviewing, two_alerts
):
    heavy, _ = two_alerts
    client.force_login(reviewing)
    triage = reverse("alert-triage", args=[heavy.pk])

    client.post(triage, {"state": "wont_fix"})
    client.post(triage, {"state": "fixed"})
    heavy.refresh_from_db()
    assert heavy.state == AlertState.NEW

    client.post(triage, {"state": "wont_fix", "reason": "float32 on c is unserved"})
    heavy.refresh_from_db()
    assert (heavy.state, heavy.wont_fix_reason) == (
        AlertState.WONT_FIX,
        "float32 on c is unserved",
    )


def test_an_outsider_cannot_triage_and_a_get_is_refused(client, outsider, two_alerts):
    heavy, _ = two_alerts
    client.force_login(outsider)
    triage = reverse("alert-triage", args=[heavy.pk])

    assert client.post(triage, {"state": "acknowledged"}).status_code == 403
    assert client.get(triage).status_code == 405
    heavy.refresh_from_db()
    assert heavy.state == AlertState.NEW


def test_the_backends_owner_may_triage(client, outsider, cpu_runner, green):
    Policy.objects.create(version=2, backend_owners={"c": [outsider.username]})
    shapes = green(1)
    new_revision()
    ingest(
        cpu_runner, claimed(cpu_runner, shapes), status="compile_error", **COMPILE_ERROR
    )
    (alert,) = Alert.objects.all()
    client.force_login(outsider)

    client.post(reverse("alert-triage", args=[alert.pk]), {"state": "acknowledged"})

    alert.refresh_from_db()
    assert alert.state == AlertState.ACKNOWLEDGED


def test_the_api_lists_alerts_by_served_weight(client, outsider, two_alerts):
    heavy, light = two_alerts
    client.force_login(outsider)

    answer = client.get("/api/v1/alerts").json()

    assert answer["count"] == 2
    assert [a["id"] for a in answer["alerts"]] == [heavy.pk, light.pk]
    first = answer["alerts"][0]
    assert (
        first["state"],
        first["status"],
        first["cells"],
        first["served_weight"],
    ) == (
        "new",
        "compile_error",
        3,
        3.0,
    )
    assert first["url"].endswith(f"/alerts/{heavy.pk}/")
    assert first["bisection"] is None
    assert client.get("/api/v1/alerts", {"state": "fixed"}).json()["count"] == 0
    assert client.get("/api/v1/alerts", {"backend": "c"}).json()["count"] == 2
    assert client.get("/api/v1/alerts", {"backend": "cuda"}).json()["count"] == 0
    refused = client.get("/api/v1/alerts", {"backend": "tpu"})
    assert refused.status_code == 400
    assert "backend must be one of" in refused.json()["detail"]


def test_the_api_wants_a_reader(client, settings, two_alerts):
    settings.TILEMATRIX_ANONYMOUS_READ = False
    assert client.get("/api/v1/alerts").status_code == 401


def test_an_alert_whose_cells_pass_on_a_newer_toolchain_is_fixed_on_candidate(
    two_alerts,
):
    from matrix.models import Cell, Toolchain
    from matrix.services import toolchain_register

    heavy, light = two_alerts
    candidate = toolchain_register(
        name="tilelang-0.1.16-cpu", components={"tilelang": "0.1.16"}
    )
    for cell in AlertCell.objects.filter(alert=heavy):
        current = Cell.objects.get(
            shape=cell.shape, device_type=cell.device_type, toolchain=cell.toolchain
        )
        Cell.objects.create(
            shape=cell.shape,
            device_type=cell.device_type,
            toolchain=candidate,
            revision=current.revision,
            result=current.result,
            status=Status.PASS,
            updated_at=current.updated_at,
        )

    found = fixed_on_candidate([heavy, light])

    assert set(found) == {heavy.pk}
    assert found[heavy.pk].toolchain == "tilelang-0.1.16-cpu"
    assert Toolchain.objects.count() >= 2


def test_subscribing_and_send_test_shows_the_attempt(
    client, outsider, hooks, deliveries_run
):
    client.force_login(outsider)
    response = client.post(
        reverse("notifications"),
        {"topics": ["alert", "sweep"], "channel": "webhook", "url": hooks.address},
    )
    assert response.status_code == 302
    subscription = Subscription.objects.get(user=outsider)
    assert subscription.topics == ["alert", "sweep"]

    deliveries_run(client.post, reverse("subscription-test", args=[subscription.pk]))

    (request,) = hooks.requests
    assert request["json"]["subject"] == "TileMatrix test message"
    body = client.get(reverse("notifications")).content.decode()
    assert "TileMatrix test message" in body and "HTTP 200" in body
    assert DeliveryAttempt.objects.get().ok


def test_an_email_subscription_needs_an_address(client, outsider):
    client.force_login(outsider)
    response = client.post(
        reverse("notifications"), {"topics": ["alert"], "channel": "email"}
    )
    assert response.status_code == 400
    assert b"email needs an address" in response.content
    assert not Subscription.objects.exists()


def test_someone_elses_subscription_cannot_be_tested_or_stopped(
    client, outsider, owner
):
    theirs = Subscription.objects.create(
        user=owner, channel="email", email="o@x.org", topics=["alert"]
    )
    client.force_login(outsider)
    assert (
        client.post(reverse("subscription-test", args=[theirs.pk])).status_code == 403
    )
    assert (
        client.post(reverse("subscription-stop", args=[theirs.pk])).status_code == 403
    )
    assert client.get(reverse("subscription-test", args=[theirs.pk])).status_code == 405
    theirs.refresh_from_db()
    assert theirs.active
