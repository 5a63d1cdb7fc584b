from __future__ import annotations

import json
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from matrix.models import Result
from runners import services, signing
from runners.models import Runner

from .conftest import cpu_inventory


def post(client, path, body):
    return client.post(
        f"/api/v1{path}",
        data=body if isinstance(body, str) else json.dumps(body),
        content_type="application/json",
    )


def registration(token, name="cpu-1", **changes):
    return {
        "token": token,
        "name": name,
        "public_key": signing.public_key_hex(Ed25519PrivateKey.generate()),
        "inventory": cpu_inventory(),
        **changes,
    }


@pytest.fixture
def token(catalog):
    return services.token_create(expires=timedelta(hours=1))


def test_register_returns_the_queues_and_the_server_key(client, token):
    response = post(client, "/runners/register", registration(token))
    assert response.status_code == 201
    body = response.json()
    runner = Runner.objects.get()
    assert body["id"] == runner.pk
    assert body["queues"] == runner.queues()
    assert body["server_public_key"] == signing.server_public_key()
    assert body["toolchains"][0]["interpreter"] == "/usr/bin/python3"


def test_register_with_a_used_token_is_403_with_the_reason(client, token):
    post(client, "/runners/register", registration(token))
    response = post(client, "/runners/register", registration(token, name="cpu-2"))
    assert response.status_code == 403
    assert response.json() == {"detail": "registration token already used"}


def test_register_with_a_taken_name_is_409(client, token, catalog):
    post(client, "/runners/register", registration(token))
    second = services.token_create(expires=timedelta(hours=1))
    response = post(client, "/runners/register", registration(second))
    assert response.status_code == 409
    assert "already registered" in response.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        "[]",
        {"token": "x"},
        {"token": 1, "name": [], "public_key": None, "inventory": "big"},
    ],
)
def test_register_never_answers_bad_input_with_a_5xx(client, token, body):
    response = post(client, "/runners/register", body)
    assert 400 <= response.status_code < 500
    assert not Runner.objects.exists()


def test_register_with_an_oversized_inventory_is_400(client, token):
    inventory = cpu_inventory()
    inventory["devices"] = inventory["devices"] * 65
    response = post(
        client, "/runners/register", registration(token, inventory=inventory)
    )
    assert response.status_code == 400
    assert "more than 64 devices" in response.json()["detail"]


def test_register_is_post_only(client):
    assert client.get("/api/v1/runners/register").status_code == 405


def test_heartbeat_over_http(client, register):
    hand = register(online=False)
    response = post(client, "/runners/heartbeat", hand.heartbeat())
    assert response.status_code == 200
    assert response.json()["state"] == "online"
    replay = post(
        client,
        "/runners/heartbeat",
        services.heartbeat_envelope(
            runner_name=hand.name, sequence=1, state="online", key=hand.key
        ),
    )
    assert replay.status_code == 409


@pytest.mark.parametrize("body", ["null", "{}", {"payload": 1}, "[1, 2]"])
def test_heartbeat_with_a_malformed_envelope_is_4xx(client, catalog, body):
    assert 400 <= post(client, "/runners/heartbeat", body).status_code < 500


def test_results_upload_stores_a_bundle_and_reports_refusals(
    client, cpu_runner, cpu_cells, register
):
    sweep = services.sweep_plan(cells=cpu_cells()[:2])
    jobs = list(sweep.jobs.order_by("pk"))
    for job in jobs:
        services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)
    intruder = register(name="cpu-2")
    bundle = {"results": [cpu_runner.result(jobs[0]), intruder.result(jobs[1])]}
    response = post(client, "/results", bundle)
    assert response.status_code == 200
    body = response.json()
    assert (body["stored"], body["duplicate"]) == (1, 0)
    assert body["refused"] == [
        {"index": 1, "reason": f"job {jobs[1].pk} is not assigned to runner 'cpu-2'"}
    ]
    again = post(client, "/results", bundle)
    assert again.status_code == 409
    assert again.json()["detail"].startswith("replayed envelope")


def test_results_upload_of_only_forged_results_is_403(client, cpu_runner, running_job):
    cpu_runner.key = Ed25519PrivateKey.generate()
    response = post(client, "/results", {"results": [cpu_runner.result(running_job)]})
    assert response.status_code == 403
    assert "bad signature" in response.json()["detail"]
    assert not Result.objects.exists()


@pytest.mark.parametrize(
    "body", ["{}", {"results": []}, {"results": "x"}, "[]", {"results": [None]}]
)
def test_results_upload_of_a_malformed_bundle_is_400(client, catalog, body):
    response = post(client, "/results", body)
    assert 400 <= response.status_code < 500
