"""Upgrade gate workflows. Each is keyword-only and atomic; a refusal raises
PermissionDenied (who may not) or ValidationError (what is not possible now),
with the reason in words, and every transition writes an audit event."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from matrix.gate.diff import Change, Diff, matrix_diff
from matrix.gate.manifest import manifest_entries_write
from matrix.gate.models import (
    Approval,
    BackendException,
    Policy,
    ProposalState,
    UpgradeProposal,
)
from matrix.models import (
    AuditEvent,
    Cell,
    KernelRevision,
    Shape,
    Sweep,
    Toolchain,
    ValidationJob,
)

POLICY_FIELDS = (
    "forbid_served_regressions",
    "perf_budget",
    "perf_budgets",
    "require_candidate_results",
    "required_approvals",
    "reviewer_group",
    "backend_owners",
    "note",
)


def is_reviewer(user, policy: Policy | None = None) -> bool:
    policy = policy or Policy.current()
    return bool(
        user.is_authenticated
        and user.groups.filter(name=policy.reviewer_group).exists()
    )


def can_propose(user) -> bool:
    return user.is_authenticated and user.has_perm("matrix.propose_upgrade")


def can_edit_policy(user) -> bool:
    return user.is_authenticated and user.is_superuser


# -- policy -------------------------------------------------------------------


@transaction.atomic
def policy_save(*, by, **changes) -> Policy:
    """Write the next policy version from the current one plus ``changes``,
    then re-evaluate every open proposal under it."""
    if not can_edit_policy(by):
        raise PermissionDenied("only admins edit the upgrade policy")
    unknown = sorted(set(changes) - set(POLICY_FIELDS))
    if unknown:
        raise ValidationError(f"unknown policy fields: {', '.join(unknown)}")
    current = Policy.objects.select_for_update().order_by("-version").first()
    values = {name: getattr(current, name) for name in POLICY_FIELDS} if current else {}
    values.update(changes)
    _policy_check(values)
    policy = Policy.objects.create(
        version=(current.version + 1) if current else 1, created_by=by, **values
    )
    AuditEvent.record(
        actor=by,
        verb="policy.save",
        obj=policy,
        before=current.as_dict() if current else {},
        after=policy.as_dict(),
    )
    for proposal in UpgradeProposal.objects.open():
        proposal_reevaluate(proposal=proposal)
    return policy


def _policy_check(values: dict) -> None:
    budgets = values.get("perf_budgets", {})
    if not isinstance(budgets, dict) or any(
        isinstance(v, bool) or not isinstance(v, int | float) or v < 0
        for v in budgets.values()
    ):
        raise ValidationError("per-operator budgets must map names to numbers >= 0")
    owners = values.get("backend_owners", {})
    if not isinstance(owners, dict) or any(
        not isinstance(v, list) or not all(isinstance(n, str) for n in v)
        for v in owners.values()
    ):
        raise ValidationError(
            "backend owners must map a backend to a list of user names"
        )
    if values.get("required_approvals", 1) < 1:
        raise ValidationError("at least one approval is required")
    if values.get("perf_budget", 0) < 0:
        raise ValidationError("the performance budget cannot be negative")


# -- evaluation ---------------------------------------------------------------


@dataclass
class Evaluation:
    """Why a proposal cannot pass yet, split by what would clear it."""

    policy: Policy
    diff: Diff
    blocking: list[str] = field(default_factory=list)  # only new results clear these
    approvals_needed: list[str] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    approvals: int = 0

    @property
    def reasons(self) -> list[str]:
        return self.rejections + self.blocking + self.approvals_needed


def proposal_diff(*, proposal: UpgradeProposal) -> Diff:
    return matrix_diff(
        baseline=proposal.baseline,
        candidate=proposal.candidate,
        device_types=proposal.device_types.all(),
    )


def policy_evaluate(
    *, proposal: UpgradeProposal, diff: Diff | None = None, policy: Policy | None = None
) -> list[str]:
    """Every reason, in words, that keeps the proposal from approval; empty
    when it is approved under the policy."""
    return _evaluate(proposal=proposal, diff=diff, policy=policy).reasons


def _evaluate(
    *, proposal: UpgradeProposal, diff: Diff | None = None, policy: Policy | None = None
) -> Evaluation:
    policy = policy or Policy.current()
    diff = diff or proposal_diff(proposal=proposal)
    ev = Evaluation(policy=policy, diff=diff)
    exceptions = {
        e.backend: e for e in proposal.exceptions.select_related("signed_off_by")
    }
    for row in diff.rows:
        if not row.served:
            continue
        if policy.forbid_served_regressions and row.change == Change.GREEN_TO_RED:
            ev.blocking.append(
                f"served cell {row.label} went from pass to {row.candidate_status}"
            )
        if policy.require_candidate_results and row.change == Change.MISSING:
            ev.blocking.append(f"served cell {row.label} has no candidate result")
        budget = policy.budget_for(row.operator)
        if row.slower_than(budget):
            exception = exceptions.get(row.backend)
            if exception is not None and exception.signed:
                continue
            reason = (
                f"served cell {row.label} is {row.ratio - 1:.0%} slower "
                f"(ratio {row.ratio:.2f} ± {row.band:.2f}), over the {budget:.0%} "
                f"budget for {row.operator}"
            )
            if exception is not None:
                owners = ", ".join(policy.owners_of(row.backend)) or "none named"
                reason += (
                    f"; the {row.backend} exception awaits sign-off by its owner "
                    f"({owners})"
                )
            ev.blocking.append(reason)
    standing = proposal.approvals.filter(voided=False).select_related("reviewer")
    reviewers = set(
        get_user_model()
        .objects.filter(groups__name=policy.reviewer_group)
        .values_list("pk", flat=True)
    )
    for approval in standing:
        if approval.diff_digest != diff.digest or approval.reviewer_id not in reviewers:
            continue
        if approval.decision == Approval.Decision.REJECT:
            ev.rejections.append(
                f"rejected by {approval.reviewer.get_username()}: {approval.comment}"
            )
        elif approval.reviewer_id != proposal.proposer_id:
            ev.approvals += 1
    if ev.approvals < policy.required_approvals:
        ev.approvals_needed.append(
            f"needs {policy.required_approvals} approvals from the "
            f"{policy.reviewer_group} group, has {ev.approvals}"
        )
    return ev


def _has_open_jobs(proposal: UpgradeProposal) -> bool:
    """Jobs still queued or running on the proposal's served cells, whoever
    planned them: a cell already in flight when the proposal opened is not
    planned twice, but its result is awaited all the same."""
    return (
        ValidationJob.objects.open()
        .filter(
            shape__served=True,
            device_type__in=proposal.device_types.all(),
            toolchain__in=[proposal.baseline_id, proposal.candidate_id],
        )
        .exists()
    )


@transaction.atomic
def proposal_reevaluate(*, proposal: UpgradeProposal, actor=None) -> UpgradeProposal:
    """Recompute the diff and the state. A changed diff voids the decisions
    given on the old one. Rolled-out proposals are history and stay put."""
    proposal = UpgradeProposal.objects.select_for_update().get(pk=proposal.pk)
    if proposal.state == ProposalState.ROLLED_OUT:
        return proposal
    before = proposal.snapshot()
    diff = proposal_diff(proposal=proposal)
    if proposal.diff_digest and diff.digest != proposal.diff_digest:
        _void_decisions(proposal=proposal, digest=diff.digest, actor=actor)
    ev = _evaluate(proposal=proposal, diff=diff)
    if ev.rejections:
        state = ProposalState.REJECTED
    elif ev.blocking:
        state = (
            ProposalState.COLLECTING
            if _has_open_jobs(proposal)
            else ProposalState.BLOCKED
        )
    elif _has_open_jobs(proposal):
        state = ProposalState.COLLECTING
    elif ev.approvals_needed:
        state = ProposalState.READY
    else:
        state = ProposalState.APPROVED
    if state == ProposalState.APPROVED and (
        proposal.state != ProposalState.APPROVED or diff.digest != proposal.diff_digest
    ):
        proposal.approved_at = timezone.now()
        manifest_entries_write(proposal=proposal, diff=diff)
    elif state != ProposalState.APPROVED and proposal.state == ProposalState.APPROVED:
        proposal.approved_at = None
        proposal.manifest_entries.all().delete()
    proposal.state = state
    proposal.policy = ev.policy
    proposal.diff_digest = diff.digest
    proposal.summary = diff.summary
    proposal.blocking_reasons = ev.reasons
    proposal.evaluated_at = timezone.now()
    proposal.save()
    after = proposal.snapshot()
    if after != before:
        AuditEvent.record(
            actor=actor,
            verb="proposal.evaluate",
            obj=proposal,
            before=before,
            after=after,
        )
    return proposal


def _void_decisions(*, proposal: UpgradeProposal, digest: str, actor) -> None:
    for approval in proposal.approvals.filter(voided=False).exclude(diff_digest=digest):
        _void(approval, reason="the diff changed after this decision", actor=actor)


def _void(approval: Approval, *, reason: str, actor) -> None:
    Approval.objects.filter(pk=approval.pk).update(voided=True, voided_reason=reason)
    AuditEvent.record(
        actor=actor,
        verb="approval.void",
        obj=approval,
        before={"voided": False, "decision": approval.decision},
        after={"voided": True, "decision": approval.decision, "reason": reason},
    )


@transaction.atomic
def proposals_reevaluate_for_results(*, results) -> list[UpgradeProposal]:
    """The hook for result ingest: re-evaluate, once each, the open proposals
    whose matrix any of the stored results belongs to."""
    cells = {(r.device_type_id, r.toolchain_id) for r in results}
    if not cells:
        return []
    match = Q()
    for device_type_id, toolchain_id in cells:
        match |= Q(device_types=device_type_id) & (
            Q(baseline_id=toolchain_id) | Q(candidate_id=toolchain_id)
        )
    affected = UpgradeProposal.objects.open().filter(match).distinct()
    return [proposal_reevaluate(proposal=p) for p in affected]


# -- opening ------------------------------------------------------------------


@transaction.atomic
def proposal_open(
    *,
    baseline: Toolchain,
    candidate: Toolchain,
    device_types,
    by,
    note: str = "",
) -> UpgradeProposal:
    """Open a proposal and schedule the served matrix: every served cell on
    the candidate that has no result on the current kernel revision, and the
    same on the baseline, whose results may be stale."""
    if not can_propose(by):
        raise PermissionDenied("you need the propose permission to open an upgrade")
    device_types = list(device_types)
    if baseline.pk == candidate.pk:
        raise ValidationError("the candidate must differ from the baseline toolchain")
    if not device_types:
        raise ValidationError("choose at least one device type")
    proposal = UpgradeProposal.objects.create(
        baseline=baseline, candidate=candidate, proposer=by, note=note
    )
    proposal.device_types.set(device_types)
    AuditEvent.record(
        actor=by,
        verb="proposal.open",
        obj=proposal,
        after={
            "baseline": baseline.fingerprint,
            "candidate": candidate.fingerprint,
            "device_types": [str(dt) for dt in device_types],
            "state": proposal.state,
        },
    )
    cells = stale_served_cells(
        toolchains=[candidate, baseline], device_types=device_types
    )
    if cells:
        sweep = _sweep_plan(
            cells=cells, created_by=by, filters={"upgrade_proposal": proposal.pk}
        )
        proposal.sweeps.add(sweep)
    return proposal_reevaluate(proposal=proposal, actor=by)


def stale_served_cells(*, toolchains, device_types) -> list[tuple]:
    """(shape, device type, toolchain) for served cells whose latest result
    is absent or was produced by a kernel revision that is no longer current,
    and that have no job in flight for the current revision."""
    current = dict(
        KernelRevision.objects.filter(is_current=True).values_list("operator_id", "pk")
    )
    fresh = set(
        Cell.objects.filter(
            toolchain__in=toolchains, device_type__in=device_types, shape__served=True
        ).values_list("shape_id", "device_type_id", "toolchain_id", "revision_id")
    )
    # A cell with a job in flight is awaited, not planned again.
    fresh |= set(
        ValidationJob.objects.open()
        .filter(
            toolchain__in=toolchains, device_type__in=device_types, shape__served=True
        )
        .values_list("shape_id", "device_type_id", "toolchain_id", "revision_id")
    )
    cells = []
    for shape in Shape.objects.served().filter(operator_id__in=current):
        for dt in device_types:
            for toolchain in toolchains:
                key = (shape.pk, dt.pk, toolchain.pk, current[shape.operator_id])
                if key not in fresh:
                    cells.append((shape, dt, toolchain))
    return cells


def _sweep_plan(*, cells, created_by, filters) -> Sweep:
    # Imported here: the matrix app must load without the runners app's
    # services (and their broker settings) being importable yet.
    from runners.services import sweep_plan

    return sweep_plan(cells=cells, created_by=created_by, filters=filters)


# -- decisions ----------------------------------------------------------------


def _decide(*, proposal, by, comment: str, decision: str) -> Approval:
    if by.pk == proposal.proposer_id:
        raise PermissionDenied("the proposer cannot decide on their own proposal")
    policy = Policy.current()
    if not is_reviewer(by, policy):
        raise PermissionDenied(
            f"only members of the {policy.reviewer_group} group decide"
        )
    comment = (comment or "").strip()
    if not comment:
        raise ValidationError("a decision needs a comment")
    proposal = proposal_reevaluate(proposal=proposal, actor=by)
    if proposal.state == ProposalState.ROLLED_OUT:
        raise ValidationError("this proposal is already rolled out")
    if decision == Approval.Decision.APPROVE and proposal.state not in (
        ProposalState.READY,
        ProposalState.APPROVED,
    ):
        raise ValidationError(
            f"cannot approve while {proposal.state.replace('_', ' ')}: "
            + "; ".join(proposal.blocking_reasons)
        )
    for previous in proposal.approvals.filter(reviewer=by, voided=False):
        _void(previous, reason="superseded by a later decision", actor=by)
    approval = Approval.objects.create(
        proposal=proposal,
        reviewer=by,
        proposer=proposal.proposer,
        decision=decision,
        comment=comment,
        diff_digest=proposal.diff_digest,
    )
    before = proposal.snapshot()
    proposal = proposal_reevaluate(proposal=proposal, actor=by)
    AuditEvent.record(
        actor=by,
        verb=f"proposal.{decision}",
        obj=proposal,
        before=before,
        after={**proposal.snapshot(), "approval": approval.pk, "comment": comment},
    )
    return approval


@transaction.atomic
def proposal_approve(*, proposal: UpgradeProposal, by, comment: str) -> Approval:
    return _decide(
        proposal=proposal, by=by, comment=comment, decision=Approval.Decision.APPROVE
    )


@transaction.atomic
def proposal_reject(*, proposal: UpgradeProposal, by, comment: str) -> Approval:
    return _decide(
        proposal=proposal, by=by, comment=comment, decision=Approval.Decision.REJECT
    )


# -- backend exceptions ---------------------------------------------------------


@transaction.atomic
def exception_grant(
    *, proposal: UpgradeProposal, backend: str, reason: str, by
) -> BackendException:
    """A reviewer waives one backend's performance regressions; it counts only
    after that backend's owner signs."""
    if not is_reviewer(by):
        raise PermissionDenied("only reviewers grant exceptions")
    if not proposal.device_types.filter(backend=backend).exists():
        raise ValidationError(f"this proposal covers no {backend} device type")
    if not (reason or "").strip():
        raise ValidationError("an exception needs a reason")
    exception, created = BackendException.objects.get_or_create(
        proposal=proposal,
        backend=backend,
        defaults={"reason": reason.strip(), "granted_by": by},
    )
    if not created:
        raise ValidationError(f"an exception for {backend} already exists")
    AuditEvent.record(
        actor=by,
        verb="exception.grant",
        obj=exception,
        after={"proposal": proposal.pk, "backend": backend, "reason": exception.reason},
    )
    proposal_reevaluate(proposal=proposal, actor=by)
    return exception


