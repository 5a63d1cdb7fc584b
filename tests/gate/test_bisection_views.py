"""Bisect on an upgrade diff's row, the bisection page and its API: who may
start one, what the pages show while it runs and once it ends.

Results are written as ingest leaves them (tests/gate/conftest.py); the
real harness runs the releases in test_bisection_cpu.py."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from matrix.gate.services import proposal_open
from matrix.models import Bisection, Status, ValidationJob
from matrix.models.gate import DiffRow
from matrix.services import toolchain_register
from tests.gate.conftest import online_runner


@pytest.fixture
def middle(world):
    return toolchain_register(name="tilelang-0.1.14", components={"tilelang": "0.1.14"})


@pytest.fixture
def proposal(world, middle):
    """softmax passes on 0.1.13 and fails to compile on 0.1.15; gemm passes
    on both."""
    world.green(world.old)
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    world.record("gemm", world.cpu, world.new, Status.PASS)
    return proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )


def row_of(proposal, operator) -> DiffRow:
    return proposal.diff_rows.get(operator=operator, served=True)


def bisect(client, proposal, row):
    return client.post(
        reverse("upgrade-bisect", args=[proposal.pk]),
        {"row": row.pk},
        HTTP_HX_REQUEST="true",
    )


@pytest.fixture
def runner_admin(django_user_model):
    user = django_user_model.objects.create_user("lab", password="lab-pass-123")
    user.groups.add(Group.objects.get(name="runner admin"))
    return user


def test_a_red_row_offers_bisect_to_a_reviewer_only(client, world, proposal, outsider):
    page = reverse("upgrade", args=[proposal.pk])
    client.force_login(world.reviewers[0])
    body = client.get(page).content.decode()
    softmax = body.split('data-cell="softmax[M=64,N=256] float32 on x86-64 CPU · c"')[1]
    assert ">Bisect</button>" in softmax.split("</tr>")[0]
    gemm = body.split('data-cell="gemm[M=64,N=64,K=64] float32 on x86-64 CPU · c"')[1]
    assert ">Bisect</button>" not in gemm.split("</tr>")[0]  # still green

    client.force_login(outsider)
    assert ">Bisect</button>" not in client.get(page).content.decode()
    response = bisect(client, proposal, row_of(proposal, "softmax"))
    assert response.status_code == 403
    assert not Bisection.objects.exists()


def test_bisect_refuses_get_and_a_row_of_another_proposal(client, world, proposal):
    client.force_login(world.reviewers[0])
    url = reverse("upgrade-bisect", args=[proposal.pk])
    assert client.get(url).status_code == 405
    other = proposal_open(
        baseline=world.new,
        candidate=world.old,
        device_types=[world.cpu],
        by=world.owner,
    )
    response = client.post(url, {"row": row_of(other, "softmax").pk})
    assert response.status_code == 400
    assert b"has no diff row" in response.content
    assert client.post(url, {"row": "x"}).status_code == 400


def test_a_row_green_on_both_sides_is_refused_in_words(client, world, proposal):
    client.force_login(world.reviewers[0])
    response = bisect(client, proposal, row_of(proposal, "gemm"))
    assert response["HX-Redirect"].endswith(f"/upgrades/{proposal.pk}/#cells")
    page = client.get(response["HX-Redirect"]).content.decode()
    assert (
        "only a row that passes on one toolchain and fails on the other can be "
        "bisected; this one is pass on tilelang-0.1.13 and pass on tilelang-0.1.15"
    ) in page
    assert not Bisection.objects.exists()


def test_stored_results_answer_every_release_and_the_page_names_the_first_bad(
    client, world, proposal, middle, runner_admin
):
    # 0.1.14 was run before (a sweep): nothing is left to plan.
    world.record("softmax", world.cpu, middle, Status.PASS)
    jobs = ValidationJob.objects.count()
    client.force_login(runner_admin)
    response = bisect(client, proposal, row_of(proposal, "softmax"))
    bisection = Bisection.objects.get()
    assert response["HX-Redirect"] == reverse("bisection", args=[bisection.pk])
    assert ValidationJob.objects.count() == jobs
    assert bisection.state == Bisection.State.FOUND
    assert bisection.release == world.new

    page = client.get(response["HX-Redirect"]).content.decode()
    assert "First bad release: TileLang 0.1.15 (tilelang-0.1.15)." in page
    assert "0.1.15 <strong>← first bad release</strong>" in page
    assert "python -m runners.harness job.json --interpreter" in page
    # No runner hosts these: the repro says how to build them.
    assert "scripts/make-toolchain-venv 0.1.15 var/toolchains/tilelang-0.1.15" in page
    assert "hx-trigger" not in page  # ended: no polling

    # The diff row now links its bisection instead of offering another.
    body = client.get(reverse("upgrade", args=[proposal.pk])).content.decode()
    row = body.split('data-cell="softmax[M=64,N=256] float32 on x86-64 CPU · c"')[1]
    row = row.split("</tr>")[0]
    assert f"bisection {bisection.pk}: release named</a>" in row
    assert ">Bisect</button>" not in row


def test_a_running_bisection_polls_until_its_step_answers(
    client, world, proposal, middle
):
    online_runner("cpu-lab", device_types=[world.cpu], toolchains=[middle])
    client.force_login(world.reviewers[0])
    bisect(client, proposal, row_of(proposal, "softmax"))
    bisection = Bisection.objects.get()
    step = bisection.steps.get(job__isnull=False)
    assert step.toolchain == middle and step.job.state == ValidationJob.State.QUEUED

    url = reverse("bisection", args=[bisection.pk])
    page = client.get(url).content.decode()
    assert 'hx-trigger="every 2s"' in page
    assert f"job {step.job_id} (queued)" in page
    assert client.get(url, HTTP_HX_REQUEST="true").status_code == 200
    # Pressed again while running: the same bisection, no second job.
    bisect(client, proposal, row_of(proposal, "softmax"))
    assert Bisection.objects.count() == 1
    assert ValidationJob.objects.filter(toolchain=middle).count() == 1

    bisection.state = Bisection.State.STOPPED
    bisection.save()
    polled = client.get(url, HTTP_HX_REQUEST="true")
    assert polled.status_code == 286  # htmx stops polling


def test_the_api_reads_a_bisection_as_the_page_does(
    client, world, proposal, middle, outsider, settings
):
    settings.TILEMATRIX_ANONYMOUS_READ = False
    world.record("softmax", world.cpu, middle, Status.COMPILE_ERROR)
    client.force_login(world.reviewers[0])
    bisect(client, proposal, row_of(proposal, "softmax"))
    bisection = Bisection.objects.get()
    client.force_login(outsider)  # a viewer reads it
    answer = client.get(f"/api/v1/bisections/{bisection.pk}").json()
    assert answer["state"] == "found"
    assert answer["direction"] == "regression"
    assert answer["release"] == "tilelang-0.1.14"
    assert [s["version"] for s in answer["rungs"]] == ["0.1.13", "0.1.14", "0.1.15"]
    assert [(s["version"], s["verdict"], s["reused"]) for s in answer["steps"]] == [
        ("0.1.13", "good", True),
        ("0.1.14", "bad", True),
        ("0.1.15", "bad", True),
    ]
    assert answer["repro"]["job"]["operator"] == "softmax"
    assert client.get("/api/v1/bisections/999999").status_code == 404
    client.logout()
    assert client.get(f"/api/v1/bisections/{bisection.pk}").status_code == 401


def test_a_steps_sweep_links_its_bisection(client, world, proposal, middle):
    online_runner("cpu-lab", device_types=[world.cpu], toolchains=[middle])
    client.force_login(world.reviewers[0])
    bisect(client, proposal, row_of(proposal, "softmax"))
    bisection = Bisection.objects.get()
    sweep = bisection.steps.get(job__isnull=False).job.sweep
    body = client.get(reverse("sweep", args=[sweep.pk])).content.decode()
    link = reverse("bisection", args=[bisection.pk])
    assert f'a step of <a href="{link}">bisection #{bisection.pk}</a>' in body
