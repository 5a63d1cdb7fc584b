from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from matrix.fleet.models import RegistrationToken, Runner, token_digest, validate_queue
from matrix.models import AuditEvent, Shape, ValidationJob
from matrix.views import runners as runners_views

pytestmark = pytest.mark.django_db


def _runner_admin(django_user_model, name):
    user = django_user_model.objects.create_user(name, password="lab-pass-123")
    user.groups.add(Group.objects.get(name="runner admin"))
    return user


@pytest.fixture
def runner_admin(django_user_model):
    return _runner_admin(django_user_model, "labadmin")


@pytest.fixture
def other_runner_admin(django_user_model):
    return _runner_admin(django_user_model, "labadmin2")


def test_it_lists_runners_with_devices_toolchains_and_queue_depth(
    client, cpu_runner, device_types, toolchains
):
    shape = Shape.objects.first()
    ValidationJob.objects.create(
        revision=shape.operator.revisions.get(is_current=True),
        shape=shape,
        device_type=device_types["c"],
        toolchain=toolchains[1],
        queue=validate_queue(
            device_type_id=device_types["c"].pk, toolchain_id=toolchains[1].pk
        ),
    )
    response = client.get(reverse("runners"))
    (row,) = response.context["rows"]
    assert row["queued"] == 1 and row["running"] == 0
    body = response.content.decode()
    assert "cpu-host" in body and "online" in body and "tl-0.1.15" in body
    assert "x86-64 CPU" in body


def test_a_runner_still_marked_online_without_heartbeats_reads_as_silent(
    client, cpu_runner
):
    body = client.get(reverse("runners")).content.decode()
    assert "silent" not in body
    # Its worker and the control worker that would reap it are both gone.
    Runner.objects.filter(pk=cpu_runner.pk).update(
        last_heartbeat=timezone.now() - timedelta(minutes=5)
    )
    body = client.get(reverse("runners")).content.decode()
    assert (
        '<span class="badge online">online</span> <span class="badge silent">' in body
    )
    assert "missed its heartbeats; offline once the control worker reaps" in body


def test_runners_page_stays_within_ten_queries(
    client, cpu_runner, runner_admin, django_assert_max_num_queries
):
    client.force_login(runner_admin)
    with django_assert_max_num_queries(10):
        client.get(reverse("runners"))


def test_a_token_is_shown_once_with_the_command_and_stored_hashed(client, runner_admin):
    client.force_login(runner_admin)
    response = client.post(reverse("runner-token"), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    body = response.content.decode()
    token = re.search(r"--token (\S+)", body).group(1)
    assert "manage.py runner register" in body
    assert RegistrationToken.objects.filter(digest=token_digest(token)).exists()
    assert token not in client.get(reverse("runners")).content.decode()


def test_a_second_request_of_a_double_click_makes_no_second_token(client, runner_admin):
    # The second click's request may come after the first's answer (a fast
    # server, a loaded browser): the page keeps the first token.
    client.force_login(runner_admin)
    first = client.post(reverse("runner-token"), HTTP_HX_REQUEST="true")
    token = re.search(r"--token (\S+)", first.content.decode()).group(1)
    second = client.post(reverse("runner-token"), HTTP_HX_REQUEST="true")
    assert second.status_code == 204 and second.content == b""
    without_js = client.post(reverse("runner-token"))
    assert without_js.status_code == 409
    assert "this second click made none" in without_js.content.decode()
    assert list(RegistrationToken.objects.values_list("digest", flat=True)) == [
        token_digest(token)
    ]


def test_the_next_runner_gets_its_token_once_the_double_click_window_passed(
    client, runner_admin, other_runner_admin
):
    client.force_login(runner_admin)
    client.post(reverse("runner-token"), HTTP_HX_REQUEST="true")
    RegistrationToken.objects.update(
        created_at=timezone.now() - runners_views.DOUBLE_CLICK_WINDOW
    )
    assert client.post(reverse("runner-token")).status_code == 200
    # The window is each admin's own: another's click is not a repeat.
    client.force_login(other_runner_admin)
    assert client.post(reverse("runner-token")).status_code == 200
    assert RegistrationToken.objects.count() == 3


def test_maintenance_toggles_and_is_audited(client, cpu_runner, runner_admin):
    client.force_login(runner_admin)
    url = reverse("runner-health", args=[cpu_runner.pk])
    response = client.post(url, {"health": "maintenance"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "End maintenance" in response.content.decode()
    cpu_runner.refresh_from_db()
    assert cpu_runner.health == Runner.Health.MAINTENANCE
    assert AuditEvent.objects.filter(
        verb="runner.maintenance", actor=runner_admin
    ).exists()
    client.post(url, {"health": "active"})
    cpu_runner.refresh_from_db()
    assert cpu_runner.health == Runner.Health.ACTIVE


def test_an_unknown_health_is_refused(client, cpu_runner, runner_admin):
    client.force_login(runner_admin)
    url = reverse("runner-health", args=[cpu_runner.pk])
    assert client.post(url, {"health": "retired-ish"}).status_code == 400


def test_revoke_takes_the_runner_out_of_routing(
    client, cpu_runner, runner_admin, django_user_model
):
    client.force_login(runner_admin)
    response = client.post(
        reverse("runner-revoke", args=[cpu_runner.pk]), HTTP_HX_REQUEST="true"
    )
    row = response.content.decode()
    assert response.status_code == 200 and "revoked" in row
    assert not Runner.objects.online().filter(pk=cpu_runner.pk).exists()
    # Jobs still wait on the queues it read, but not for it.
    assert "takes no jobs" in row and "queued" not in row
    # Nor does maintenance bring it back, on the page or in the admin.
    health = client.post(
        reverse("runner-health", args=[cpu_runner.pk]), {"health": "active"}
    )
    assert health.status_code == 400
    assert health.content.decode() == "a revoked runner stays revoked"
    change = reverse("admin:runners_runner_change", args=[cpu_runner.pk])
    client.force_login(django_user_model.objects.create_superuser("root", "", "x"))
    assert 'name="health"' not in client.get(change).content.decode()


@pytest.mark.parametrize(
    "name,data",
    [
        ("runner-token", None),
        ("runner-health", {"health": "maintenance"}),
        ("runner-revoke", None),
    ],
)
def test_an_outsider_can_change_nothing(client, outsider, cpu_runner, name, data):
    client.force_login(outsider)
    args = [] if name == "runner-token" else [cpu_runner.pk]
    assert client.post(reverse(name, args=args), data or {}).status_code == 403
    cpu_runner.refresh_from_db()
    assert cpu_runner.health == Runner.Health.ACTIVE and cpu_runner.revoked_at is None
    assert not RegistrationToken.objects.exists()


def test_an_outsider_sees_no_controls(client, outsider, cpu_runner):
    client.force_login(outsider)
    body = client.get(reverse("runners")).content.decode()
    assert "Register a runner" not in body and "Revoke" not in body


@pytest.mark.parametrize("name", ["runner-token", "runner-health", "runner-revoke"])
def test_changes_refuse_get(client, runner_admin, cpu_runner, name):
    client.force_login(runner_admin)
    args = [] if name == "runner-token" else [cpu_runner.pk]
    assert client.get(reverse(name, args=args)).status_code == 405


def test_the_list_refuses_post(client, runner_admin):
    client.force_login(runner_admin)
    assert client.post(reverse("runners")).status_code == 405
