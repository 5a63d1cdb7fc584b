"""Upgrade gate workflows. Each is keyword-only and atomic; a refusal raises
PermissionDenied (who may not) or ValidationError (what is not possible now),
with the reason in words, and every transition writes an audit event."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from matrix import revisions
from matrix.events import proposal_state_changed
from matrix.gate.diff import CellDiff, Change, Diff, matrix_diff
from matrix.gate.evaluation import (
    Evaluation,
    JobsInFlight,
    evaluate,
    jobs_phrase,
    proposal_jobs_in_flight,  # noqa: F401  read here by the tests
    proposal_jobs_in_flight_read,  # noqa: F401  and the pages
)
from matrix.gate.manifest import manifest_entries_write
from matrix.models import (
    AuditEvent,
    Backend,
    Cell,
    Operator,
    Shape,
    Sweep,
    Toolchain,
    ValidationJob,
)
from matrix.models.gate import (
    Approval,
    BackendException,
    DiffRow,
    Policy,
    ProposalState,
    UpgradeProposal,
)

POLICY_FIELDS = (
    "forbid_served_regressions",
    "perf_budget",
    "perf_budgets",
    "speed_budget",
    "require_candidate_results",
    "required_approvals",
    "reviewer_group",
    "rollout_group",
    "backend_owners",
    "note",
)


def is_reviewer(user, policy: Policy | None = None) -> bool:
    policy = policy or Policy.current()
    return bool(
        user.is_authenticated
        and user.groups.filter(name=policy.reviewer_group).exists()
    )


def can_rollout(user, policy: Policy | None = None) -> bool:
    """Members of the policy's roll-out group, and superusers."""
    policy = policy or Policy.current()
    return bool(
        user.is_authenticated
        and (
            user.is_superuser or user.groups.filter(name=policy.rollout_group).exists()
        )
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
        proposal_evaluate(proposal=proposal, actor=by)
    return policy


def _policy_check(changes: dict) -> None:
    """Refuse, per field and in words, a change the gate could not apply:
    the stored versions were checked when written, so only ``changes`` are."""
    checks = {
        "perf_budget": _perf_budget_errors,
        "speed_budget": _perf_budget_errors,
        "perf_budgets": _perf_budgets_errors,
        "required_approvals": _required_approvals_errors,
        "backend_owners": _backend_owners_errors,
        "reviewer_group": _reviewer_group_errors,
        "rollout_group": _reviewer_group_errors,
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

# How long the re-evaluation that results ask for waits after the first of
# them: a burst of results (a sweep's messages land seconds apart) makes one.
REEVALUATION_DELAY_S = 2.0
# Stored diff rows are written and deleted in batches of this many.
ROWS_PER_STATEMENT = 500


def proposal_diff(*, proposal: UpgradeProposal) -> Diff:
    """The diff computed from the matrix now; the proposal's stored rows are
    the last re-evaluation's."""
    return matrix_diff(
        baseline=proposal.baseline,
        candidate=proposal.candidate,
        device_types=proposal.device_types.all(),
    )


def policy_evaluate(
    *, proposal: UpgradeProposal, policy: Policy | None = None
) -> list[str]:
    """Every reason, in words, that keeps the proposal from approval under
    its stored diff; empty when it is approved under the policy."""
    return evaluate(proposal=proposal, policy=policy).reasons


def _locked(proposal: UpgradeProposal) -> UpgradeProposal:
    return UpgradeProposal.objects.select_for_update().get(pk=proposal.pk)


@transaction.atomic
def proposal_reevaluate(*, proposal: UpgradeProposal, actor=None) -> UpgradeProposal:
    """Recompute the stored diff from the matrix, then the state. A changed
    diff voids the decisions given on the old one. Rolled-out proposals are
    history and stay put. This path holds the proposal while it computes
    (opening one, "Re-evaluate now"); results that arrive ask for
    ``proposal_reevaluate_requested`` instead, which does not."""
    started = timezone.now()
    proposal = _locked(proposal)
    if proposal.state == ProposalState.ROLLED_OUT:
        return proposal
    before = proposal.snapshot()
    _diff_store(
        proposal=proposal,
        diff=proposal_diff(proposal=proposal),
        computed_at=started,
        actor=actor,
    )
    return _evaluation_apply(proposal=proposal, before=before, actor=actor)


@transaction.atomic
def proposal_evaluate(*, proposal: UpgradeProposal, actor=None) -> UpgradeProposal:
    """The state under the current policy and standing decisions, over the
    stored diff: what a decision, an exception or a policy edit changes. A
    proposal with no stored diff yet gets one first."""
    proposal = _locked(proposal)
    if proposal.state == ProposalState.ROLLED_OUT:
        return proposal
    if proposal.diff_computed_at is None:
        return proposal_reevaluate(proposal=proposal, actor=actor)
    return _evaluation_apply(proposal=proposal, before=proposal.snapshot(), actor=actor)


def proposal_reevaluate_requested(*, proposal_id: int) -> UpgradeProposal | None:
    """The re-evaluation new results asked for (``proposals_reevaluation_
    request``), on the control worker. The diff is computed without holding
    the proposal, so ingest goes on storing results meanwhile, and stored
    unless a computation begun later has stored its own. A request made
    while it computed gets a run of its own, enqueued here; a run that finds
    no request left (an earlier one served it) does nothing."""
    proposal = UpgradeProposal.objects.filter(pk=proposal_id).first()
    if proposal is None or proposal.reevaluation_requested_at is None:
        return None
    requested = proposal.reevaluation_requested_at
    started = timezone.now()
    diff = None
    if proposal.state != ProposalState.ROLLED_OUT:
        diff = proposal_diff(proposal=proposal)
    with transaction.atomic():
        proposal = _locked(proposal)
        stale = proposal.diff_computed_at and proposal.diff_computed_at > started
        if proposal.state != ProposalState.ROLLED_OUT and diff and not stale:
            before = proposal.snapshot()
            _diff_store(proposal=proposal, diff=diff, computed_at=started, actor=None)
            proposal = _evaluation_apply(proposal=proposal, before=before, actor=None)
        if proposal.reevaluation_requested_at == requested:
            proposal.reevaluation_requested_at = None
            proposal.save(update_fields=["reevaluation_requested_at"])
        elif proposal.reevaluation_requested_at is not None:
            transaction.on_commit(partial(_reevaluation_enqueue, proposal.pk))
    return proposal


def proposals_reevaluation_request(*, results) -> list[int]:
    """The hook result ingest calls inside its transaction, with the results
    it stored: mark the open proposals whose matrix they belong to, and have
    the control worker re-evaluate each once they are committed. Nothing is
    computed here. Each proposal is locked from here to the ingest's commit
    (its last statement), so a re-evaluation that clears a mark has seen
    the results that set it; only a proposal not marked yet gets a task,
    REEVALUATION_DELAY_S later, so a burst of results makes one."""
    pairs = {(r.device_type_id, r.toolchain_id) for r in results}
    if not pairs:
        return []
    match = Q()
    for device_type_id, toolchain_id in pairs:
        match |= Q(device_types=device_type_id) & (
            Q(baseline_id=toolchain_id) | Q(candidate_id=toolchain_id)
        )
    # Found and locked in one statement (a join cannot be locked with
    # DISTINCT, a subquery can), in id order so two ingests queue rather
    # than deadlock.
    affected = UpgradeProposal.objects.open().filter(match).values("pk")
    marks = dict(
        UpgradeProposal.objects.select_for_update()
        .filter(pk__in=affected)
        .order_by("pk")
        .values_list("pk", "reevaluation_requested_at")
    )
    if not marks:
        return []
    UpgradeProposal.objects.filter(pk__in=marks).update(
        reevaluation_requested_at=timezone.now()
    )
    for pk, mark in marks.items():
        if mark is None:
            transaction.on_commit(partial(_reevaluation_enqueue, pk))
    return sorted(marks)


@transaction.atomic
def proposal_reevaluation_ask(*, proposal: UpgradeProposal) -> None:
    """ "Re-evaluate now": a background re-evaluation at once, marked as
    results mark one, so the page polls until it is done."""
    UpgradeProposal.objects.filter(pk=proposal.pk).update(
        reevaluation_requested_at=timezone.now()
    )
    transaction.on_commit(partial(_reevaluation_enqueue, proposal.pk, delay_s=0))


REEVALUATE_TASK = "gate.reevaluate"


def _reevaluation_enqueue(
    proposal_id: int, delay_s: float = REEVALUATION_DELAY_S
) -> None:
    # By name (matrix/gate/tasks.py runs it): the tasks call these services.
    from matrix.celery import app

    app.signature(REEVALUATE_TASK).apply_async(args=[proposal_id], countdown=delay_s)


def proposals_reevaluation_resend(*, older_than_s: float) -> list[int]:
    """Enqueue again the re-evaluations asked for longer ago than
    ``older_than_s`` and still waiting: a task lost with the broker or a
    worker would otherwise leave its proposal marked, and later results
    enqueue nothing for a marked proposal."""
    before = timezone.now() - timedelta(seconds=older_than_s)
    waiting = list(
        UpgradeProposal.objects.open()
        .filter(reevaluation_requested_at__lt=before)
        .values_list("pk", flat=True)
    )
    for pk in waiting:
        _reevaluation_enqueue(pk)
    return waiting


DIFF_ROW_FIELDS = [
    "shape_id",
    "device_type_id",
    "position",
    *(
        name
        for name in CellDiff.__dataclass_fields__
        if name not in ("shape_id", "device_type_id", "device_type")
    ),
    "device_type_label",
    "perf_step",
    "rank",
    "sort_key",
]
# sort_key = rank x SORT_STRIDE + position: changed rows first, each rank
# in the diff's order.
SORT_STRIDE = 10**9


def _diff_store(*, proposal: UpgradeProposal, diff: Diff, computed_at, actor) -> int:
    """Write the rows of ``diff`` that differ from the stored ones and drop
    those no longer in it; returns how many were written. A new digest
    voids the decisions given on the old one."""
    # Rows as tuples of DIFF_ROW_FIELDS, compared whole: a large diff has
    # tens of thousands of rows, most of them unchanged.
    wanted = {}
    for position, row in enumerate(diff.rows):
        values = row.row_fields()
        values["position"] = position
        values["sort_key"] = values["rank"] * SORT_STRIDE + position
        wanted[row.shape_id, row.device_type_id] = tuple(
            values[name] for name in DIFF_ROW_FIELDS
        )
    stored = {
        (values[1], values[2]): values
        for values in proposal.diff_rows.values_list("pk", *DIFF_ROW_FIELDS)
    }
    gone = [old[0] for key, old in stored.items() if old[1:] != wanted.get(key)]
    written = [
        DiffRow(proposal=proposal, **dict(zip(DIFF_ROW_FIELDS, new, strict=True)))
        for key, new in wanted.items()
        if key not in stored or stored[key][1:] != new
    ]
    for i in range(0, len(gone), ROWS_PER_STATEMENT):
        DiffRow.objects.filter(pk__in=gone[i : i + ROWS_PER_STATEMENT]).delete()
    DiffRow.objects.bulk_create(written, batch_size=ROWS_PER_STATEMENT)
    if proposal.diff_digest and diff.digest != proposal.diff_digest:
        _void_decisions(proposal=proposal, digest=diff.digest, actor=actor)
    proposal.diff_digest = diff.digest
    proposal.summary = diff.summary
    proposal.diff_computed_at = computed_at
    proposal.save(update_fields=["diff_digest", "summary", "diff_computed_at"])
    return len(written)


def _evaluation_apply(
    *, proposal: UpgradeProposal, before: dict, actor
) -> UpgradeProposal:
    """Store what the policy says of the stored diff: the state, the reasons
    (summarised), each row's failed rule, and the manifest rows while
    approved. Only a change of state is audited: results arriving change
    the reasons on every re-evaluation."""
    ev = evaluate(proposal=proposal)
    state = ev.state
    if state == ProposalState.APPROVED:
        if proposal.state != ProposalState.APPROVED:
            proposal.approved_at = timezone.now()
            manifest_entries_write(proposal=proposal, policy=ev.policy)
        elif (
            before["diff_digest"] != proposal.diff_digest
            or proposal.policy_id != ev.policy.pk
        ):
            manifest_entries_write(proposal=proposal, policy=ev.policy)
    elif proposal.state == ProposalState.APPROVED:
        proposal.approved_at = None
        proposal.manifest_entries.all().delete()
    _blocking_rules_write(proposal=proposal, ev=ev)
    proposal.state = state
    proposal.policy = ev.policy
    proposal.blocking_reasons = ev.reasons_summarised
    proposal.summary = {**proposal.summary, "blocking": len(ev.blockers)}
    proposal.evaluated_at = timezone.now()
    proposal.save(
        update_fields=[
            "state",
            "policy",
            "blocking_reasons",
            "summary",
            "evaluated_at",
            "approved_at",
        ]
    )
    if proposal.state != before["state"]:
        AuditEvent.record(
            actor=actor,
            verb="proposal.evaluate",
            obj=proposal,
            before=before,
            after=proposal.snapshot(),
        )
        proposal_state_changed.send(
            sender=UpgradeProposal,
            proposal=proposal,
            before=before["state"],
            actor=actor,
        )
    return proposal


def _blocking_rules_write(*, proposal: UpgradeProposal, ev: Evaluation) -> None:
    """Mark each stored row with the rule it fails, so the page can list
    them, writing only the rows whose mark changes. Regressions and missing
    results are whole classes of rows (one statement each, however many);
    slowdowns are few, named by id."""
    policy = ev.policy
    rows = proposal.diff_rows.all()
    nothing = rows.none()
    failing = {
        "regression": rows.filter(served=True, change=Change.GREEN_TO_RED)
        if policy.forbid_served_regressions
        else nothing,
        "missing": rows.filter(served=True, change=Change.MISSING)
        if policy.require_candidate_results
        else nothing,
        "slower": rows.filter(
            pk__in=[b.row_pk for b in ev.blockers if b.rule == "slower"]
        ),
    }
    for rule, matching in failing.items():
        rows.filter(blocking_rule=rule).exclude(pk__in=matching.values("pk")).update(
            blocking_rule=""
        )
        matching.exclude(blocking_rule=rule).update(blocking_rule=rule)


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
    current = revisions.current_map()
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
    for shape in Shape.objects.served():
        for dt in device_types:
            revision = current.get((shape.operator_id, dt.backend))
            if revision is None:
                continue
            for toolchain in toolchains:
                if (shape.pk, dt.pk, toolchain.pk, revision) not in fresh:
                    cells.append((shape, dt, toolchain))
    return cells


def _sweep_plan(*, cells, created_by, filters) -> Sweep:
    # Imported here: the matrix app must load without the runners app's
    # services (and their broker settings) being importable yet.
    from matrix.fleet.services import sweep_plan

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
    # The decision is on the stored diff, the one the reviewer read.
    proposal = proposal_evaluate(proposal=proposal, actor=by)
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
    proposal = proposal_evaluate(proposal=proposal, actor=by)
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
    ev = evaluate(proposal=proposal, ignoring=by)
    state = ev.state
    if state in (ProposalState.READY, ProposalState.APPROVED):
        return
    if state == ProposalState.REJECTED:
        them = "that rejection" if len(ev.rejected_by) == 1 else "those rejections"
        why = (
            "; ".join(ev.rejections)
            + f"; only {' and '.join(ev.rejected_by)} can lift {them}"
        )
    elif state == ProposalState.COLLECTING:
        why = _collecting_wait(ev.jobs)
    else:
        why = "; ".join(ev.blocking_summarised)
    raise ValidationError(
        f"cannot approve while {ProposalState(state).label.lower()}: {why}"
    )


def _collecting_wait(jobs: JobsInFlight) -> str:
    why = (
        f"wait for the {jobs_phrase(jobs.open)} still queued or running on its "
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
    proposal_evaluate(proposal=proposal, actor=by)
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
    proposal_evaluate(proposal=proposal, actor=by)
    return exception


# -- rollout --------------------------------------------------------------------


@transaction.atomic
def proposal_rollout(
    *, proposal: UpgradeProposal, by, comment: str = ""
) -> UpgradeProposal:
    """Make the approved candidate the current toolchain. Final: the diff,
    the approvals and the manifest rows are frozen as they were approved."""
    if not can_rollout(by):
        raise PermissionDenied(
            f"only members of the {Policy.current().rollout_group} group roll out "
            "an upgrade"
        )
    proposal = proposal_evaluate(proposal=proposal, actor=by)
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
    proposal_state_changed.send(
        sender=UpgradeProposal, proposal=proposal, before=before["state"], actor=by
    )
    AuditEvent.record(
        actor=by,
        verb="proposal.rollout",
        obj=proposal,
        before={**before, "current_toolchains": previous},
        after={
            **proposal.snapshot(),
            "current_toolchains": [proposal.candidate.name],
            "comment": comment,
        },
    )
    return proposal
