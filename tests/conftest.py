"""Shared fixtures: three personas (owner, reviewer, outsider; viewers all)
and a small catalogue. Real services are used when DATABASE_URL / CELERY_BROKER_URL name
them (CI runs the suite once embedded and once against PostgreSQL + Redis)."""

from __future__ import annotations

import pytest


def _viewer(user):
    """Every persona can read (the viewer role); rights beyond that are
    granted by the tests that need them."""
    from django.contrib.auth.models import Group

    user.groups.add(Group.objects.get(name="viewer"))
    return user


@pytest.fixture
def owner(django_user_model):
    return _viewer(
        django_user_model.objects.create_user("owner", password="owner-pass-123")
    )


@pytest.fixture
def reviewer(django_user_model):
    return _viewer(
        django_user_model.objects.create_user("reviewer", password="reviewer-pass-123")
    )


@pytest.fixture
def outsider(django_user_model):
    return _viewer(
        django_user_model.objects.create_user("outsider", password="outsider-pass-123")
    )


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser("root", password="root-pass-123")


@pytest.fixture
def catalog(db):
    """The demo catalogue, as `make run` seeds it."""
    from matrix.services import catalog_seed

    catalog_seed()
    return catalog
