"""Approvals: never by the proposer, voided when the diff moves, audited."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction

from matrix.gate.services import (
    exception_grant,
    proposal_approve,
    proposal_open,
    proposal_reevaluate,
    proposal_reject,
    proposal_rollout,
)
from matrix.models import AuditEvent, Status, Toolchain
from matrix.models.gate import (
    Approval,
    BackendException,
    ManifestEntry,
    UpgradeProposal,
)
from tests.gate.conftest import online_runner


@pytest.fixture
def proposal(world):
    world.green(world.old)
    world.green(world.new)
    return proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )


def test_it_refuses_self_approval_in_the_service(world, proposal):
    with pytest.raises(PermissionDenied, match="proposer cannot decide"):
        proposal_approve(proposal=proposal, by=world.owner, comment="looks great")
    assert not Approval.objects.exists()


def test_it_refuses_self_approval_in_the_orm(world, proposal):
    with pytest.raises(IntegrityError), transaction.atomic():
        Approval.objects.create(
            proposal=proposal,
            reviewer=world.owner,
            proposer=world.owner,
            decision="approve",
            comment="mine",
            diff_digest=proposal.diff_digest,
        )


def test_it_refuses_self_approval_in_a_raw_database_write(world, proposal):
    insert = (
        "INSERT INTO matrix_approval (proposal_id, reviewer_id, proposer_id, decision,"
        " comment, diff_digest, voided, voided_reason, created_at)"
        " VALUES (%s, %s, %s, 'approve', 'raw', %s, %s, '', CURRENT_TIMESTAMP)"
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                insert,
                [
                    proposal.pk,
                    world.owner.pk,
                    world.owner.pk,
                    proposal.diff_digest,
                    False,
                ],
            )
    # Writing someone else as the proposer does not get around the check.
    with pytest.raises(IntegrityError, match="approval_proposer_matches"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                insert,
                [
                    proposal.pk,
                    world.owner.pk,
                    world.reviewers[0].pk,
                    proposal.diff_digest,
                    False,
                ],
            )
    assert not Approval.objects.exists()


def test_two_reviewers_approve_and_the_manifest_appears(world, proposal):
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="clean diff")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.APPROVED
    choices = set(ManifestEntry.objects.values_list("operator", "choice"))
    assert choices == {("softmax", "tilelang"), ("gemm", "tilelang")}


def test_approvals_are_voided_when_the_diff_changes(world, proposal):
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="clean diff")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")
    proposal.refresh_from_db()
    approved_digest = proposal.diff_digest
    assert proposal.state == UpgradeProposal.State.APPROVED

    # A rerun of softmax on the candidate now fails to compile.
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    proposal = proposal_reevaluate(proposal=proposal)

    assert proposal.diff_digest != approved_digest
    assert proposal.state == UpgradeProposal.State.BLOCKED
    assert Approval.objects.filter(voided=False).count() == 0
    assert set(Approval.objects.values_list("voided_reason", flat=True)) == {
        "the diff changed after this decision"
    }
    assert not ManifestEntry.objects.exists()
    assert proposal.blocking_reasons[0] == (
        "served cell softmax[M=64,N=256] float32 on x86-64 CPU · c went from pass "
        "to compile_error"
    )
    voids = AuditEvent.objects.filter(verb="approval.void")
    assert voids.count() == 2
    assert all(e.before["voided"] is False and e.after["voided"] for e in voids)


def test_a_rerun_with_the_same_outcome_keeps_the_approvals(world, proposal):
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="clean diff")
    world.record("softmax", world.cpu, world.new, Status.PASS, kernel_ms=1.0)
    proposal = proposal_reevaluate(proposal=proposal)
    assert Approval.objects.filter(voided=False).count() == 1


def test_a_blocked_proposal_cannot_be_approved(world):
    world.green(world.old)
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    world.record("gemm", world.cpu, world.new, Status.PASS)
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    assert proposal.state == UpgradeProposal.State.BLOCKED
    with pytest.raises(ValidationError, match="cannot approve while blocked"):
        proposal_approve(proposal=proposal, by=world.reviewers[0], comment="ship it")


def test_a_rejection_stands_until_the_diff_changes(world, proposal):
    proposal_reject(proposal=proposal, by=world.reviewers[0], comment="wait for 0.1.16")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.REJECTED
    assert proposal.blocking_reasons[0] == "rejected by reviewer: wait for 0.1.16"
    with pytest.raises(ValidationError, match="needs a comment"):
        proposal_reject(proposal=proposal, by=world.reviewers[1], comment="  ")


def test_a_non_reviewer_cannot_decide(world, proposal, outsider):
    with pytest.raises(PermissionDenied, match="reviewer group"):
        proposal_approve(proposal=proposal, by=outsider, comment="me too")


def test_opening_needs_the_propose_permission(world, outsider):
    with pytest.raises(PermissionDenied, match="propose permission"):
        proposal_open(
            baseline=world.old,
            candidate=world.new,
            device_types=[world.cpu],
            by=outsider,
        )


def test_opening_schedules_the_missing_served_cells(world):
    world.green(world.old)
    online_runner("cpu-host", device_types=[world.cpu], toolchains=[world.new])
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu, world.h200],
        by=world.owner,
    )
    jobs = set(
        proposal.sweeps.get().jobs.values_list(
            "shape__operator__name", "device_type__backend", "toolchain__name"
        )
    )
    # 2 served shapes: both missing on the candidate (c and cuda), and on the
    # baseline only for cuda, where it has no result yet.
    assert jobs == {
        ("softmax", "c", "tilelang-0.1.15"),
        ("gemm", "c", "tilelang-0.1.15"),
        ("softmax", "cuda", "tilelang-0.1.15"),
        ("gemm", "cuda", "tilelang-0.1.15"),
        ("softmax", "cuda", "tilelang-0.1.13"),
        ("gemm", "cuda", "tilelang-0.1.13"),
    }
    # The CPU runner takes the candidate's c cells: their results can come.
    assert proposal.state == UpgradeProposal.State.COLLECTING


def test_rollout_makes_the_candidate_current_and_every_step_is_audited(world, proposal):
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="clean diff")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")
    proposal_rollout(proposal=proposal, by=world.reviewers[2])
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.ROLLED_OUT
    assert list(Toolchain.objects.filter(is_current=True)) == [world.new]
    events = AuditEvent.objects.filter(
        object_type="matrix.upgradeproposal", object_id=str(proposal.pk)
    ).order_by("id")
    states = [(e.verb, e.before.get("state"), e.after.get("state")) for e in events]
    assert states[0] == ("proposal.open", None, "collecting")
    assert ("proposal.evaluate", "collecting", "ready") in states
    assert ("proposal.evaluate", "ready", "approved") in states
    assert states[-1] == ("proposal.rollout", "approved", "rolled_out")
    assert [e.actor_label for e in events if e.verb == "proposal.approve"] == [
        "reviewer",
        "reviewer2",
    ]
    with pytest.raises(PermissionError):
        events.first().delete()


def test_only_the_policys_rollout_group_rolls_out(world, proposal, admin_user):
    from django.contrib.auth.models import Group

    from matrix.gate.services import policy_save

    release = Group.objects.create(name="release")
    policy_save(by=admin_user, rollout_group="release")
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="clean diff")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")
    with pytest.raises(PermissionDenied, match="only members of the release group"):
        proposal_rollout(proposal=proposal, by=world.reviewers[2])
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.APPROVED
    world.reviewers[2].groups.add(release)
    proposal_rollout(proposal=proposal, by=world.reviewers[2])
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.ROLLED_OUT
    with pytest.raises(ValidationError, match="no group named nobody"):
        policy_save(by=admin_user, rollout_group="nobody")


def test_a_cell_already_in_flight_keeps_the_proposal_collecting(world):
    from matrix.fleet.services import sweep_plan

    world.green(world.old)
    world.record("gemm", world.cpu, world.new, Status.PASS)
    online_runner("cpu-host", device_types=[world.cpu], toolchains=[world.new])
    softmax = world.shapes["softmax"]
    sweep_plan(cells=[(softmax, world.cpu, world.new)])
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    assert not proposal.sweeps.exists()
    assert proposal.state == UpgradeProposal.State.COLLECTING


def test_a_reviewer_lifts_their_own_rejection_by_approving(world, proposal):
    reviewer = world.reviewers[1]
    proposal_reject(proposal=proposal, by=reviewer, comment="changed my mind")
    proposal_approve(proposal=proposal, by=reviewer, comment="0.1.15 is fine after all")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.READY
    assert proposal.blocking_reasons == [
        "needs 2 approvals from the reviewer group, has 1"
    ]
    # The rejection stays in the record, replaced rather than deleted.
    rejection = Approval.objects.get(decision="reject")
    assert (rejection.voided, rejection.voided_reason) == (
        True,
        "superseded by a later decision",
    )
    assert AuditEvent.objects.filter(
        verb="approval.void", object_id=str(rejection.pk)
    ).exists()
    proposal_approve(proposal=proposal, by=world.reviewers[2], comment="agreed")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.APPROVED


def test_only_its_author_lifts_a_rejection(world, proposal):
    proposal_reject(proposal=proposal, by=world.reviewers[1], comment="changed my mind")
    with pytest.raises(ValidationError) as refused:
        proposal_approve(proposal=proposal, by=world.reviewers[2], comment="ship it")
    assert refused.value.messages == [
        "cannot approve while rejected: rejected by reviewer2: changed my mind; "
        "only reviewer2 can lift that rejection"
    ]
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.REJECTED
    assert list(
        Approval.objects.filter(voided=False).values_list("reviewer", "decision")
    ) == [(world.reviewers[1].pk, "reject")]


def test_the_proposer_cannot_grant_an_exception_to_their_proposal(world, proposal):
    with pytest.raises(PermissionDenied, match="proposer cannot grant an exception"):
        exception_grant(
            proposal=proposal, backend="c", reason="my own waiver", by=world.owner
        )
    assert not BackendException.objects.exists()


def test_the_audit_trail_records_state_changes_not_every_evaluation(world):
    world.green(world.old)
    online_runner("cpu-host", device_types=[world.cpu], toolchains=[world.new])
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    jobs = list(proposal.sweeps.get().jobs.all())
    # Each result changes the diff while other jobs are still open.
    for job in jobs:
        job.state = job.State.DONE
        job.save(update_fields=["state"])
        world.record(job.shape, job.device_type, job.toolchain, Status.PASS)
        proposal = proposal_reevaluate(proposal=proposal)
    evaluations = [
        (e.before["state"], e.after["state"])
        for e in AuditEvent.objects.filter(verb="proposal.evaluate").order_by("id")
    ]
    assert evaluations == [("collecting", "ready")]
