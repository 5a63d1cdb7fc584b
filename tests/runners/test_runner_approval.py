"""A registered runner is pending until a runner admin has seen what it
claims (devices, toolchains, host, key fingerprint) and approved it: no
queue, no claim, no routing, no bundle before that. Approval and refusal
are audited; a refused runner is revoked (issue 20 item 5)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from matrix.accounts.roles import RUNNER_ADMIN
from matrix.fleet import services
from matrix.fleet.models import Runner
from matrix.models import AuditEvent, DeviceType, JobStage, JobState, Toolchain

from .conftest import cpu_inventory, cpu_toolchain

H200 = {"vendor": "NVIDIA", "model": "H200", "arch": "sm_90a", "backend": "cuda"}


def run(*args) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("runner", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def pending(register):
    return register(name="new-host", approved=False)


@pytest.fixture
def runner_admin(django_user_model):
    user = django_user_model.objects.create_user("ra", password="x")
    user.groups.add(Group.objects.get(name=RUNNER_ADMIN))
    return user


def test_a_registered_runner_is_pending_with_no_queue(pending):
    assert pending.runner.health == Runner.Health.PENDING
    reply = services.runner_queues(envelope=pending.request("queues"))
    assert reply == {"name": "new-host", "queues": [], "health": "pending"}
    assert not Runner.objects.routable().exists()


def test_a_pending_runner_claims_nothing(pending, cpu_cells, register):
    """Planned while an approved runner has the device: the pending one,
    hosting the same, cannot take the job."""
    approved = register(name="lab-a")
    sweep = services.sweep_plan(cells=cpu_cells()[:1])
    job = sweep.jobs.get()

    reply = services.jobs_claim(
        envelope=pending.request("claim", jobs=[{"job": job.pk, "attempt": 1}])
    )

    assert reply == {"claimed": [], "held": [], "health": "pending"}
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert services.jobs_claim(
        envelope=approved.request("claim", jobs=[{"job": job.pk, "attempt": 1}])
    )["claimed"] == [{"job": job.pk, "attempt": 1}]


def test_a_host_claiming_the_labs_gpu_and_toolchain_gets_nothing_unapproved(
    register, catalog
):
    """Issue 20: "evil" registered with an H200 and the lab's exact toolchain
    fingerprint and was given the lab's queue at once."""
    lab_inventory = cpu_inventory()
    lab_inventory["devices"].append(H200)
    lab = register(name="h200-lab", inventory=lab_inventory)
    evil = register(name="evil", inventory=lab_inventory, approved=False)
    h200 = DeviceType.objects.get(model="H200")
    toolchain = Toolchain.objects.get(name="tilelang-0.1.15-cpu")
    # It claims the lab's toolchain; nothing links it before an approval.
    assert [t.fingerprint for t in evil.runner.claimed_toolchains()] == [
        toolchain.fingerprint
    ]
    assert not evil.runner.toolchains.exists()

    sweep = services.sweep_plan(cells=[(s, h200, toolchain) for s in _shapes(1)])
    job = sweep.jobs.get()
    assert job.stage == JobStage.VALIDATE and job.queue in lab.runner.queues()

    assert services.runner_queues(envelope=evil.request("queues"))["queues"] == []
    claim = evil.request("claim", jobs=[{"job": job.pk, "attempt": 1}])
    assert services.jobs_claim(envelope=claim)["claimed"] == []


def _shapes(count):
    from matrix.models import Shape

    return list(Shape.objects.filter(source_profile="cpu-smoke").order_by("pk"))[:count]


def test_a_pending_runner_has_nothing_sent_again_on_the_queues_it_claims(
    register, cpu_cells
):
    lab = register(name="lab-a")
    evil = register(name="evil", approved=False)
    sweep = services.sweep_plan(cells=cpu_cells()[:2])
    assert {job.queue for job in sweep.jobs.all()} <= set(lab.runner.queues())

    reply = services.runner_reconnect(envelope=evil.request("recover", restarted=True))

    assert reply == {"requeued": 0, "lost": 0, "republished": 0}


def test_a_pending_runner_does_not_route_validation_to_its_device(register, catalog):
    inventory = cpu_inventory()
    inventory["devices"] = [H200]
    register(name="evil", inventory=inventory, approved=False)
    h200 = DeviceType.objects.get(model="H200")
    toolchain = cpu_toolchain()

    sweep = services.sweep_plan(cells=[(s, h200, toolchain) for s in _shapes(1)])

    assert sweep.jobs.get().stage == JobStage.LOWER


