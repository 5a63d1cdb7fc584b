"""The signed requests a runner worker makes over HTTP instead of touching the
database: claim, recover, outbox and queues; and the runner side that uses
them, run with database access blocked."""

from __future__ import annotations

import copy
import json
import logging
import os
from datetime import UTC, datetime, timedelta

import pytest
from celery.exceptions import Reject
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import override_settings

from matrix.fleet import ingest_queues, services
from matrix.fleet.models import Runner, SpentNonce
from matrix.models import JobState, Result, ValidationJob
from runners import client, host, protocol, signing
from runners import jobs as job_task
from runners.worker import RunnerHost, RunnerRefused


def post(http, kind, body):
    return http.post(
        f"/api/v1/runners/{kind}",
        data=body if isinstance(body, str) else json.dumps(body),
        content_type="application/json",
    )


def every_request(jobs):
    """(kind, fields) of one well-formed request to each runner endpoint."""
    return (
        ("claim", {"jobs": keys(*jobs)}),
        ("recover", {"restarted": True}),
        ("outbox", {"jobs": keys(*jobs)}),
        ("queues", {}),
    )


def keys(*jobs, attempt=None):
    return [{"job": j.pk, "attempt": attempt or j.attempt} for j in jobs]


@pytest.fixture
def queued(cpu_runner, cpu_cells):
    """Three queued jobs on the CPU runner's queues."""
    return list(services.sweep_plan(cells=cpu_cells()[:3]).jobs.order_by("pk"))


def test_claim_takes_queued_jobs_once(client, cpu_runner, queued):
    response = post(client, "claim", cpu_runner.request("claim", jobs=keys(*queued)))
    assert response.status_code == 200
    assert response.json() == {
        "claimed": keys(*queued),
        "held": [],
        "health": "active",
    }
    assert set(ValidationJob.objects.values_list("state", "runner")) == {
        (JobState.RUNNING, cpu_runner.runner.pk)
    }
    again = post(client, "claim", cpu_runner.request("claim", jobs=keys(*queued)))
    assert again.json() == {"claimed": [], "held": keys(*queued), "health": "active"}


def test_claim_skips_jobs_of_another_runner_superseded_attempts_and_other_queues(
    client, cpu_runner, register, queued
):
    other = register(name="cpu-2")
    assert services.job_claim(job_id=queued[0].pk, attempt=1, runner=other.runner)
    ValidationJob.objects.filter(pk=queued[2].pk).update(queue="runner.cpu-2")
    envelope = cpu_runner.request(
        "claim", jobs=keys(queued[0]) + keys(queued[1], attempt=2) + keys(queued[2])
    )
    response = post(client, "claim", envelope)
    assert response.json() == {"claimed": [], "held": [], "health": "active"}
    assert list(
        ValidationJob.objects.order_by("pk").values_list("state", "runner")
    ) == [
        (JobState.RUNNING, other.runner.pk),
        (JobState.QUEUED, None),
        (JobState.QUEUED, None),
    ]


def test_a_runner_in_maintenance_claims_nothing(client, cpu_runner, queued, admin_user):
    cpu_runner.runner.set_health(Runner.Health.MAINTENANCE, by=admin_user)
    response = post(client, "claim", cpu_runner.request("claim", jobs=keys(*queued)))
    # Told why, so that its worker gives the messages back and waits.
    assert response.json() == {"claimed": [], "held": [], "health": "maintenance"}
    assert not ValidationJob.objects.filter(state=JobState.RUNNING).exists()


def test_a_forged_request_is_403_and_changes_nothing(client, cpu_runner, queued):
    thief = copy.copy(cpu_runner)
    thief.key = Ed25519PrivateKey.generate()
    for kind, fields in every_request(queued):
        response = post(client, kind, thief.request(kind, **fields))
        assert response.status_code == 403, kind
        assert "bad signature" in response.json()["detail"]
    altered = cpu_runner.request("claim", jobs=keys(queued[0]))
    altered["payload"]["jobs"] = keys(*queued)
    assert post(client, "claim", altered).status_code == 403
    assert set(ValidationJob.objects.values_list("state", flat=True)) == {
        JobState.QUEUED
    }


