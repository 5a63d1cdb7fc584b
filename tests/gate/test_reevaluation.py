"""The gate off the hot path: ingest marks the proposals its results touch
and computes nothing; one background re-evaluation per burst updates the
stored diff, voiding decisions when what reviewers judge changes."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from matrix.gate import services
from matrix.gate.diff import matrix_diff
from matrix.gate.services import (
    proposal_approve,
    proposal_open,
    proposals_reevaluation_request,
    proposals_reevaluation_resend,
)
from matrix.gate.tasks import proposal_reevaluate_task
from matrix.models import AuditEvent, Status
from matrix.models.gate import Approval, DiffRow, ManifestEntry, UpgradeProposal
from tests.gate.conftest import online_runner


def ingest(world, toolchain, status=Status.PASS, shapes=("softmax", "gemm")):
    """What ingest leaves in its transaction: results, their cells, and the
    mark on the proposals they touch."""
    with transaction.atomic():
        results = [
            world.record(shape, world.cpu, toolchain, status) for shape in shapes
        ]
        return proposals_reevaluation_request(results=results)


@pytest.fixture
def collecting(world):
    """Baseline green; the candidate's jobs wait on a CPU runner online."""
    world.green(world.old)
    online_runner("cpu-host", device_types=[world.cpu], toolchains=[world.new])
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    proposal.sweeps.get().jobs.update(state="done")
    return proposal


def test_ingest_marks_the_proposals_it_touches_and_computes_nothing(world):
    world.green(world.old, [world.cpu, world.h200])
    cpu, h200 = (
        proposal_open(
            baseline=world.old, candidate=world.new, device_types=[dt], by=world.owner
        )
        for dt in (world.cpu, world.h200)
    )
    rows_before = list(DiffRow.objects.filter(proposal=cpu).values())

    assert ingest(world, world.new) == [cpu.pk]

    cpu.refresh_from_db()
    h200.refresh_from_db()
    assert cpu.reevaluation_pending and not h200.reevaluation_pending
    # The stored diff and the state wait for the background re-evaluation.
    assert list(DiffRow.objects.filter(proposal=cpu).values()) == rows_before
    assert cpu.summary["missing"] == 2


def test_a_burst_of_results_enqueues_one_reevaluation(
    world, collecting, django_capture_on_commit_callbacks, control_worker
):
    with django_capture_on_commit_callbacks() as enqueued:
        ingest(world, world.new, shapes=["softmax"])
        ingest(world, world.new, shapes=["gemm"])
        ingest(world, world.new, shapes=["gemm"])
    assert len(enqueued) == 1

    control_worker(enqueued[0])
    collecting.refresh_from_db()
    assert collecting.state == UpgradeProposal.State.READY
    assert not collecting.reevaluation_pending
    assert collecting.summary["still_green"] == 2


def test_the_reevaluation_task_is_idempotent(world, collecting):
    ingest(world, world.new)
    proposal_reevaluate_task(collecting.pk)
    collecting.refresh_from_db()
    assert collecting.state == UpgradeProposal.State.READY
    evaluated, events = collecting.evaluated_at, AuditEvent.objects.count()

    proposal_reevaluate_task(collecting.pk)
    collecting.refresh_from_db()
    assert (collecting.evaluated_at, AuditEvent.objects.count()) == (
        evaluated,
        events,
    )
    assert collecting.state == UpgradeProposal.State.READY


def test_the_task_voids_approvals_when_the_judged_diff_changes(world):
    world.green(world.old)
    world.green(world.new)
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="clean")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")
    assert ManifestEntry.objects.exists()

    # A rerun with the same outcome keeps them...
    ingest(world, world.new)
    proposal_reevaluate_task(proposal.pk)
    assert Approval.objects.filter(voided=False).count() == 2
    # ...one that fails on the candidate voids them.
    ingest(world, world.new, Status.COMPILE_ERROR, shapes=["softmax"])
    proposal_reevaluate_task(proposal.pk)
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.BLOCKED
    assert set(Approval.objects.values_list("voided_reason", flat=True)) == {
        "the diff changed after this decision"
    }
    assert not ManifestEntry.objects.exists()
    blocking = DiffRow.objects.filter(proposal=proposal).blocking()
    assert [(r.operator, r.blocking_rule) for r in blocking] == [
        ("softmax", "regression")
    ]


def test_results_stored_while_it_computes_get_a_run_of_their_own(
    world, collecting, monkeypatch, django_capture_on_commit_callbacks
):
    ingest(world, world.new, shapes=["softmax"])
    compute = services.proposal_diff

    def results_arrive_meanwhile(*, proposal):
        diff = compute(proposal=proposal)
        ingest(world, world.new, shapes=["gemm"])
        return diff

    monkeypatch.setattr(services, "proposal_diff", results_arrive_meanwhile)
    with django_capture_on_commit_callbacks() as enqueued:
        proposal_reevaluate_task(collecting.pk)
    monkeypatch.setattr(services, "proposal_diff", compute)
    collecting.refresh_from_db()
    # What it read is stored; the gemm result waits, still marked, for the
    # run it enqueued.
    assert collecting.summary["missing"] == 1
    assert collecting.reevaluation_pending
    assert len(enqueued) == 1
    proposal_reevaluate_task(collecting.pk)
    collecting.refresh_from_db()
    assert (collecting.summary["missing"], collecting.reevaluation_pending) == (
        0,
        False,
    )


def test_a_computation_begun_earlier_does_not_overwrite_a_later_one(world, collecting):
    digest = collecting.diff_digest
    later = timezone.now() + timedelta(minutes=1)
    UpgradeProposal.objects.filter(pk=collecting.pk).update(diff_computed_at=later)
    ingest(world, world.new)
    proposal_reevaluate_task(collecting.pk)
    collecting.refresh_from_db()
    assert collecting.diff_digest == digest
    assert not collecting.reevaluation_pending


def test_a_request_whose_message_was_lost_is_sent_again(
    world, collecting, control_worker
):
    ingest(world, world.new)
    an_hour_ago = timezone.now() - timedelta(hours=1)
    UpgradeProposal.objects.filter(pk=collecting.pk).update(
        reevaluation_requested_at=an_hour_ago
    )
    assert control_worker(proposals_reevaluation_resend, older_than_s=60) == [
        collecting.pk
    ]
    collecting.refresh_from_db()
    assert collecting.state == UpgradeProposal.State.READY
    assert proposals_reevaluation_resend(older_than_s=60) == []


def test_the_diff_reads_no_kernel_source_nor_revision_text(world):
    world.green(world.old, samples=[1.0, 1.1, 0.9])
    world.green(world.new)
    with CaptureQueriesContext(connection) as queries:
        diff = matrix_diff(
            baseline=world.old, candidate=world.new, device_types=[world.cpu]
        )
    assert {row.change for row in diff.rows} == {"still_green"}
    cells = next(q["sql"] for q in queries if 'FROM "matrix_cell"' in q["sql"])
    selected = cells.split(' FROM "matrix_cell"')[0]
    assert '"matrix_kernelrevision"."source"' not in selected
    # The result's details are read for one key, never whole.
    whole = re.sub(
        r"JSON_(?:EXTRACT|TYPE)\(\"matrix_result\"\.\"details\", '[^']*'\)"
        r"|\(\"matrix_result\"\.\"details\" -> '[^']*'\)",
        "",
        selected,
    )
    assert '"matrix_result"."details"' not in whole