@transaction.atomic
def exception_sign_off(*, exception: BackendException, by) -> BackendException:
    exception = BackendException.objects.select_for_update().get(pk=exception.pk)
    proposal = exception.proposal
    if by.pk == proposal.proposer_id:
        raise PermissionDenied(
            "the proposer cannot sign off an exception to their proposal"
        )
    owners = Policy.current().owners_of(exception.backend)
    if by.get_username() not in owners:
        raise PermissionDenied(
            f"only an owner of the {exception.backend} backend signs off "
            f"({', '.join(owners) or 'the policy names none'})"
        )
    if exception.signed:
        raise ValidationError("this exception is already signed off")
    exception.signed_off_by = by
    exception.signed_off_at = timezone.now()
    exception.save(update_fields=["signed_off_by", "signed_off_at"])
    AuditEvent.record(
        actor=by,
        verb="exception.sign_off",
        obj=exception,
        before={"signed_off_by": None},
        after={"signed_off_by": by.get_username()},
    )
    proposal_reevaluate(proposal=proposal, actor=by)
    return exception


# -- rollout --------------------------------------------------------------------


@transaction.atomic
def proposal_rollout(*, proposal: UpgradeProposal, by) -> UpgradeProposal:
    """Make the approved candidate the current toolchain. Final: the diff,
    the approvals and the manifest rows are frozen as they were approved."""
    if not (can_edit_policy(by) or is_reviewer(by)):
        raise PermissionDenied("only reviewers or admins roll out an upgrade")
    proposal = proposal_reevaluate(proposal=proposal, actor=by)
    if proposal.state != ProposalState.APPROVED:
        raise ValidationError(
            f"only an approved proposal rolls out; this one is "
            f"{proposal.state.replace('_', ' ')}"
        )
    before = proposal.snapshot()
    previous = list(
        Toolchain.objects.filter(is_current=True).values_list("name", flat=True)
    )
    Toolchain.objects.filter(is_current=True).exclude(pk=proposal.candidate_id).update(
        is_current=False
    )
    Toolchain.objects.filter(pk=proposal.candidate_id).update(is_current=True)
    proposal.state = ProposalState.ROLLED_OUT
    proposal.rolled_out_at = timezone.now()
    proposal.save(update_fields=["state", "rolled_out_at"])
    AuditEvent.record(
        actor=by,
        verb="proposal.rollout",
        obj=proposal,
        before={**before, "current_toolchains": previous},
        after={**proposal.snapshot(), "current_toolchains": [proposal.candidate.name]},
    )
    return proposal
