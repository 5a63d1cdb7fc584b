"""The role check every page makes, read with the signed-in user
(matrix.accounts.auth.RoleModelBackend): what it reads must be what holds now."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture
def reader(client, django_user_model, settings):
    settings.TILEMATRIX_ANONYMOUS_READ = False  # as deployed
    user = django_user_model.objects.create_user("a-reader", password="x-pass-123")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return user


def test_a_role_taken_away_is_refused_on_the_next_request(client, reader):
    assert client.get(reverse("matrix")).status_code == 200
    reader.groups.clear()
    assert client.get(reverse("matrix")).status_code == 403


def test_a_group_that_is_no_role_grants_nothing(client, reader):
    reader.groups.clear()
    reader.groups.add(Group.objects.create(name="book club"))
    assert client.get(reverse("matrix")).status_code == 403


def test_a_permission_granted_directly_is_a_role_of_one(client, reader):
    reader.groups.clear()
    reader.user_permissions.add(Permission.objects.get(codename="view_cell"))
    assert client.get(reverse("matrix")).status_code == 200


def test_a_deactivated_account_is_signed_out(client, reader):
    reader.is_active = False
    reader.save()
    response = client.get(reverse("matrix"))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_the_user_is_read_as_the_orm_reads_it(client, reader):
    from django.utils import timezone

    from matrix.accounts.auth import RoleModelBackend

    reader.last_login = timezone.now()
    reader.save()
    user = RoleModelBackend().get_user(str(reader.pk))
    assert user == reader and user._tilematrix_granted is True
    assert user.is_active is True and user.is_superuser is False
    assert user.last_login == reader.last_login and timezone.is_aware(user.last_login)


def test_a_session_naming_no_user_signs_nobody_in(db):
    from matrix.accounts.auth import RoleModelBackend

    backend = RoleModelBackend()
    assert backend.get_user("not-a-number") is None
    assert backend.get_user(2**40) is None
