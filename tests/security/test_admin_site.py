"""The admin site goes through the same rules (issue 20 item 7): an admin
made their own submission approved and current there, and no audit event
was written. State that is a decision is read-only in the admin; whatever
the admin site can still change is audited."""

from __future__ import annotations

import json

import pytest
from axes.models import AccessAttempt
from django.contrib import admin
from django.contrib.auth.models import Group
from django.urls import reverse

from matrix.accounts.roles import ADMIN, KERNEL_AUTHOR, AuditedAdmin
from matrix.fleet.models import RegistrationToken, Runner
from matrix.models import (
    Approval,
    AuditEvent,
    BackendException,
    Cell,
    KernelRevision,
    Operator,
    Policy,
    Result,
    Shape,
    Toolchain,
    UpgradeProposal,
    ValidationJob,
)
from matrix.submissions import kernel_submit
from tests.security.helpers import attack_source

# Records whose changes are decisions, checked and audited by a service:
# the admin shows them and changes none.
DECISIONS = [
    KernelRevision,
    Toolchain,
    Operator,
    ValidationJob,
    Result,
    Cell,
    AuditEvent,
    Policy,
    UpgradeProposal,
    Approval,
    BackendException,
    Runner,
    RegistrationToken,
]


@pytest.fixture
def site_admin(django_user_model):
    """An admin who is also a kernel author (the issue's attacker)."""
    user = django_user_model.objects.create_user("admin1", password="x")
    user.groups.add(
        Group.objects.get(name=ADMIN), Group.objects.get(name=KERNEL_AUTHOR)
    )
    return user


@pytest.fixture
def own_submission(catalog, site_admin):
    operator = Operator.objects.get(name="elementwise_add")
    return kernel_submit(
        operator=operator,
        source=attack_source("good_add").replace("good_add", "matrix_add"),
        author=site_admin,
        backends=["c"],
    )


def test_an_admin_cannot_approve_their_own_submission_in_the_admin(
    client, site_admin, own_submission
):
    client.force_login(site_admin)
    url = reverse("admin:matrix_kernelrevision_change", args=[own_submission.pk])
    page = client.get(url)
    assert page.status_code == 200
    assert 'name="review_state"' not in page.content.decode()

    response = client.post(
        url,
        {
            "operator": own_submission.operator_id,
            "source_sha256": own_submission.source_sha256,
            "origin": own_submission.origin,
            "review_state": KernelRevision.Review.APPROVED,
            "is_current": "on",
        },
    )

    assert response.status_code == 403
    own_submission.refresh_from_db()
    assert own_submission.review_state == KernelRevision.Review.PENDING
    assert not own_submission.is_current
    assert not AuditEvent.objects.filter(verb__startswith="admin.").exists()


@pytest.mark.parametrize("model", DECISIONS, ids=lambda m: m._meta.label)
def test_decisions_are_read_only_in_the_admin(rf, site_admin, model):
    request = rf.get("/admin/")
    request.user = site_admin
    model_admin = admin.site._registry[model]
    assert model_admin.has_view_permission(request)
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_delete_permission(request)


def test_a_runners_health_and_approval_cannot_be_changed_in_the_admin(
    client, site_admin, catalog
):
    runner = Runner.objects.create(name="new-host", public_key="ab" * 32)
    client.force_login(site_admin)
    response = client.post(
        reverse("admin:runners_runner_change", args=[runner.pk]),
        {"name": "new-host", "health": "active", "inventory": "{}"},
    )
    assert response.status_code == 403
    runner.refresh_from_db()
    assert runner.health == Runner.Health.PENDING


def test_every_admin_of_the_site_audits_what_it_changes():
    unaudited = [
        model._meta.label
        for model, model_admin in admin.site._registry.items()
        if not isinstance(model_admin, AuditedAdmin)
    ]
    assert unaudited == []


def test_a_change_made_in_the_admin_is_audited(client, site_admin, catalog):
    shape = Shape.objects.filter(served=False).select_related("operator").first()
    client.force_login(site_admin)
    url = reverse("admin:matrix_shape_change", args=[shape.pk])
    response = client.post(
        url,
        {
            "operator": shape.operator_id,
            "dims": json.dumps(shape.dims),
            "dtype": shape.dtype,
            "served": "on",
            "weight": "2.5",
            "source_profile": shape.source_profile,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    event = AuditEvent.objects.get(verb="admin.change")
    assert (event.actor, event.object_type, event.object_id) == (
        site_admin,
        "matrix.shape",
        str(shape.pk),
    )
    changed = event.after["change"][0]["changed"]["fields"]
    assert "Served" in changed and "Weight" in changed


def test_unlocking_a_login_in_the_admin_is_audited(client, site_admin):
    attempt = AccessAttempt.objects.create(
        username="admin2",
        ip_address="203.0.113.5",
        user_agent="x",
        failures_since_start=5,
    )
    client.force_login(site_admin)
    response = client.post(
        reverse("admin:axes_accessattempt_delete", args=[attempt.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    assert not AccessAttempt.objects.exists()
    event = AuditEvent.objects.get(verb="admin.delete")
    assert event.object_type == "axes.accessattempt" and event.actor == site_admin


def test_changing_a_roles_permissions_in_the_admin_is_audited(client, site_admin):
    reviewer = Group.objects.get(name="reviewer")
    kept = list(reviewer.permissions.values_list("pk", flat=True))[1:]
    client.force_login(site_admin)
    response = client.post(
        reverse("admin:auth_group_change", args=[reviewer.pk]),
        {"name": "reviewer", "permissions": kept},
    )
    assert response.status_code == 302
    assert sorted(reviewer.permissions.values_list("pk", flat=True)) == sorted(kept)
    event = AuditEvent.objects.get(verb="admin.change", object_type="auth.group")
    assert event.actor == site_admin
    assert event.after["change"] == [{"changed": {"fields": ["Permissions"]}}]
