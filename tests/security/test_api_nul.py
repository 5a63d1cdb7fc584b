"""NUL characters in API input are bad input (400), never a server error,
on PostgreSQL (which cannot store them) as on SQLite."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_a_nul_in_a_query_parameter_is_refused_not_a_500(client, catalog):
    response = client.get("/api/v1/manifest", {"toolchain": "tl\x00x"})
    assert response.status_code in (400, 404)
    assert response.status_code < 500
