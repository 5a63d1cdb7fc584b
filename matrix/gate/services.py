"""Upgrade gate workflows. Each is keyword-only and atomic; a refusal raises
PermissionDenied (who may not) or ValidationError (what is not possible now),
with the reason in words, and every transition writes an audit event."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Q
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
    Backend,
    Cell,
    DeviceType,
    JobStage,
    KernelRevision,
    Operator,
    Shape,
    Status,
    Sweep,
    Toolchain,
    ValidationJob,
)
from matrix.queries import toolchains_online
from runners.models import Runner

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
    _policy_check(changes)
    values.update(changes)
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


def _policy_check(changes: dict) -> None:
    """Refuse, per field and in words, a change the gate could not apply:
    the stored versions were checked when written, so only ``changes`` are."""
    checks = {
        "perf_budget": _perf_budget_errors,
        "perf_budgets": _perf_budgets_errors,
        "required_approvals": _required_approvals_errors,
        "backend_owners": _backend_owners_errors,
        "reviewer_group": _reviewer_group_errors,
    }
    errors = {}
    for name, check in checks.items():
        if name in changes:
            problems = check(changes[name])
            if problems:
                errors[name] = problems
    if errors:
        raise ValidationError(errors)


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def _perf_budget_errors(value) -> list[str]:
    if not _is_number(value):
        return ["must be a number, e.g. 0.05"]
    return ["must not be negative"] if value < 0 else []


def _required_approvals_errors(value) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int):
        return ["must be a whole number"]
    return ["must be at least 1"] if value < 1 else []


def _perf_budgets_errors(budgets) -> list[str]:
    if not isinstance(budgets, dict):
        return ['must map operator names to budgets, e.g. {"gemm": 0.02}']
    known = set(Operator.objects.values_list("name", flat=True))
    errors = []
    unknown = sorted(set(budgets) - known)
    if unknown:
        errors.append(
            f"unknown operator {', '.join(unknown)}; the operators are "
            f"{', '.join(sorted(known)) or 'none yet'}"
        )
    for name, budget in sorted(budgets.items()):
        if not _is_number(budget) or budget < 0:
            errors.append(f"the budget for {name} must be a number, not negative")
    return errors


def _backend_owners_errors(owners) -> list[str]:
    if not isinstance(owners, dict):
        return ['must map backends to user names, e.g. {"cuda": ["alice"]}']
    errors = []
    unknown = sorted(set(owners) - set(Backend.values))
    if unknown:
        errors.append(
            f"unknown backend {', '.join(unknown)}; the backends are "
            f"{', '.join(Backend.values)}"
        )
    names = set()
    for backend, users in sorted(owners.items()):
        if not isinstance(users, list) or not all(isinstance(n, str) for n in users):
            errors.append(f"the owners of {backend} must be a list of user names")
        else:
            names.update(users)
    User = get_user_model()
    existing = set(
        User.objects.filter(**{f"{User.USERNAME_FIELD}__in": names}).values_list(
            User.USERNAME_FIELD, flat=True
        )
    )
    missing = sorted(names - existing)
    if missing:
        errors.append(f"no user named {', '.join(missing)}")
    return errors


def _reviewer_group_errors(name) -> list[str]:
    # A group no one can be in leaves every proposal without a reviewer.
    if Group.objects.filter(name=name).exists():
        return []
    names = ", ".join(Group.objects.order_by("name").values_list("name", flat=True))
    return [f"no group named {name}; create it in the admin first (groups: {names})"]


# -- evaluation ---------------------------------------------------------------


@dataclass
class Evaluation:
    """Why a proposal cannot pass yet, split by what would clear it."""

    policy: Policy
    diff: Diff
    blocking: list[str] = field(default_factory=list)  # only new results clear these
    approvals_needed: list[str] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    rejected_by: list[str] = field(default_factory=list)
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
    *,
    proposal: UpgradeProposal,
    diff: Diff | None = None,
    policy: Policy | None = None,
    ignoring=None,
) -> Evaluation:
    """``ignoring``: a reviewer whose standing decision is left out, as it
    will be once their next decision replaces it."""
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
            reason = f"served cell {row.label} has no candidate result"
            if row.candidate_status == Status.INFRA_ERROR:
                reason += " (its run hit runner trouble: infra_error, not the kernel)"
            ev.blocking.append(reason)
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
    if ignoring is not None:
        standing = standing.exclude(reviewer=ignoring)
    for approval in standing:
        if approval.diff_digest != diff.digest or approval.reviewer_id not in reviewers:
            continue
        if approval.decision == Approval.Decision.REJECT:
            name = approval.reviewer.get_username()
            ev.rejections.append(f"rejected by {name}: {approval.comment}")
            ev.rejected_by.append(name)
        elif approval.reviewer_id != proposal.proposer_id:
            ev.approvals += 1
    if ev.approvals < policy.required_approvals:
        ev.approvals_needed.append(
            f"needs {policy.required_approvals} approvals from the "
            f"{policy.reviewer_group} group, has {ev.approvals}"
        )
    return ev


def _open_jobs(proposal: UpgradeProposal):
    """Jobs still queued or running on the proposal's served cells, whoever
    planned them: a cell already in flight when the proposal opened is not
    planned twice, but its result is awaited all the same."""
    return ValidationJob.objects.open().filter(
        shape__served=True,
        device_type__in=proposal.device_types.all(),
        toolchain__in=[proposal.baseline_id, proposal.candidate_id],
    )


@dataclass
class StalledJobs:
    """Queued jobs of one toolchain on one device type that sit on a queue no
    online runner reads: they run only once a runner that can take them
    comes online."""

    toolchain: Toolchain
    device_type: DeviceType
    count: int
    missing_runner: str

    def __str__(self) -> str:
        return (
            f"{_jobs_phrase(self.count)} on {self.toolchain} for {self.device_type} "
            f"({self.missing_runner})"
        )


def _jobs_phrase(count: int) -> str:
    return f"{count} validation job{'s' if count != 1 else ''}"


@dataclass
class JobsInFlight:
    open: int
    stalled: list[StalledJobs]

    @property
    def stalled_count(self) -> int:
        return sum(group.count for group in self.stalled)


def proposal_jobs_in_flight(*, proposal: UpgradeProposal) -> JobsInFlight:
    """What a collecting proposal waits for: its open jobs, and those of them
    that no online runner can take (the rule of ``manage.py sweep``'s
    warning), with the runner each group lacks."""
    jobs = _open_jobs(proposal)
    total = jobs.count()
    if not total:
        return JobsInFlight(open=0, stalled=[])
    read = Runner.objects.online().queues_read()
    hosted = {toolchain.pk for toolchain in toolchains_online()}
    groups = (
        jobs.filter(state=ValidationJob.State.QUEUED)
        .exclude(queue__in=read)
        .values("toolchain", "device_type", "stage")
        .annotate(count=Count("pk"))
        .order_by("toolchain", "device_type", "stage")
    )
    toolchains = Toolchain.objects.in_bulk({g["toolchain"] for g in groups})
    device_types = DeviceType.objects.in_bulk({g["device_type"] for g in groups})
    stalled = []
    for group in groups:
        toolchain = toolchains[group["toolchain"]]
        device_type = device_types[group["device_type"]]
        # A job's queue follows from its stage (runners.services.routes_for).
        if toolchain.pk not in hosted:
            missing = f"no online runner hosts {toolchain}"
        elif group["stage"] == JobStage.VALIDATE:
            missing = f"no online runner with {device_type} hosts {toolchain}"
        else:
            missing = f"no online runner that hosts {toolchain} has nvcc"
        stalled.append(StalledJobs(toolchain, device_type, group["count"], missing))
    return JobsInFlight(open=total, stalled=stalled)


def _state_of(proposal: UpgradeProposal, ev: Evaluation) -> str:
    """The state an evaluation puts the proposal in; a failing rule while
    jobs are open may still be cleared by their results."""
    if ev.rejections:
        return ProposalState.REJECTED
    if _open_jobs(proposal).exists():
        return ProposalState.COLLECTING
    if ev.blocking:
        return ProposalState.BLOCKED
    if ev.approvals_needed:
        return ProposalState.READY
    return ProposalState.APPROVED


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
    state = _state_of(proposal, ev)
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
    # Results arriving while collecting change the digest and the reasons on
    # every ingest; the trail records the transitions, and the approvals the
    # diff voids are recorded one by one.
    if proposal.state != before["state"]:
        AuditEvent.record(
            actor=actor,
            verb="proposal.evaluate",
            obj=proposal,
            before=before,
            after=proposal.snapshot(),
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
    if decision == Approval.Decision.APPROVE:
        _approval_check(proposal=proposal, by=by)
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


def _approval_check(*, proposal: UpgradeProposal, by) -> None:
    """Refuse an approval the proposal cannot take now, saying what has to
    happen first. The reviewer's own standing decision is left out, since
    this one replaces it: that is how a reviewer lifts their rejection,
    while someone else's rejection still stands."""
    ev = _evaluate(proposal=proposal, ignoring=by)
    state = _state_of(proposal, ev)
    if state in (ProposalState.READY, ProposalState.APPROVED):
        return
    if state == ProposalState.REJECTED:
        them = "that rejection" if len(ev.rejected_by) == 1 else "those rejections"
        why = (
            "; ".join(ev.rejections)
            + f"; only {' and '.join(ev.rejected_by)} can lift {them}"
        )
    elif state == ProposalState.COLLECTING:
        why = _collecting_wait(proposal)
    else:
        why = "; ".join(ev.blocking)
    raise ValidationError(
        f"cannot approve while {ProposalState(state).label.lower()}: {why}"
    )


def _collecting_wait(proposal: UpgradeProposal) -> str:
    jobs = proposal_jobs_in_flight(proposal=proposal)
    why = (
        f"wait for the {_jobs_phrase(jobs.open)} still queued or running on its "
        "served cells and approve once their results are in"
    )
    if jobs.stalled:
        why += (
            f"; {jobs.stalled_count} of them wait on queues no online runner "
            "reads: " + "; ".join(str(group) for group in jobs.stalled)
        )
    return why


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
    after that backend's owner signs. Never the proposer: waiving a rule is a
    decision on the proposal, under the same two-person rule as approving."""
    if by.pk == proposal.proposer_id:
        raise PermissionDenied(
            "the proposer cannot grant an exception to their own proposal"
        )
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
