from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_health_reports_database_and_broker_reachable(client):
    response = client.get("/api/v1/health")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "database": "ok", "broker": "ok"}


def test_the_openapi_schema_is_served(client):
    schema = client.get("/api/v1/openapi.json").json()
    assert schema["info"]["title"] == "TileMatrix API"
    assert "/api/v1/health" in schema["paths"]