def test_a_revoked_runner_is_403(client, cpu_runner, queued):
    services.runner_revoke(name=cpu_runner.name)
    for kind, fields in every_request(queued):
        response = post(client, kind, cpu_runner.request(kind, **fields))
        assert response.status_code == 403, kind
        assert response.json() == {"detail": f"runner {cpu_runner.name!r} is revoked"}
    assert not ValidationJob.objects.filter(state=JobState.RUNNING).exists()


def test_an_unknown_runner_is_403(client, catalog):
    key = Ed25519PrivateKey.generate()
    envelope = protocol.request_envelope(kind="queues", runner_name="ghost", key=key)
    response = post(client, "queues", envelope)
    assert response.status_code == 403
    assert response.json()["detail"] == "unknown runner 'ghost'"


def test_a_replayed_request_is_409_and_changes_nothing(client, cpu_runner, queued):
    envelope = cpu_runner.request("claim", jobs=keys(queued[0]))
    assert post(client, "claim", envelope).json()["claimed"] == keys(queued[0])
    services.runner_recover(runner=cpu_runner.runner)  # queued again, attempt 2
    replay = post(client, "claim", envelope)
    assert replay.status_code == 409
    assert replay.json()["detail"].startswith("replayed envelope")
    recover = cpu_runner.request("recover", restarted=True)
    assert post(client, "recover", recover).status_code == 200
    assert post(client, "recover", recover).status_code == 409
    job = ValidationJob.objects.get(pk=queued[0].pk)
    assert (job.state, job.attempt) == (JobState.QUEUED, 2)


def test_an_old_request_is_refused_and_old_nonces_are_pruned(
    client, cpu_runner, queued
):
    old = (datetime.now(UTC) - timedelta(minutes=10)).isoformat()
    body = {
        "payload": {"kind": "queues", "runner": cpu_runner.name},
        "signer": cpu_runner.name,
        "nonce": "e" * 32,
        "issued_at": old,
    }
    body["signature"] = cpu_runner.key.sign(signing.canonical(body)).hex()
    response = post(client, "queues", body)
    assert response.status_code == 403
    assert "expired envelope" in response.json()["detail"]
    SpentNonce.objects.create(
        nonce="x" * 32,
        runner=cpu_runner.runner,
        issued_at=datetime.now(UTC) - timedelta(hours=1),
    )
    assert post(client, "queues", cpu_runner.request("queues")).status_code == 200
    assert not SpentNonce.objects.filter(nonce="x" * 32).exists()


def test_a_request_stamped_without_a_time_zone_is_refused(client, cpu_runner):
    body = {
        "payload": {"kind": "queues", "runner": cpu_runner.name},
        "signer": cpu_runner.name,
        "nonce": "e" * 32,
        "issued_at": datetime.now(UTC).replace(tzinfo=None).isoformat(),
    }
    body["signature"] = cpu_runner.key.sign(signing.canonical(body)).hex()
    response = post(client, "queues", body)
    assert response.status_code == 403
    assert "no time zone" in response.json()["detail"]


@pytest.mark.parametrize("kind", ["claim", "recover", "outbox", "queues"])
@pytest.mark.parametrize(
    "body", ["{not json", "null", "[]", "{}", {"payload": 1}, {"signer": "cpu-1"}]
)
def test_a_malformed_body_is_400_with_a_reason(client, cpu_runner, kind, body):
    response = post(client, kind, body)
    assert response.status_code == 400, response.content
    assert response.json()["detail"]


