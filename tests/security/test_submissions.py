"""Kernel submissions through the page and the API: stored with their hash,
shown as a diff, never run before another reviewer approves them, and
refused by the runner when the text does not match the hash."""

from __future__ import annotations

import hashlib
import html

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.urls import reverse

from matrix.accounts.roles import REVIEWER, VIEWER
from matrix.fleet import services
from matrix.models import (
    CurrentRevision,
    KernelRevision,
    ValidationJob,
)
from matrix.submissions import kernel_review
from runners.host import jobs_run
from tests.security.conftest import APPROVE, GOOD, _with_role


def test_an_author_submits_through_the_page_and_sees_the_diff(
    client, author, add_operator
):
    client.force_login(author)
    response = client.post(
        reverse("submission-new"),
        {"operator": "elementwise_add", "source": GOOD, "backends": ["c"]},
    )
    revision = KernelRevision.objects.get(origin="submitted")
    assert revision.backends == ["c"]
    assert response.status_code == 302
    assert response["Location"] == reverse("submission", args=[revision.pk])
    assert revision.review_state == "pending" and not revision.is_current
    assert revision.source_sha256 == hashlib.sha256(GOOD.encode()).hexdigest()
    assert revision.author == author
    page = client.get(response["Location"]).content.decode()
    assert "+                C[i, j] = A[i, j] + B[i, j]" in page
    assert "--- current" in page  # against the library revision
    # ... its own module: the library modules it imports are not "removed".
    assert "-def element_size" not in html.unescape(page)
    assert "Approve" not in page  # the author cannot review


