"""The two 500s of issue 20 are 4xx with a sentence: a registration whose
inventory names a TileLang version longer than the column that keeps it
(a DataError on PostgreSQL), and a multipart POST without its boundary,
before login, to a path that does or does not exist. Run as a deployment
runs: debug and anonymous reading off."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import Client

from matrix.fleet import services
from matrix.fleet.models import Runner
from matrix.models import Toolchain
from runners import signing
from tests.runners.conftest import cpu_inventory


@pytest.fixture
def deployed(settings):
    settings.DEBUG = False
    settings.TILEMATRIX_ANONYMOUS_READ = False


def register(client, **toolchain):
    body = {
        "token": services.token_create(expires=timedelta(hours=1)),
        "name": "odd-host",
        "public_key": signing.public_key_hex(Ed25519PrivateKey.generate()),
        "inventory": cpu_inventory(**toolchain),
    }
    return client.post(
        "/api/v1/runners/register", json.dumps(body), content_type="application/json"
    )


@pytest.mark.parametrize(
    ("components", "detail"),
    [
        (
            {"tilelang": "0.1.15+" + "x" * 40},
            "inventory.toolchains[0].components.tilelang must be a version of at "
            "most 40 characters, or null",
        ),
        (
            {"tilelang": "0.1.15", "torch": ["2.13"]},
            "inventory.toolchains[0].components.torch must be a version of at "
            "most 120 characters, or null",
        ),
    ],
)
def test_an_overlong_or_odd_component_version_is_a_400_naming_it(
    catalog, deployed, components, detail
):
    client = Client(raise_request_exception=False)

    response = register(client, components=components)

    assert response.status_code == 400
    assert response.json() == {"detail": detail}
    assert not Runner.objects.exists()
    assert not Toolchain.objects.filter(tilelang_version__startswith="0.1.15+").exists()


def test_a_host_name_that_is_no_host_name_is_a_400(catalog, deployed):
    client = Client(raise_request_exception=False)
    body = {
        "token": services.token_create(expires=timedelta(hours=1)),
        "name": "odd-host",
        "public_key": signing.public_key_hex(Ed25519PrivateKey.generate()),
        "inventory": {**cpu_inventory(), "host": {"hostname": {"a": 1}}},
    }
    response = client.post(
        "/api/v1/runners/register", json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 400
    assert "inventory.host.hostname must be a host name" in response.json()["detail"]


@pytest.mark.parametrize("path", ["/nope/", "/nope", "/login/", "/admin/login/"])
@pytest.mark.parametrize(
    "content_type", ["multipart/form-data", "multipart/form-data; boundary="]
)
def test_a_multipart_post_without_its_boundary_is_a_4xx_with_a_sentence(
    db, deployed, path, content_type
):
    client = Client(raise_request_exception=False)
    # A browser that has the login page's CSRF cookie, so the body is read.
    client.get("/login/")
    token = client.cookies["csrftoken"].value

    response = client.generic(
        "POST",
        path,
        b"--x\r\nContent-Disposition: form-data; name=a\r\n\r\nb\r\n--x--\r\n",
        content_type=content_type,
        HTTP_X_CSRFTOKEN=token,
    )

    assert 400 <= response.status_code < 500
    page = response.content.decode()
    assert "data-reason" in page or "detail" in page
    if response.status_code == 400:
        assert "could not read this request" in page


@pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v1/runners/register"])
def test_an_api_multipart_post_without_its_boundary_is_a_4xx_in_json(
    db, deployed, path
):
    client = Client(raise_request_exception=False)
    response = client.generic("POST", path, b"abc", content_type="multipart/form-data")
    assert 400 <= response.status_code < 500
    assert response.json()["detail"]