@pytest.mark.parametrize(
    "kind, fields, reason",
    [
        ("claim", {}, "jobs must be a list"),
        ("claim", {"jobs": []}, "jobs must be a list"),
        ("claim", {"jobs": "1"}, "jobs must be a list"),
        ("claim", {"jobs": [1]}, "jobs[0] must be an object"),
        (
            "claim",
            {"jobs": [{"job": 1, "attempt": True}]},
            "jobs[0].attempt must be a whole number from 1 to 32767, got true",
        ),
        ("claim", {"jobs": [{"job": -1, "attempt": 1}]}, "jobs[0].job must be"),
        ("claim", {"jobs": [{"job": 2**70, "attempt": 1}]}, "jobs[0].job must be"),
        ("claim", {"jobs": [{"job": 1}]}, "jobs[0].attempt must be"),
        ("claim", {"jobs": [{"job": 1, "attempt": 1}] * 501}, "at most 500"),
        ("outbox", {"jobs": None}, "jobs must be a list"),
        ("outbox", {"jobs": [{"job": 1, "attempt": 2**15}]}, "jobs[0].attempt"),
        ("recover", {}, "restarted must be"),
        ("recover", {"restarted": "yes"}, "restarted must be"),
    ],
)
def test_a_signed_but_malformed_request_is_400_with_a_reason(
    client, cpu_runner, kind, fields, reason
):
    response = post(client, kind, cpu_runner.request(kind, **fields))
    assert response.status_code == 400
    assert reason in response.json()["detail"]


def test_a_request_of_another_kind_is_400(client, cpu_runner):
    response = post(client, "claim", cpu_runner.request("queues"))
    assert response.status_code == 400
    assert "expected a claim envelope" in response.json()["detail"]
    assert post(client, "queues", cpu_runner.heartbeat()).status_code == 400


def test_the_endpoints_are_post_only(client):
    for kind in ("claim", "recover", "outbox", "queues"):
        assert client.get(f"/api/v1/runners/{kind}").status_code == 405


def test_recover_after_a_restart_and_after_a_reconnect(client, cpu_runner, queued):
    services.job_claim(job_id=queued[0].pk, attempt=1, runner=cpu_runner.runner)
    restarted = post(client, "recover", cpu_runner.request("recover", restarted=True))
    assert restarted.json() == {"requeued": 1, "lost": 0, "republished": 2}
    job = ValidationJob.objects.get(pk=queued[0].pk)
    assert (job.state, job.attempt) == (JobState.QUEUED, 2)
    reconnected = post(
        client, "recover", cpu_runner.request("recover", restarted=False)
    )
    assert reconnected.json() == {"requeued": 0, "lost": 0, "republished": 3}
    assert ValidationJob.objects.get(pk=queued[0].pk).attempt == 2


def test_outbox_names_the_jobs_still_running_at_that_attempt(
    client, cpu_runner, register, queued
):
    other = register(name="cpu-2")
    services.job_claim(job_id=queued[0].pk, attempt=1, runner=cpu_runner.runner)
    services.job_claim(job_id=queued[1].pk, attempt=1, runner=other.runner)
    asked = keys(*queued) + keys(queued[0], attempt=2)
    response = post(client, "outbox", cpu_runner.request("outbox", jobs=asked))
    assert response.json() == {"running": keys(queued[0])}


def test_queues_are_the_servers_view(client, cpu_runner):
    response = post(client, "queues", cpu_runner.request("queues"))
    assert response.json() == {
        "name": cpu_runner.name,
        "queues": cpu_runner.runner.queues(),
        "health": "active",
        # No broker user of its own without TILEMATRIX_BROKER_ADMIN_URL: the
        # runner keeps the broker URL it was configured with.
        "broker": None,
        # One ingest queue: results travel on the control queue.
        "ingest": "control",
    }


def test_with_several_ingest_queues_a_runner_is_told_its_own(client, cpu_runner):
    with override_settings(TILEMATRIX_INGEST_QUEUES=4):
        said = post(client, "queues", cpu_runner.request("queues")).json()
        again = post(client, "queues", cpu_runner.request("queues")).json()
        expected = ingest_queues.of_runner(cpu_runner.name)

    assert said["ingest"] == again["ingest"] == expected
    assert said["ingest"] in {"ingest.0", "ingest.1", "ingest.2", "ingest.3"}


