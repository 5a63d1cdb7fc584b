"""The runner fixtures (a registered CPU runner, its signed messages, a
claimed job) and a scrape of /metrics read back as samples."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.runners.conftest import (  # noqa: F401
    cpu_cells,
    cpu_runner,
    register,
    running_job,
    server_key_file,
)

TOKEN = "scrape-secret"


@pytest.fixture
def scrape(client, settings):
    """GET /metrics with the bearer token; returns {(name, labels): value},
    labels as a sorted tuple of pairs."""
    settings.TILEMATRIX_METRICS_TOKEN = TOKEN

    def scrape() -> dict:
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200, response.content
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples
        }

    return scrape