def test_a_pending_runner_is_planned_no_bundle(pending, cpu_cells):
    with pytest.raises(ValidationError, match="'new-host' is waiting for approval"):
        services.bundle_plan(runner_name="new-host", cells=cpu_cells())


def test_approval_gives_the_queues_and_audits_what_was_approved(pending, runner_admin):
    runner = services.runner_approve(name="new-host", by=runner_admin)

    assert runner.health == Runner.Health.ACTIVE
    reply = services.runner_queues(envelope=pending.request("queues"))
    assert reply["queues"] == runner.queues() and reply["health"] == "active"
    event = AuditEvent.objects.get(verb="runner.approve")
    assert (event.actor, event.object_id) == (runner_admin, str(runner.pk))
    assert event.after["approved"] == {
        "host": "cpu-box",
        "key_fingerprint": runner.key_fingerprint,
        "devices": ["x86-64 CPU · c"],
        "toolchains": [
            {
                "name": "tilelang-0.1.15-cpu",
                "fingerprint": Toolchain.objects.get().fingerprint,
            }
        ],
        "nvcc": False,
    }


def test_a_pending_runner_adds_no_column_or_toolchain_until_approved(
    register, catalog, client, runner_admin
):
    ascend = {"vendor": "Huawei", "model": "Ascend 910B", "arch": "", "backend": "npu"}
    inventory = cpu_inventory(name="tilelang-9.9-rocm")
    inventory["toolchains"][0]["components"] = {"tilelang": "9.9", "torch": "2.13.0"}
    inventory["devices"] = [ascend]
    columns = set(DeviceType.objects.values_list("pk", flat=True))
    toolchains = set(Toolchain.objects.values_list("pk", flat=True))
    register(name="claims-a-lot", inventory=inventory, approved=False, online=False)
    register(name="claims-it-too", inventory=inventory, approved=False, online=False)

    assert set(DeviceType.objects.values_list("pk", flat=True)) == columns
    assert set(Toolchain.objects.values_list("pk", flat=True)) == toolchains
    client.force_login(runner_admin)
    page = client.get(reverse("runners")).content.decode()
    assert "Huawei Ascend 910B · npu" in page  # the claim, for the admin
    assert "TileLang 9.9" in page
    matrix = client.get(reverse("matrix")).content.decode()
    assert "Ascend" not in matrix

    services.runner_refuse(name="claims-a-lot", by=runner_admin)
    assert not DeviceType.objects.filter(model="Ascend 910B").exists()
    services.runner_approve(name="claims-it-too", by=runner_admin)
    approved = Runner.objects.get(name="claims-it-too")
    assert [str(d) for d in approved.device_types.all()] == ["Huawei Ascend 910B · npu"]
    assert [t.name for t in approved.toolchains.all()] == ["tilelang-9.9-rocm"]


def test_the_page_warns_when_two_runners_time_one_hosts_cpu(
    register, client, runner_admin
):
    register(name="cpu-a", online=False)
    register(name="cpu-b", online=False, approved=False)
    client.force_login(runner_admin)
    page = client.get(reverse("runners")).content.decode()
    assert "shares the CPU of cpu-box with cpu-b" in page
    assert "shares the CPU of cpu-box with cpu-a" in page
    services.runner_refuse(name="cpu-b", by=runner_admin)
    assert "shares the CPU" not in client.get(reverse("runners")).content.decode()


def test_refusal_revokes_and_audits(pending, runner_admin):
    runner = services.runner_refuse(name="new-host", by=runner_admin)

    assert runner.revoked_at is not None and runner.is_refused
    event = AuditEvent.objects.get(verb="runner.refuse")
    assert event.actor == runner_admin
    assert event.after["refused"]["key_fingerprint"] == runner.key_fingerprint
    with pytest.raises(PermissionDenied, match="runner 'new-host' is refused"):
        services.runner_heartbeat(envelope=pending.heartbeat())


@pytest.mark.parametrize(
    ("first", "then", "message"),
    [
        (services.runner_approve, services.runner_approve, "not waiting for approval"),
        (services.runner_approve, services.runner_refuse, "not waiting for approval"),
        (services.runner_refuse, services.runner_approve, "is refused: it stays so"),
    ],
)
def test_a_decision_is_taken_once(pending, first, then, message):
    first(name="new-host")
    with pytest.raises(ValidationError, match=message):
        then(name="new-host")
    assert (
        AuditEvent.objects.filter(verb__in=["runner.approve", "runner.refuse"]).count()
        == 1
    )


