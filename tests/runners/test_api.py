from __future__ import annotations

import json
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from matrix.fleet import keys, services
from matrix.fleet.models import Receipt, Runner
from matrix.models import Result, Status
from runners import protocol, signing

from .conftest import cpu_inventory, resigned


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


def test_register_returns_a_pending_runner_with_no_queue_and_the_server_key(
    client, token
):
    response = post(client, "/runners/register", registration(token))
    assert response.status_code == 201
    body = response.json()
    runner = Runner.objects.get()
    assert body["id"] == runner.pk
    assert (body["health"], body["queues"]) == ("pending", [])
    assert body["key_fingerprint"] == runner.key_fingerprint
    assert body["server_public_key"] == keys.server_public_key()
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
        protocol.heartbeat_envelope(
            runner_name=hand.name, sequence=1, state="online", key=hand.key
        ),
    )
    assert replay.status_code == 409


@pytest.mark.parametrize("body", ["null", "{}", {"payload": 1}, "[1, 2]"])
def test_heartbeat_with_a_malformed_envelope_is_4xx(client, catalog, body):
    assert 400 <= post(client, "/runners/heartbeat", body).status_code < 500


@pytest.mark.parametrize("kind", ["heartbeat", "claim", "recover", "outbox", "queues"])
def test_every_signed_endpoint_refuses_a_body_that_is_no_envelope_alike(
    client, catalog, kind
):
    response = post(client, f"/runners/{kind}", "[1, 2]")
    assert (response.status_code, response.json()) == (
        400,
        {"detail": "expected a signed envelope (a JSON object)"},
    )


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
    assert again.status_code == 200
    assert again.json() == {
        "stored": 0,
        "duplicate": 1,
        "refused": [{"index": 1, "reason": body["refused"][0]["reason"]}],
    }


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


def test_an_upload_retried_after_a_lost_reply_is_already_stored(
    client, cpu_runner, cpu_cells
):
    jobs = list(services.sweep_plan(cells=cpu_cells()[:3]).jobs.order_by("pk"))
    for job in jobs:
        services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)
    bundle = {"results": [cpu_runner.result(job, status="pass") for job in jobs]}
    assert post(client, "/results", bundle).json()["stored"] == 3
    again = post(client, "/results", bundle)
    assert again.status_code == 200
    assert again.json() == {"stored": 0, "duplicate": 3, "refused": []}
    assert Result.objects.count() == 3


def test_an_envelope_reusing_a_spent_nonce_is_still_a_replay(
    client, cpu_runner, running_job
):
    sent = cpu_runner.result(running_job, status="compile_error")
    post(client, "/results", {"results": [sent]})
    replay = resigned(
        cpu_runner.result(running_job, status="pass"),
        cpu_runner.key,
        nonce=sent["nonce"],
    )
    response = post(client, "/results", {"results": [replay]})
    assert response.status_code == 409
    assert response.json()["detail"].startswith("replayed envelope")
    assert Result.objects.get().status == Status.COMPILE_ERROR


def signed_result(hand, **payload) -> dict:
    """A result envelope with these payload fields, signed with the
    runner's key."""
    return signing.envelope_sign(
        payload={"kind": "result", "runner": hand.name, **payload},
        signer=hand.name,
        key=hand.key,
    )


MAXIMA = {"job": 2**63 - 1, "attempt": 2**15 - 1}


@pytest.mark.parametrize(
    "job, attempt, field, shown",
    [
        (2**64, 1, "job", "18446744073709551616"),
        (2**63, 1, "job", "9223372036854775808"),
        (True, 1, "job", "true"),
        (0, 1, "job", "0"),
        ("7", 1, "job", '"7"'),
        (None, 1, "job", "null"),
        (1, 2**15, "attempt", "32768"),
        (1, True, "attempt", "true"),
        (1, 1.0, "attempt", "1.0"),
    ],
)
def test_a_result_naming_a_job_no_column_can_hold_is_refused_the_rest_stored(
    client, cpu_runner, running_job, job, attempt, field, shown
):
    bad = signed_result(cpu_runner, job=job, attempt=attempt, result={"status": "pass"})
    good = cpu_runner.result(running_job, status="pass")
    response = post(client, "/results", {"results": [good, bad]})
    assert response.status_code == 200
    reason = f"{field} must be a whole number from 1 to {MAXIMA[field]}, got {shown}"
    assert response.json() == {
        "stored": 1,
        "duplicate": 0,
        "refused": [{"index": 1, "reason": reason}],
    }
    assert Result.objects.get().job == running_job