# The runner side ----------------------------------------------------------


def planned(cpu_cells, count=1):
    sweep = services.sweep_plan(cells=cpu_cells()[:count])
    jobs = list(
        sweep.jobs.select_related(
            "revision__operator", "shape", "device_type", "toolchain"
        ).order_by("pk")
    )
    return jobs, services.jobs_envelope(jobs)


def test_the_runner_side_of_a_job_touches_no_database(
    host_dir, cpu_cells, server_http, django_db_blocker, monkeypatch
):
    """Claiming, running and signing with database access blocked: only the
    server's views (reached over 'HTTP') and the control side's ingest may
    use it."""
    jobs, envelope = planned(cpu_cells, 2)
    answer = client.post_json

    def over_http(url, body, timeout=60):
        with django_db_blocker.unblock():
            return answer(url, body, timeout)

    monkeypatch.setattr(client, "post_json", over_http)
    sent = []
    monkeypatch.setattr(host, "results_send", sent.extend)
    with django_db_blocker.block():
        with pytest.raises(RuntimeError, match="Database access not allowed"):
            ValidationJob.objects.count()  # the block is in force
        outcome = host.jobs_execute(envelope=envelope, config=host_dir, timeout_s=60)
        assert host.outbox_flush(config=host_dir) == 2
    assert outcome.startswith("ran 2 of 2 jobs")
    assert [u.rsplit("/", 1)[1] for u, _ in server_http] == ["claim", "outbox"]
    outcomes = services.results_ingest(envelopes=sent[:2])
    assert [o.status for o in outcomes] == ["stored", "stored"]
    with django_db_blocker.block():
        assert host.outbox_flush(config=host_dir) == 0
    assert not list(host.outbox_dir(host_dir).iterdir())


def test_results_not_stored_in_time_are_sent_again_and_no_sooner(
    host_dir, cpu_cells, server_http, monkeypatch
):
    """What each heartbeat does: the results kept for ``settled_s`` whose
    jobs the server still awaits (their message lost with a control worker
    killed mid-ingest) are sent again, once per ``settled_s``."""
    jobs, envelope = planned(cpu_cells, 2)
    sent = []
    monkeypatch.setattr(host, "results_send", sent.extend)  # and lost
    host.jobs_execute(envelope=envelope, config=host_dir, timeout_s=60)
    first = list(sent)
    assert len(first) == 2

    def age(seconds):
        for path in host.outbox_dir(host_dir).glob("*.json"):
            then = path.stat().st_mtime - seconds
            os.utime(path, (then, then))

    asked = len(server_http)
    assert host.outbox_flush(config=host_dir, settled_s=60) == 0
    assert len(server_http) == asked  # results still on their way: not asked
    age(61)
    assert host.outbox_flush(config=host_dir, settled_s=60) == 2

    def by_job(envelopes):
        return sorted(envelopes, key=lambda e: e["payload"]["job"])

    assert by_job(sent[2:]) == by_job(first)  # the very envelopes kept
    assert host.outbox_flush(config=host_dir, settled_s=60) == 0
    outcomes = services.results_ingest(envelopes=sent[2:])
    assert [o.status for o in outcomes] == ["stored", "stored"]
    age(61)
    assert host.outbox_flush(config=host_dir, settled_s=60) == 0
    assert list(host.outbox_dir(host_dir).iterdir()) == []


