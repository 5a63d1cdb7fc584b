"""/metrics counts the cached reads' whole answers by how they were served,
for every web process (the counts live in the shared cache): the cache's
hit rate an operator watches under ingest."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from matrix.services import toolchain_register
from tests.ui.test_shared_cache import shared_cache  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def answers(scrape) -> dict:
    return {
        dict(labels)["outcome"]: value
        for (name, labels), value in scrape().items()
        if name == "tilematrix_read_answers_total"
    }


@pytest.fixture
def reader(client, django_user_model, catalog):
    toolchain_register(
        name="tl-0.1.15", components={"tilelang": "0.1.15"}, current=True
    )
    user = django_user_model.objects.create_user("reader", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return client


@pytest.mark.parametrize("cache", ["per process", "shared"])
def test_a_computed_answer_then_a_kept_one_move_their_counts(
    reader, scrape, cache, request
):
    if cache == "shared":
        request.getfixturevalue("shared_cache")
    before = answers(scrape)
    assert set(before) == {"hit", "earlier", "computed"}
    assert reader.get("/api/v1/matrix").status_code == 200
    first = answers(scrape)
    assert first["computed"] == before["computed"] + 1
    assert first["hit"] == before["hit"]
    assert reader.get("/api/v1/matrix").status_code == 200
    second = answers(scrape)
    assert second["hit"] == first["hit"] + 1
    assert second["computed"] == first["computed"]
