"""The kernel submission form: why it is empty, and how it says no."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from matrix.accounts.roles import KERNEL_AUTHOR, VIEWER
from matrix.models import KernelRevision, Operator

pytestmark = pytest.mark.django_db


@pytest.fixture
def author(owner):
    for role in (KERNEL_AUTHOR, VIEWER):
        owner.groups.add(Group.objects.get(name=role))
    return owner


def test_with_no_operators_the_form_says_why_it_offers_none(client, author):
    client.force_login(author)
    body = client.get(reverse("submission-new")).content.decode()
    note = body.split('id="no-operators">')[1].split("</p>")[0]
    assert "No operators in the catalogue yet" in note


def test_a_refused_source_is_an_alert_and_the_source_takes_focus(client, author):
    Operator.objects.create(name="softmax", dims=["M", "N"])
    client.force_login(author)
    response = client.post(
        reverse("submission-new"),
        {"operator": "softmax", "source": "import os\n", "backends": ["cuda"]},
    )
    assert response.status_code == 400
    assert not KernelRevision.objects.exists()
    body = response.content.decode()
    assert 'id="no-operators"' not in body
    assert '<ul class="errorlist" id="source-errors" role="alert">' in body
    textarea = body.split("<textarea")[1].split(">")[0]
    assert 'name="source"' in textarea and "autofocus" in textarea


def test_a_wrong_password_is_an_alert_that_takes_focus(client, owner):
    response = client.post(
        reverse("login"), {"username": owner.username, "password": "not-it"}
    )
    body = response.content.decode()
    alert = body.split('id="login-error"')[1].split(">")[0]
    assert 'role="alert"' in alert and "autofocus" in alert
    # The first autofocus on the page is the alert's, ahead of the username's.
    assert (
        body.index('id="login-error"') < body.index("autofocus") < body.index("<form")
    )
