"""/livez answers whatever is down; /readyz names what is missing."""

from __future__ import annotations

from unittest import mock

import pytest
from django.db import OperationalError, connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.executor import MigrationExecutor

from matrix.observability import probes

DEAD_REDIS = "redis://127.0.0.1:1/0"
DEAD_CACHE = {
    "default": {
        "BACKEND": "matrix.cache.TolerantRedisCache",
        "LOCATION": DEAD_REDIS,
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    }
}


@pytest.fixture
def dead_broker(settings):
    settings.CELERY_BROKER_URL = DEAD_REDIS
    settings.CELERY_BROKER_TRANSPORT = None
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}


def refused(self, *args, **kwargs):
    raise OperationalError("connection refused")


def dead_database():
    """Every connection refuses its cursor, as while the database is down
    (for the requests inside it only: the test's own teardown needs one)."""
    return mock.patch.object(BaseDatabaseWrapper, "cursor", refused)


def test_livez_answers_with_the_database_the_broker_and_the_cache_down(
    client, settings, dead_broker
):
    settings.CACHES = DEAD_CACHE
    with dead_database():
        response = client.get("/livez")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_the_probes_answer_an_orchestrator_by_address_over_plain_http(
    client, settings, db
):
    settings.DEBUG = False
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["tilematrix.example"]
    settings.TILEMATRIX_ANONYMOUS_READ = False
    for path in ("/livez", "/readyz"):
        assert client.get(path, HTTP_HOST="10.0.0.7:8000").status_code == 200


def test_readyz_is_ready_with_everything_up(client, db):
    body = client.get("/readyz").json()
    assert body["ready"] and body["missing"] == [] and body["degraded"] == []
    assert set(body["checks"]) == {"database", "migrations", "cache:default", "broker"}


def test_readyz_stays_ready_naming_a_dead_cache_and_broker(
    client, settings, db, dead_broker
):
    settings.CACHES = DEAD_CACHE
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 200 and body["ready"]
    assert body["degraded"] == ["cache:default", "broker"]
    assert body["checks"]["cache:default"].startswith("unreachable")
    assert body["checks"]["broker"].startswith("unreachable")


def test_readyz_refuses_without_the_database_and_says_so(client, db):
    with dead_database():
        response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503 and not body["ready"]
    assert body["missing"] == ["database", "migrations"]
    assert body["checks"]["database"] == "unreachable (OperationalError)"


@pytest.mark.django_db(transaction=True)
def test_readyz_refuses_while_a_migration_is_not_applied(client, monkeypatch):
    monkeypatch.setattr(probes, "_migrated", False)
    executor = MigrationExecutor(connection)
    executor.migrate([("observability", None)])
    try:
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["missing"] == ["migrations"]
        assert response.json()["checks"]["migrations"] == (
            "1 not applied (observability.0001_initial)"
        )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert client.get("/readyz").status_code == 200