def test_a_result_without_a_result_object_is_refused(client, cpu_runner, running_job):
    bad = signed_result(cpu_runner, job=running_job.pk, attempt=1, result="pass")
    response = post(client, "/results", {"results": [bad]})
    assert response.status_code == 400
    assert response.json()["detail"] == 'result must be an object, got "pass"'


@pytest.mark.parametrize(
    "sequence, shown",
    [(2**63, "9223372036854775808"), (True, "true"), ("5", '"5"'), (-1, "-1")],
)
def test_a_heartbeat_with_a_sequence_no_column_can_hold_is_400_naming_it(
    client, cpu_runner, sequence, shown
):
    before = Runner.objects.get().last_sequence
    response = post(
        client, "/runners/heartbeat", cpu_runner.heartbeat(sequence=sequence)
    )
    assert response.status_code == 400
    assert response.json() == {
        "detail": "sequence must be a whole number from 1 to 9223372036854775807, "
        f"got {shown}"
    }
    assert Runner.objects.get().last_sequence == before


def test_a_heartbeat_at_the_largest_sequence_is_recorded(client, cpu_runner):
    response = post(
        client, "/runners/heartbeat", cpu_runner.heartbeat(sequence=2**63 - 1)
    )
    assert response.status_code == 200
    assert Runner.objects.get().last_sequence == 2**63 - 1


def test_a_heartbeat_in_an_unknown_state_is_400_listing_the_states(client, register):
    hand = register(online=False)
    response = post(client, "/runners/heartbeat", hand.heartbeat(state="exploding"))
    assert response.status_code == 400
    assert response.json() == {
        "detail": 'state must be one of online, busy, got "exploding"'
    }
    assert Runner.objects.get().state == Runner.State.OFFLINE


def test_a_busy_heartbeat_marks_the_runner_busy(client, cpu_runner):
    response = post(client, "/runners/heartbeat", cpu_runner.heartbeat(state="busy"))
    assert response.json()["state"] == Runner.State.BUSY


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"nonce": "a" * 5000}, "nonce must be 32 lowercase hex characters"),
        ({"nonce": "a" * 64}, "nonce must be 32 lowercase hex characters"),
        ({"nonce": "A" * 32}, "nonce must be 32 lowercase hex characters"),
    ],
)
def test_a_result_with_a_nonce_the_runner_never_makes_is_refused_the_rest_stored(
    client, cpu_runner, cpu_cells, changes, reason
):
    jobs = list(services.sweep_plan(cells=cpu_cells()[:2]).jobs.order_by("pk"))
    for job in jobs:
        services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)
    odd = resigned(cpu_runner.result(jobs[1]), cpu_runner.key, **changes)
    response = post(client, "/results", {"results": [cpu_runner.result(jobs[0]), odd]})
    assert response.status_code == 200
    assert response.json()["refused"] == [
        {"index": 1, "reason": f"malformed envelope: {reason}"}
    ]
    assert list(Receipt.objects.values_list("result__job", flat=True)) == [jobs[0].pk]


def test_a_result_whose_signature_has_spaces_is_refused(
    client, cpu_runner, running_job
):
    envelope = cpu_runner.result(running_job)
    hex_text = envelope["signature"]
    envelope["signature"] = " ".join(hex_text[i : i + 2] for i in range(0, 128, 2))
    response = post(client, "/results", {"results": [envelope]})
    assert response.status_code == 400
    assert response.json()["detail"] == (
        "malformed envelope: signature must be 128 lowercase hex characters"
    )
    assert not Result.objects.exists()


@pytest.mark.parametrize("part", ["metrics", "timings", "fingerprint", "error"])
def test_a_result_whose_parts_are_not_objects_is_refused(
    client, cpu_runner, running_job, part
):
    envelope = cpu_runner.result(running_job, status="pass", **{part: "x"})
    response = post(client, "/results", {"results": [envelope]})
    assert response.status_code == 400
    assert (
        response.json()["detail"] == f'result.{part} must be an object or null, got "x"'
    )
    # Nothing of what it said is stored: its attempt ends with the server's
    # own infra_error, quoting the refusal.
    (ended,) = Result.objects.all()
    assert ended.status == "infra_error"
    assert ended.error_message.endswith(response.json()["detail"])