def test_the_page_shows_the_precheck_reasons(client, author, add_operator):
    client.force_login(author)
    source = (
        "import os\n\n\ndef program(shape, dtype, target):\n    return os.environ\n"
    )
    response = client.post(
        reverse("submission-new"), {"operator": "elementwise_add", "source": source}
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "import os: os reaches processes, files and the environment" in page
    assert ".environ: the environment is not the kernel&#x27;s" in page
    assert not KernelRevision.objects.filter(origin="submitted").exists()


def test_a_viewer_cannot_submit(client, outsider, add_operator):
    client.force_login(_with_role(outsider, VIEWER))
    response = client.post(
        reverse("submission-new"), {"operator": "elementwise_add", "source": GOOD}
    )
    assert response.status_code == 403
    assert not KernelRevision.objects.filter(origin="submitted").exists()


def test_it_refuses_self_approval_in_the_view_and_the_service(client, author, pending):
    _with_role(author, REVIEWER)  # even an author who also reviews
    client.force_login(author)
    response = client.post(reverse("submission-review", args=[pending.pk]), APPROVE)
    assert response.status_code == 403
    with pytest.raises(PermissionDenied):
        kernel_review(revision=pending, by=author, approve=True)
    pending.refresh_from_db()
    assert pending.review_state == "pending"


def test_a_pending_submission_runs_nowhere(author, pending, add_operator, cpu_cell):
    # Even marked current by hand, the planner plans no job for it.
    CurrentRevision.objects.filter(operator=add_operator).update(revision=pending)
    services.sweep_plan(cells=[cpu_cell], created_by=author)
    assert not ValidationJob.objects.filter(revision=pending).exists()


def test_another_reviewer_approves_and_its_jobs_carry_text_and_hash(
    client, second_reviewer, pending, cpu_cell
):
    client.force_login(second_reviewer)
    response = client.post(reverse("submission-review", args=[pending.pk]), APPROVE)
    assert response.status_code == 302
    pending.refresh_from_db()
    assert pending.review_state == "approved" and pending.is_current
    services.sweep_plan(cells=[cpu_cell])
    job = ValidationJob.objects.get(revision=pending)
    payload = services.job_payload(job)
    assert payload["library"] is False
    assert payload["source"] == GOOD
    assert payload["source_sha256"] == pending.source_sha256


def test_an_approved_submission_is_shown_against_the_revision_it_replaced(
    client, author, second_reviewer, pending
):
    replaced = pending.operator.current_revision("c")
    client.force_login(author)
    page = client.get(reverse("submission", args=[pending.pk])).content.decode()
    assert "You submitted this revision: another reviewer" in page
    assert f"current {replaced.source_sha256[:12]}" in page

    client.force_login(second_reviewer)
    response = client.post(
        reverse("submission-review", args=[pending.pk]), APPROVE, follow=True
    )
    page = response.content.decode()
    assert "Approved: new jobs on CPU (C) run it" in page
    assert "Diff against the revision it replaced" in page
    assert f"replaced {replaced.source_sha256[:12]}" in page
    assert "current " + replaced.source_sha256[:12] not in page


def test_a_second_review_is_refused(client, second_reviewer, pending):
    kernel_review(revision=pending, by=second_reviewer, approve=False)
    client.force_login(second_reviewer)
    client.post(reverse("submission-review", args=[pending.pk]), APPROVE)
    pending.refresh_from_db()
    assert pending.review_state == "rejected" and not pending.is_current


def test_the_runner_refuses_a_source_whose_hash_differs(tmp_path, pending):
    job = {
        "job": 1,
        "attempt": 1,
        "operator": "elementwise_add",
        "shape": {"M": 4, "N": 4},
        "dtype": "float32",
        "target": {"kind": "c"},
        "stage": "validate",
        "seed": 1,
        "library": False,
        "source": GOOD.replace("+ B[i, j]", "+ B[i, j] * 0"),
        "source_sha256": pending.source_sha256,
    }
    (result,) = jobs_run(
        jobs=[job], interpreter="/nonexistent/python", cache_dir=tmp_path, timeout_s=5
    )
    assert result["status"] == "infra_error"
    assert (
        "source_sha256 does not match the source; refusing to run it"
        in (result["error"]["message"])
    )


def test_the_api_stores_a_submission_and_enforces_csrf(author, add_operator):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(author)
    body = {"operator": "elementwise_add", "source": GOOD, "backends": ["c"]}
    refused = browser.post("/api/v1/kernels", body, content_type="application/json")
    assert refused.status_code == 403  # no CSRF token
    browser.get(reverse("submissions"))
    token = browser.cookies["csrftoken"].value
    created = browser.post(
        "/api/v1/kernels",
        body,
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert created.status_code == 201
    assert created.json()["review_state"] == "pending"
    assert created.json()["source_sha256"] == hashlib.sha256(GOOD.encode()).hexdigest()


def test_the_api_explains_a_refused_source(client, author, add_operator):
    client.force_login(author)
    response = client.post(
        "/api/v1/kernels",
        {
            "operator": "elementwise_add",
            "source": "import subprocess\n",
            "backends": ["c"],
        },
        content_type="application/json",
    )
    assert response.status_code == 400
    reasons = response.json()["reasons"]
    assert "line 1: import subprocess: subprocess starts other programs" in reasons
    assert any("program(shape, dtype, target)" in r for r in reasons)


def test_the_api_refuses_self_review(client, author, pending):
    _with_role(author, REVIEWER)
    client.force_login(author)
    response = client.post(
        f"/api/v1/kernels/{pending.pk}/review",
        {"decision": "approve"},
        content_type="application/json",
    )
    assert response.status_code == 403
    assert "own submission" in response.json()["detail"]


def test_a_review_is_audited_and_a_restart_keeps_the_reviewers_decision(
    client, second_reviewer, pending
):
    from matrix.models import AuditEvent
    from matrix.services import operator_sync_library

    library = pending.operator.current_revision("c")
    client.force_login(second_reviewer)
    client.post(reverse("submission-review", args=[pending.pk]), APPROVE)
    event = AuditEvent.objects.get(verb="submission.approve")
    assert event.actor == second_reviewer
    assert event.before["current"] == {"c": library.source_sha256}
    assert event.after["current"] == {"c": pending.source_sha256}
    assert event.after["comment"] == "reviewed"
    # What every `make run` does on start-up: the library is mirrored again,
    # and the reviewed submission stays current where it was approved.
    operator_sync_library()
    assert pending.operator.current_revision("c") == pending
    assert pending.operator.current_revision("cuda") == library
