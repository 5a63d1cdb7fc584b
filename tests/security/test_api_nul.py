"""NUL characters in API input are bad input, never a server error, on
PostgreSQL (which cannot store them) as on SQLite: 422 in a query parameter
(refused before any route reads it, as the schema's refusal of input out of
range), 400 in a body."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_a_nul_in_a_query_parameter_is_refused_not_a_500(client, catalog):
    response = client.get("/api/v1/manifest", {"toolchain": "tl\x00x"})
    assert response.status_code == 422
    assert "control character (U+0000)" in response.json()["detail"]
