from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import PermissionDenied

from matrix.fleet import services
from matrix.fleet.models import Runner
from matrix.models import AuditEvent
from runners import protocol


def test_a_heartbeat_brings_a_registered_runner_online(register):
    hand = register(online=False)
    runner = services.runner_heartbeat(envelope=hand.heartbeat())
    assert runner.state == Runner.State.ONLINE
    assert runner.last_heartbeat is not None
    assert AuditEvent.objects.filter(verb="runner.online").count() == 1


def test_a_runner_running_jobs_reads_busy_and_its_load_is_not_audited(register):
    hand = register(online=False)
    services.runner_heartbeat(envelope=hand.heartbeat(state="busy"))
    assert Runner.objects.get(name=hand.name).state == Runner.State.BUSY
    assert Runner.objects.online().filter(name=hand.name).exists()
    services.runner_heartbeat(envelope=hand.heartbeat(state="online"))
    services.runner_heartbeat(envelope=hand.heartbeat(state="busy"))
    assert Runner.objects.get(name=hand.name).state == Runner.State.BUSY
    # Coming online is an event; each step of its load is not.
    states = AuditEvent.objects.filter(verb__in=["runner.online", "runner.busy"])
    assert list(states.values_list("verb", flat=True)) == ["runner.busy"]


def test_a_replayed_heartbeat_is_refused(cpu_runner):
    envelope = cpu_runner.heartbeat()
    services.runner_heartbeat(envelope=envelope)
    with pytest.raises(services.Conflict, match="stale heartbeat"):
        services.runner_heartbeat(envelope=envelope)


def test_a_heartbeat_with_a_lower_sequence_is_refused(cpu_runner):
    services.runner_heartbeat(envelope=cpu_runner.heartbeat(sequence=100))
    with pytest.raises(services.Conflict, match="not above 100"):
        services.runner_heartbeat(envelope=cpu_runner.heartbeat(sequence=50))


def test_a_revoked_runner_is_refused(cpu_runner):
    services.runner_revoke(name=cpu_runner.name)
    with pytest.raises(PermissionDenied, match="revoked"):
        services.runner_heartbeat(envelope=cpu_runner.heartbeat())


def test_a_heartbeat_racing_a_revocation_is_refused(cpu_runner, monkeypatch):
    # The revocation commits after the heartbeat's signer was checked and
    # before its runner row is locked: seen in the real-process suite as a
    # revoked runner left "online".
    from matrix.fleet.services import liveness

    checked = liveness.payload_verify

    def revoked_meanwhile(*args, **kwargs):
        payload = checked(*args, **kwargs)
        services.runner_revoke(name=cpu_runner.name)
        return payload

    monkeypatch.setattr(liveness, "payload_verify", revoked_meanwhile)
    # Refused, so it cannot mark the revoked runner online again.
    with pytest.raises(PermissionDenied, match="revoked"):
        services.runner_heartbeat(envelope=cpu_runner.heartbeat())


def test_a_heartbeat_signed_with_another_key_is_refused(cpu_runner):
    cpu_runner.key = Ed25519PrivateKey.generate()
    with pytest.raises(PermissionDenied, match="bad signature"):
        services.runner_heartbeat(envelope=cpu_runner.heartbeat())


def test_a_heartbeat_from_an_unknown_runner_is_refused(cpu_runner):
    envelope = protocol.heartbeat_envelope(
        runner_name="ghost", sequence=1, state="online", key=cpu_runner.key
    )
    with pytest.raises(PermissionDenied, match="unknown runner 'ghost'"):
        services.runner_heartbeat(envelope=envelope)


def test_a_runner_is_busy_from_the_job_it_claims_not_from_its_next_heartbeat(
    cpu_runner, cpu_cells
):
    runner = Runner.objects.get(name=cpu_runner.name)
    assert runner.state == Runner.State.ONLINE
    sweep = services.sweep_plan(cells=cpu_cells()[:1])
    job = sweep.jobs.get()
    assert services.job_claim(job_id=job.pk, attempt=job.attempt, runner=runner)
    assert Runner.objects.get(pk=runner.pk).state == Runner.State.BUSY
    # Its next heartbeat, its work done, says online again.
    services.runner_heartbeat(envelope=cpu_runner.heartbeat(state="online"))
    assert Runner.objects.get(pk=runner.pk).state == Runner.State.ONLINE
