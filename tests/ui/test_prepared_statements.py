"""On PostgreSQL, the lookups every page view runs are prepared once per
connection, not planned again for every view."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def test_the_lookups_of_a_repeated_page_view_are_prepared(client, viewer, results):
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's (the PostgreSQL pass)")
    client.force_login(viewer)
    for _ in range(6):
        assert client.get("/").status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any('FROM "auth_user"' in sql for sql in prepared)
    assert any('MAX(id) FROM "matrix_result"' in sql for sql in prepared)
