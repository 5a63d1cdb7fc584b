"""Kernel revisions per backend: a submission approved for the CPU runs
there only, its approval asks for a comment and a confirmation after a
preview, a reviewer reverts it the same way, and every decision is audited
and survives a restart."""

from __future__ import annotations

import pytest
from django.urls import reverse

from matrix.fleet import services
from matrix.models import AuditEvent, Cell, DeviceType, Status
from matrix.services import operator_sync_library
from tests.security.conftest import APPROVE
from tests.ui.conftest import record


@pytest.fixture
def library(add_operator):
    return add_operator.current_revision("c")


def _cell(shape, device_type, toolchain, revision):
    return record(
        shape,
        device_type,
        toolchain,
        Status.PASS,
        revision=revision,
        kernel_ms=1.0,
        reference_ms=1.0,
    )


def test_an_approval_shows_what_it_changes_and_needs_a_comment_and_a_tick(
    client, second_reviewer, pending, cpu_cell, library
):
    shape, cpu, toolchain = cpu_cell
    _cell(shape, cpu, toolchain, library)
    client.force_login(second_reviewer)
    page = client.get(reverse("submission", args=[pending.pk])).content.decode()
    assert "Approving makes it current on CPU (C)" in page
    assert "1 cell run on the revision it replaces go stale" in page

    review = reverse("submission-review", args=[pending.pk])
    unticked = client.post(review, {"decision": "approve", "comment": "ok"})
    uncommented = client.post(review, {"decision": "approve", "confirm": "on"})
    assert unticked.status_code == uncommented.status_code == 400
    assert "tick the box: approving changes what runs" in unticked.content.decode()
    assert "write a comment" in uncommented.content.decode()
    pending.refresh_from_db()
    assert pending.review_state == "pending"
    assert pending.operator.current_revision("c") == library

    page = client.post(review, APPROVE, follow=True).content.decode()

    assert "1 cell went stale (1 served)" in page


@pytest.fixture
def approved_for_the_cpu(client, second_reviewer, pending, cpu_cell, library):
    """Library cells on the CPU and on an H200, then the submission
    approved for the CPU; (shape, cpu, gpu, toolchain)."""
    shape, cpu, toolchain = cpu_cell
    gpu = DeviceType.objects.filter(backend="cuda").first()
    _cell(shape, gpu, toolchain, library)
    _cell(shape, cpu, toolchain, library)
    client.force_login(second_reviewer)
    client.post(reverse("submission-review", args=[pending.pk]), APPROVE)
    return shape, cpu, gpu, toolchain


def test_an_approval_for_the_cpu_leaves_every_other_backend_on_the_library(
    approved_for_the_cpu, pending, library
):
    shape, cpu, gpu, toolchain = approved_for_the_cpu

    op = pending.operator
    assert op.current_revision("c") == pending
    assert {op.current_revision(b) for b in ("cuda", "hip", "metal", "npu")} == {
        library
    }
    # New jobs run the submission on the CPU only ...
    Cell.objects.all().delete()
    sweep = services.sweep_plan(
        cells=[(shape, cpu, toolchain), (shape, gpu, toolchain)]
    )
    assert dict(sweep.jobs.values_list("device_type__backend", "revision_id")) == {
        "c": pending.pk,
        "cuda": library.pk,
    }


def test_only_the_cpu_cell_reads_stale_after_a_cpu_approval(
    client, approved_for_the_cpu
):
    shape, cpu, gpu, toolchain = approved_for_the_cpu

    stale = client.get(
        "/api/v1/matrix",
        {"status": "stale", "operator": "elementwise_add", "toolchain": toolchain.name},
    ).json()
    assert [c["backend"] for c in stale["cells"]] == ["c"]
    assert stale["count"] == 1
    cpu_page = client.get(reverse("cell", args=[shape.pk, cpu.pk])).content.decode()
    gpu_page = client.get(reverse("cell", args=[shape.pk, gpu.pk])).content.decode()
    assert "stale" in cpu_page.lower()
    assert "older kernel revision" not in gpu_page
    # The library's revision is current on CUDA, not on the CPU.
    assert "library, current on CUDA)" in gpu_page
    assert "(library)" in cpu_page


def test_a_restart_keeps_the_decision_and_follows_the_library_elsewhere(
    second_reviewer, pending, library
):
    from matrix.submissions import kernel_review

    kernel_review(revision=pending, by=second_reviewer, approve=True, comment="ok")
    before = AuditEvent.objects.count()
    operator_sync_library()
    operator_sync_library()
    op = pending.operator
    assert op.current_revision("c") == pending
    assert op.current_revision("cuda") == library
    assert AuditEvent.objects.count() == before


def test_a_reviewer_reverts_after_a_preview_and_it_is_audited(
    client, second_reviewer, pending, cpu_cell, library
):
    client.force_login(second_reviewer)
    client.post(reverse("submission-review", args=[pending.pk]), APPROVE)
    shape, cpu, toolchain = cpu_cell
    _cell(shape, cpu, toolchain, pending)
    revert = reverse("operator-revert", args=["elementwise_add"])
    asked = {"revision": library.pk, "backends": ["c"], "comment": "slower on x86"}

    preview = client.post(revert, asked)
    page = preview.content.decode()
    assert preview.status_code == 200
    assert f"New jobs on CPU (C) run <code>{library.source_sha256[:12]}</code>" in page
    assert "1 cell on" in page and "go stale (1 served)" in page
    assert pending.operator.current_revision("c") == pending  # nothing yet

    done = client.post(revert, {**asked, "confirm": "on"}, follow=True)
    assert "Reverted: new jobs on CPU (C) run" in done.content.decode()
    assert pending.operator.current_revision("c") == library
    event = AuditEvent.objects.get(verb="revision.revert")
    assert event.actor == second_reviewer
    assert event.before["current"] == {"c": pending.source_sha256}
    assert event.after == {
        "current": {"c": library.source_sha256},
        "comment": "slower on x86",
    }
    # The revisions page says which revision runs where.
    page = client.get(reverse("operator-revisions", args=["elementwise_add"]))
    assert "current wherever it covers" in page.content.decode()


def test_a_revert_without_a_reason_or_by_an_author_is_refused(
    client, author, second_reviewer, pending, library
):
    client.force_login(second_reviewer)
    client.post(reverse("submission-review", args=[pending.pk]), APPROVE)
    api = f"/api/v1/kernels/{library.pk}/revert"
    body = {"backends": ["c"], "comment": "back"}
    no_reason = client.post(
        api, {"backends": ["c"], "comment": ""}, content_type="application/json"
    )
    nowhere = client.post(
        api, {"backends": ["tpu"], "comment": "x"}, content_type="application/json"
    )
    client.force_login(author)
    not_a_reviewer = client.post(api, body, content_type="application/json")
    assert no_reason.status_code == 422
    assert nowhere.status_code == 400
    assert "unknown backends tpu" in nowhere.json()["detail"]
    assert not_a_reviewer.status_code == 403
    assert pending.operator.current_revision("c") == pending

    client.force_login(second_reviewer)
    reverted = client.post(api, body, content_type="application/json")
    assert reverted.status_code == 200
    assert "c" in reverted.json()["current_on"]
    assert pending.operator.current_revision("c") == library