def test_maintenance_does_not_approve_a_pending_runner(pending):
    with pytest.raises(ValidationError, match="waiting for approval"):
        services.runner_health_set(runner=pending.runner, health="active")
    pending.runner.refresh_from_db()
    assert pending.runner.health == Runner.Health.PENDING


# The Runners page


def test_the_page_shows_a_pending_runners_claims_with_approve_and_refuse(
    client, pending, runner_admin
):
    client.force_login(runner_admin)
    page = client.get(reverse("runners")).content.decode()
    assert "pending approval" in page and "no queue until approved" in page
    assert "host cpu-box" in page and pending.runner.key_fingerprint in page
    (claimed,) = pending.runner.claimed_toolchains()
    assert claimed.fingerprint[:12] in page
    assert not Toolchain.objects.exists()  # recorded once approved
    assert reverse("runner-approve", args=[pending.runner.pk]) in page
    assert reverse("runner-refuse", args=[pending.runner.pk]) in page


def test_a_viewer_sees_no_approve_button_and_cannot_post_one(client, pending, owner):
    client.force_login(owner)
    url = reverse("runner-approve", args=[pending.runner.pk])
    assert url not in client.get(reverse("runners")).content.decode()
    assert client.post(url).status_code == 403
    pending.runner.refresh_from_db()
    assert pending.runner.health == Runner.Health.PENDING


def test_approve_answers_the_row_in_place(client, pending, runner_admin):
    client.force_login(runner_admin)
    url = reverse("runner-approve", args=[pending.runner.pk])

    response = client.post(url, headers={"HX-Request": "true"})

    assert response.status_code == 200
    row = response.content.decode()
    assert row.lstrip().startswith(f'<tr id="runner-{pending.runner.pk}"')
    assert ">active<" in row and "Maintenance" in row and "Approve" not in row
    assert client.get(url).status_code == 405
    # A second click (another admin's, a stale page) is a sentence, not a 500.
    again = client.post(url, headers={"HX-Request": "true"})
    assert again.status_code == 400 and b"not waiting for approval" in again.content


def test_refuse_answers_the_row_refused(client, pending, runner_admin):
    client.force_login(runner_admin)
    response = client.post(
        reverse("runner-refuse", args=[pending.runner.pk]),
        headers={"HX-Request": "true"},
    )
    row = response.content.decode()
    assert response.status_code == 200 and ">refused<" in row and "Approve" not in row
    assert Runner.objects.get().is_refused


# The command line


def test_runner_approve_prints_what_it_approved(pending):
    out, _ = run("approve", "new-host")
    runner = Runner.objects.get()
    assert runner.health == Runner.Health.ACTIVE
    assert out.startswith("runner new-host approved: it has its queues\n")
    assert f"key          {runner.key_fingerprint}" in out
    assert "devices      x86-64 CPU · c" in out
    assert "host         cpu-box" in out


def test_runner_refuse_revokes(pending):
    out, _ = run("refuse", "new-host")
    assert "refused: its key is revoked" in out
    assert Runner.objects.get().is_refused


def test_runner_approve_of_an_unknown_runner_says_so(catalog):
    with pytest.raises(CommandError, match="no runner named 'nobody'"):
        run("approve", "nobody")


def test_work_waits_for_approval_then_starts_on_the_approved_queues(
    pending, host_dir_of, server_http, monkeypatch
):
    """`runner work` on a pending runner says so and asks again every
    heartbeat interval; once approved it starts its worker on its queues."""
    from runners import cli

    config = host_dir_of(pending)
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        if len(slept) == 2:
            services.runner_approve(name="new-host")

    monkeypatch.setattr(cli.time, "sleep", sleep)
    out = StringIO()
    queues = cli.HostCommands(out, StringIO())._approved(config)["queues"]

    assert queues == Runner.objects.get().queues()
    assert slept == [30.0, 30.0]
    text = out.getvalue()
    assert "runner new-host is waiting for approval" in text
    assert "asking again every 30 s" in text
    assert text.rstrip().endswith("runner new-host approved: starting its worker")


def test_work_stops_with_a_sentence_when_the_runner_is_refused(
    pending, host_dir_of, server_http, monkeypatch
):
    from runners import cli

    config = host_dir_of(pending)
    monkeypatch.setattr(
        cli.time, "sleep", lambda s: services.runner_refuse(name="new-host")
    )
    with pytest.raises(cli.Refused, match="was refused by a runner admin"):
        cli.HostCommands(StringIO(), StringIO())._approved(config)
