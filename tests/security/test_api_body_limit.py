"""A request body over DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) is the caller
sending too much at once: a 413 saying the limit in words, never a 500 or
an HTML page, so a client can split what it sends."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from matrix.accounts.roles import KERNEL_AUTHOR
from matrix.models import KernelRevision, Result

pytestmark = pytest.mark.django_db

OVER_THE_LIMIT = 3_250_000  # bytes: 3.1 MB


def padded(body: dict, field: str) -> str:
    """``body`` as JSON, ``field`` padded so the whole is OVER_THE_LIMIT."""
    text = json.dumps({**body, field: ""})
    return json.dumps({**body, field: "x" * (OVER_THE_LIMIT - len(text))})


def assert_refused_as_too_big(response) -> None:
    assert response.status_code == 413
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {
        "detail": "the body is 3.1 MB; the most this server takes is 2.5 MB: send "
        "less in one request (upload results in smaller batches)",
        "limit_bytes": settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
    }


def test_a_results_upload_over_the_limit_is_413_naming_the_limit(client, catalog):
    body = padded({"results": []}, "padding")
    assert len(body) == OVER_THE_LIMIT
    response = client.post("/api/v1/results", body, content_type="application/json")
    assert_refused_as_too_big(response)
    assert not Result.objects.exists()


def test_a_kernel_submission_over_the_limit_is_413_naming_the_limit(catalog, owner):
    owner.groups.add(Group.objects.get(name=KERNEL_AUTHOR))
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    browser.get(reverse("submissions"))
    response = browser.post(
        "/api/v1/kernels",
        padded({"operator": "elementwise_add"}, "source"),
        content_type="application/json",
        headers={"X-CSRFToken": browser.cookies["csrftoken"].value},
    )
    assert_refused_as_too_big(response)
    assert not KernelRevision.objects.filter(author=owner).exists()


def test_a_body_just_over_the_limit_never_reads_as_the_limit(client, catalog):
    size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1
    body = json.dumps({"results": [], "padding": ""})
    body = body[:-2] + "x" * (size - len(body)) + body[-2:]
    response = client.post("/api/v1/results", body, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["detail"].startswith("the body is 2.6 MB;")
