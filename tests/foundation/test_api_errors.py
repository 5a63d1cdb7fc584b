"""Every answer under /api/ is JSON with a ``detail``, the errors Django
gives before the API sees the request included: a client that parses
``{"detail": ...}`` never meets the site's HTML pages."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def assert_json_detail(response, status: int) -> str:
    assert response.status_code == status
    assert response["Content-Type"].startswith("application/json")
    return response.json()["detail"]


def test_a_path_no_endpoint_answers_is_a_json_404_pointing_at_the_schema(client):
    detail = assert_json_detail(client.get("/api/v1/matrixx"), 404)
    assert detail == (
        "no API endpoint answers GET /api/v1/matrixx; /api/v1/openapi.json lists them"
    )
    # An unknown API version too.
    assert_json_detail(client.get("/api/v2/matrix"), 404)


def test_a_wrong_method_is_a_json_405_that_keeps_the_allow_header(client):
    response = client.delete("/api/v1/health")
    detail = assert_json_detail(response, 405)
    assert response["Allow"] == "GET"
    assert detail == "DELETE /api/v1/health is not allowed; this path takes GET"


def test_an_endpoints_own_json_404_is_left_as_it_is(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("reader"))
    response = client.get("/api/v1/kernels/999999")
    assert response.status_code == 404
    assert response.json() == {"detail": "no such submission"}


def test_a_server_error_in_an_endpoint_is_a_json_500_without_a_traceback(monkeypatch):
    def broken():
        raise RuntimeError("secret internals /home/someone/db.py")

    monkeypatch.setattr("matrix.api.database_status", broken)
    response = Client(raise_request_exception=False).get("/api/v1/health")
    assert assert_json_detail(response, 500) == "server error"
    assert b"secret internals" not in response.content


def test_pages_outside_the_api_keep_the_html_404(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    assert b"Not found" in response.content


def test_input_of_the_wrong_type_is_a_422_whose_detail_names_each_field(client):
    response = client.get("/api/v1/matrix", {"limit": 0, "served": "maybe"})
    detail = assert_json_detail(response, 422)
    assert detail == (
        "served (query): Input should be a valid boolean, unable to interpret "
        "input; limit (query): Input should be greater than or equal to 1"
    )
    assert [e["loc"] for e in response.json()["errors"]] == [
        ["query", "served"],
        ["query", "limit"],
    ]
    body = client.post(
        "/api/v1/runners/register", {"token": 5}, content_type="application/json"
    )
    assert assert_json_detail(body, 422).startswith(
        "token (body): Input should be a valid string; name (body): Field required"
    )