def test_a_claim_the_server_cannot_answer_is_retried(
    host_dir, cpu_cells, eager_celery, monkeypatch, caplog
):
    jobs, envelope = planned(cpu_cells)
    answer, calls = client.post_json, []

    def unreachable_once(url, body, timeout=60):
        calls.append(url)
        if len(calls) == 1:
            raise client.ServerUnavailable(f"cannot reach {url}: refused")
        return answer(url, body, timeout)

    monkeypatch.setattr(client, "post_json", unreachable_once)
    with caplog.at_level(logging.WARNING, logger="runners.jobs"):
        job_task.execute_job.apply(args=[envelope])
    assert "message to be retried" in caplog.text
    job = ValidationJob.objects.get()
    assert job.state == JobState.DONE
    assert Result.objects.filter(job=job).count() == 1


def test_a_claim_whose_answer_was_lost_runs_the_job_on_the_retry(
    host_dir, cpu_cells, eager_celery, monkeypatch
):
    """The server claimed the job but the runner never heard: the retried
    message finds the job held by this runner and runs it."""
    jobs, envelope = planned(cpu_cells)
    answer, calls = client.post_json, []

    def answer_lost_once(url, body, timeout=60):
        calls.append(url)
        reply = answer(url, body, timeout)
        if len(calls) == 1:
            raise client.ServerUnavailable(f"cannot reach {url}: timed out")
        return reply

    monkeypatch.setattr(client, "post_json", answer_lost_once)
    job_task.execute_job.apply(args=[envelope])
    job = ValidationJob.objects.get()
    assert job.state == JobState.DONE
    assert Result.objects.filter(job=job).count() == 1


def test_a_claim_refused_to_a_revoked_runner_sends_the_message_back(
    host_dir, cpu_cells, eager_celery, caplog
):
    """The job is not the revoked runner's to drop: its message goes back to
    the queue (the worker, when there is one, stops: see test_worker_e2e)."""
    jobs, envelope = planned(cpu_cells)
    services.runner_revoke(name=host_dir.name)
    with caplog.at_level(logging.WARNING, logger="runners.jobs"):
        with pytest.raises(Reject) as rejected:
            job_task.execute_job(envelope)
    assert rejected.value.requeue is True
    assert (
        f"runner {host_dir.name} is refused (runner '{host_dir.name}' is revoked)"
        in (caplog.text)
    )
    assert ValidationJob.objects.get().state == JobState.QUEUED


def test_a_claim_in_maintenance_sends_the_message_back(
    host_dir, cpu_cells, eager_celery, caplog, admin_user
):
    """Dropped, the message would leave its job queued with nothing to run
    it until maintenance ends; given back, another runner on the queue runs
    it (and this worker stops reading its queues: see test_worker_e2e)."""
    jobs, envelope = planned(cpu_cells)
    runner = Runner.objects.get(name=host_dir.name)
    services.runner_health_set(
        runner=runner, health=Runner.Health.MAINTENANCE, by=admin_user
    )
    with caplog.at_level(logging.WARNING, logger="runners.jobs"):
        with pytest.raises(Reject) as rejected:
            job_task.execute_job(envelope)
    assert rejected.value.requeue is True
    assert f"runner {host_dir.name} is in maintenance" in caplog.text
    assert "dropped" not in caplog.text
    assert ValidationJob.objects.get().state == JobState.QUEUED


def test_the_worker_recovers_through_the_server(host_dir, running_job, server_http):
    step = object.__new__(RunnerHost)
    counts = step.recover(host_dir, restarted=True)
    assert counts == {"requeued": 1, "lost": 0, "republished": 0}
    running_job.refresh_from_db()
    assert (running_job.state, running_job.attempt) == (JobState.QUEUED, 2)
    counts = step.recover(host_dir, restarted=False)
    assert counts == {
        "requeued": 0,
        "lost": 0,
        "republished": 1,
        "results resent": 0,
    }


def test_a_revoked_runner_is_refused_at_once_instead_of_recovering_for_ever(
    host_dir, running_job, server_http
):
    services.runner_revoke(name=host_dir.name)
    step = object.__new__(RunnerHost)
    with pytest.raises(RunnerRefused, match=f"runner '{host_dir.name}' is revoked"):
        step.recover(host_dir, restarted=False)
