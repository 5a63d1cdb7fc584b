"""Toolchain upgrade pages: proposals, the A/B diff with the gate's verdict
in words, decisions, backend exceptions, rollout and the policy."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import CharField, Q
from django.db.models.functions import Cast
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseClientRedirect, HttpResponseClientRefresh

from matrix.cache import cache_seconds, cached_read, read_key
from matrix.gate import evaluation, services
from matrix.gate.diff import CellDiff, Change, serve_floor
from matrix.gate.forms import DecisionForm, ExceptionForm, PolicyForm, ProposalForm
from matrix.gate.manifest import manifest_choice, manifest_entries, times
from matrix.gate.sustained import sustained_key, sustained_speeds, sustained_version
from matrix.models import AuditEvent, Backend
from matrix.models.gate import Approval, BackendException, Policy, UpgradeProposal
from matrix.page_cache import page_response
from matrix.refusals import Refused
from matrix.views.bisections import can_bisect, row_bisections, rows_bisections_version

# htmx stops polling on this status.
STOP_POLLING = 286


def _get_proposal_for_user(user, pk: int) -> UpgradeProposal:
    """Every signed-in user may read a proposal; what they may do is checked
    per action."""
    return get_object_or_404(
        UpgradeProposal.objects.select_related(
            "baseline", "candidate", "proposer", "policy"
        ),
        pk=pk,
    )


def _refusal(request, exc: ValidationError | PermissionDenied) -> None:
    text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
    messages.error(request, text)


@login_required
@require_GET
def upgrades_page(request):
    proposals = UpgradeProposal.objects.select_related(
        "baseline", "candidate", "proposer"
    ).prefetch_related("device_types")
    return render(
        request,
        "gate/list.html",
        {
            "proposals": proposals,
            "policy": Policy.current(),
            "can_propose": services.can_propose(request.user),
            "can_edit_policy": services.can_edit_policy(request.user),
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def upgrade_new(request):
    if not services.can_propose(request.user):
        raise PermissionDenied("you need the propose permission")
    form = ProposalForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            proposal = services.proposal_open(
                baseline=form.cleaned_data["baseline"],
                candidate=form.cleaned_data["candidate"],
                device_types=form.cleaned_data["device_types"],
                note=form.cleaned_data["note"],
                by=request.user,
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("upgrade", pk=proposal.pk)
    context = {
        "form": form,
        # Empty choices say why: toolchains and device types arrive with
        # the runner hosts that register them.
        "toolchain_count": form.fields["baseline"].queryset.count(),
        "no_device_types": not form.fields["device_types"].queryset.exists(),
    }
    return render(request, "gate/new.html", context)


@login_required
@require_GET
@vary_on_headers("HX-Request", "HX-Target")
def upgrade_page(request, pk: int):
    proposal = _get_proposal_for_user(request.user, pk)
    if request.htmx and request.htmx.target == "diff-rows":
        return HttpResponse(_diff_rows_html(request, proposal, Policy.current()))
    if request.htmx:
        # The gate status polls while collecting or while a re-evaluation
        # is pending; once one has stored a new diff, the whole page reloads.
        if request.GET.get("evaluated", _evaluated(proposal)) != _evaluated(proposal):
            return HttpResponseClientRefresh()
        context = _detail_context(request, proposal, rows=False)
        response = render(request, "gate/detail.html#gate-status", context)
        if not context["polling"]:
            response.status_code = STOP_POLLING
        return response
    policy = Policy.current()
    reviewer = services.is_reviewer(request.user, policy)
    key = None
    if not any(k in request.GET for k in ROWS_QUERY) and not _acts_on(
        request.user, proposal, policy, reviewer=reviewer
    ):
        key = read_key(
            "upgrade-page", proposal.pk, version=_page_version(proposal, policy)
        )
    return page_response(
        request,
        key,
        lambda frame: render_to_string(
            "gate/detail.html",
            {
                **_detail_context(request, proposal, policy=policy, reviewer=reviewer),
                **frame,
            },
            request,
        ),
    )


def _acts_on(
    user, proposal: UpgradeProposal, policy: Policy, *, reviewer: bool
) -> bool:
    """Whether the page offers ``user`` anything to do (decide, grant or
    sign off an exception, re-evaluate, roll out, edit the policy, bisect
    a row): a page
    that offers nothing is the same for every such reader."""
    return (
        reviewer
        or user.pk == proposal.proposer_id
        or services.can_edit_policy(user)
        or (_bisectable(proposal) and can_bisect(user))
        or any(
            user.get_username() in owners for owners in policy.backend_owners.values()
        )
    )


def _page_version(proposal: UpgradeProposal, policy: Policy) -> tuple:
    """What the page of a reader who cannot act shows moves with: the
    proposal's state and stored diff, the policy, the speeds kept at the
    power cap, its jobs in flight, and every audited change (a decision, an
    exception granted or signed off, a rollout, an edit in the admin)."""
    jobs_key, _ = evaluation.proposal_jobs_key(proposal=proposal)
    newest_event = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True)[:1]
    return (
        proposal.state,
        proposal.diff_digest,
        proposal.diff_computed_at,
        proposal.evaluated_at,
        proposal.reevaluation_requested_at,
        proposal.approved_at,
        proposal.rolled_out_at,
        policy.pk,
        policy.version,
        sustained_version(toolchain_id=proposal.candidate_id),
        jobs_key,
        list(newest_event),
    )


def _evaluated(proposal: UpgradeProposal) -> str:
    """When the proposal was last evaluated, as the page carries it."""
    when = proposal.evaluated_at
    return when.isoformat() if when else ""


CHANGES = [(c, Change.LABELS[c]) for c in Change.ORDER]


class RowFilter:
    """The diff rows a page lists: changed rows first, then by the diff's
    order; narrowed by change, operator, backend, or to the cells that
    block under the policy. A value the diff does not have narrows to
    nothing rather than being ignored."""

    KEYS = ("change", "operator", "backend", "blocking")

    def __init__(self, query):
        self.values = {key: query.get(key, "") for key in self.KEYS}
        self.values["blocking"] = "1" if self.values["blocking"] == "1" else ""

    def apply(self, rows):
        change, operator, backend, blocking = (self.values[k] for k in self.KEYS)
        if change:
            rows = rows.filter(change=change)
        if operator:
            rows = rows.filter(operator=operator)
        if backend:
            rows = rows.filter(backend=backend)
        if blocking:
            rows = rows.blocking()
        return rows

    @property
    def active(self) -> bool:
        return any(self.values.values())

    def count_in(self, summary: dict) -> int | None:
        """How many rows a single filter lists, from the counts stored with
        the diff; None where they do not say (two filters at once)."""
        given = [key for key in self.KEYS if self.values[key]]
        if not given:
            return summary.get("cells")
        if len(given) > 1:
            return None
        key = given[0]
        value = self.values[key]
        if key == "blocking":
            return summary.get("blocking")
        if key == "change":
            return summary.get(value, 0) if value in Change.LABELS else 0
        return (summary.get(f"by_{key}") or {}).get(value, {}).get("cells", 0)

    @property
    def encoded(self) -> str:
        """The filters as a query string, for the pages of the same list."""
        return urlencode({k: v for k, v in self.values.items() if v})


def _rows_context(request, proposal: UpgradeProposal, policy: Policy) -> dict:
    """One page of the stored diff's rows, with what the manifest would
    serve for each under the policy."""
    rows_filter = RowFilter(request.GET)
    rows = rows_filter.apply(proposal.diff_rows.only(*ROW_COLUMNS))
    count = rows_filter.count_in(proposal.summary or {})
    if count is None:
        count = rows.count()
    page = RowsPage.of(rows, count=count, query=request.GET)
    candidate = proposal.candidate.name
    sustained = sustained_speeds(toolchain=proposal.candidate)
    for row in page.rows:
        row.serves = manifest_choice(
            CellDiff.from_row(row),
            toolchain=candidate,
            speed_budget=policy.speed_budget,
            sustained=sustained.get(sustained_key(row)),
        )
        row.speed_shown = (
            ""
            if row.speed is None
            else times(row.speed, serve_floor(policy.speed_budget))
        )
    bisectable = _bisectable(proposal)
    if bisectable:
        row_bisections(proposal, page.rows)
    return {
        "rows_page": page,
        "rows_filter": rows_filter,
        "changes": CHANGES,
        "can_bisect": bisectable and can_bisect(request.user),
    }


def _bisectable(proposal: UpgradeProposal) -> bool:
    """Whether a row of the diff passes on one side and fails on the other:
    only those offer Bisect (and link their bisections). A diff without
    one costs no query for either."""
    summary = proposal.summary or {}
    return bool(summary.get(Change.GREEN_TO_RED) or summary.get(Change.RED_TO_GREEN))


# The query keys that choose which rows a page lists.
ROWS_QUERY = (*RowFilter.KEYS, "after", "before", "start", "last")


def _diff_rows_html(request, proposal: UpgradeProposal, policy: Policy) -> str:
    """The page of diff rows, rendered. The first page unfiltered, which
    every view of the proposal opens on, is kept for every reader until the
    stored diff, its evaluation, the policy or the power-cap speeds change:
    fifty rows were most of a view (a reviewer's page polls while the gate
    collects). A filtered or later page, whose values a visitor makes up,
    is rendered for its request."""

    def rows_html() -> str:
        return render_to_string(
            "gate/detail.html#diff-rows",
            {"proposal": proposal, **_rows_context(request, proposal, policy)},
        )

    if not cache_seconds() or any(k in request.GET for k in ROWS_QUERY):
        return rows_html()
    key = read_key(
        "proposal-rows",
        proposal.pk,
        proposal.diff_digest,
        proposal.diff_computed_at,
        proposal.evaluated_at,
        policy.version,
        sustained_version(toolchain_id=proposal.candidate_id),
        # A row offers Bisect to those who may, and links its bisections.
        (can_bisect(request.user), rows_bisections_version(proposal))
        if _bisectable(proposal)
        else (),
    )
    return mark_safe(cached_read(key, rows_html, cache_seconds()))  # noqa: S308  rendered here


@dataclass
class RowsPage:
    """Rows in ``sort_key`` order (changed first), a page going on from a
    cursor: ``after=KEY`` the rows after that one, ``before=KEY`` those
    before it, ``last=1`` the last page, none the first. Rows are never
    skipped by an offset, so a late page costs what the first does;
    ``start`` only numbers the rows shown."""

    rows: list
    count: int
    start: int
    has_previous: bool
    has_next: bool

    @classmethod
    def of(cls, rows, *, count: int, query) -> RowsPage:
        size = ROWS_PER_PAGE
        after, before = _cursor(query.get("after")), _cursor(query.get("before"))
        start = _cursor(query.get("start")) or 1
        if after is not None:
            shown = list(
                rows.filter(sort_key__gt=after).order_by("sort_key")[: size + 1]
            )
            return cls(shown[:size], count, start, True, len(shown) > size)
        if before is not None:
            shown = list(
                rows.filter(sort_key__lt=before).order_by("-sort_key")[: size + 1]
            )
            earlier = len(shown) > size
            return cls(
                shown[:size][::-1], count, start if earlier else 1, earlier, True
            )
        if query.get("last") == "1":
            shown = list(rows.order_by("-sort_key")[:size])[::-1]
            return cls(shown, count, count - len(shown) + 1, count > len(shown), False)
        shown = list(rows.order_by("sort_key")[: size + 1])
        return cls(shown[:size], count, 1, False, len(shown) > size)

    @property
    def end(self) -> int:
        return self.start + len(self.rows) - 1

    @property
    def next_start(self) -> int:
        return self.end + 1

    @property
    def previous_start(self) -> int:
        return max(1, self.start - ROWS_PER_PAGE)


def _cursor(value) -> int | None:
    """A sort key or row number given in the query; anything else none."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


# The columns the rows list shows or the manifest preview reads.
ROW_COLUMNS = [
    "id",
    "proposal_id",
    "shape_id",
    "device_type_id",
    "rank",
    "position",
    "sort_key",
    *(
        name
        for name in CellDiff.__dataclass_fields__
        if name not in ("shape_id", "device_type_id", "device_type")
    ),
    "device_type_label",
    "perf_step",
    "blocking_rule",
]
ROWS_PER_PAGE = 50


def _detail_context(
    request,
    proposal: UpgradeProposal,
    *,
    decision_form=None,
    exception_form=None,
    rows=True,
    policy: Policy | None = None,
    reviewer: bool | None = None,
) -> dict:
    """The page's context, read from the stored diff; a form passed in is a
    bound one that failed, shown again with its errors and what the user
    typed. ``rows``: with the page of diff rows (not for the gate status
    alone)."""
    policy = policy or Policy.current()
    if reviewer is None:
        reviewer = services.is_reviewer(request.user, policy)
    is_proposer = request.user.pk == proposal.proposer_id
    jobs = services.proposal_jobs_in_flight_read(proposal=proposal)
    summary = proposal.summary or {}
    collecting = proposal.state == UpgradeProposal.State.COLLECTING
    device_types = list(proposal.device_types.all())
    exceptions = list(proposal.exceptions.select_related("granted_by", "signed_off_by"))
    return {
        "proposal": proposal,
        "polling": collecting or proposal.reevaluation_pending,
        "evaluated": _evaluated(proposal),
        "reasons": proposal.blocking_reasons or [],
        "blocking_count": summary.get("blocking", 0),
        "missing_not_required": 0
        if policy.require_candidate_results
        else summary.get("served_missing", 0),
        "device_types": device_types,
        "summary": summary,
        "by_operator": sorted((summary.get("by_operator") or {}).items()),
        "by_backend": sorted((summary.get("by_backend") or {}).items()),
        "diff_rows_html": _diff_rows_html(request, proposal, policy) if rows else "",
        "changes": CHANGES,
        "approvals": proposal.approvals.select_related("reviewer"),
        "exceptions": exceptions,
        "events": _proposal_events(proposal),
        "policy": policy,
        # The speed the manifest asks of a passing candidate, as it applies
        # it (CellDiff.slower_than_reference): the measured speed decides.
        "serve_floor": serve_floor(policy.speed_budget),
        "reject_withdraws": _manifest_withdrawn(proposal, approving=False),
        "approve_publishes": _manifest_published(proposal, request.user)
        if reviewer and not is_proposer
        else "",
        "jobs": jobs,
        "hosted": jobs.hosted if jobs.stalled else [],
        "can_decide": reviewer and not is_proposer,
        "can_grant_exception": reviewer and not is_proposer,
        "is_proposer": is_proposer,
        "can_rollout": proposal.state == UpgradeProposal.State.APPROVED
        and services.can_rollout(request.user),
        "decision_form": decision_form or DecisionForm(),
        "exception_form": exception_form
        or _exception_form(proposal, device_types=device_types, exceptions=exceptions),
        "is_reviewer": reviewer,
        "can_reevaluate": reviewer
        or is_proposer
        or services.can_edit_policy(request.user),
        "can_edit_policy": services.can_edit_policy(request.user),
        "ownerless_backends": [
            backend for backend in Backend.values if not policy.owners_of(backend)
        ],
        "owned_backends": [
            backend
            for backend, owners in policy.backend_owners.items()
            if request.user.get_username() in owners
        ],
    }


def _proposal_events(proposal: UpgradeProposal):
    """The proposal's trail, with the events recorded on its decisions
    (voided) and exceptions (granted, signed off) rather than on it."""

    def ids(related):
        return related.annotate(key=Cast("pk", CharField())).values("key")

    return AuditEvent.objects.filter(
        Q(object_type=UpgradeProposal._meta.label_lower, object_id=str(proposal.pk))
        | Q(
            object_type=Approval._meta.label_lower,
            object_id__in=ids(proposal.approvals),
        )
        | Q(
            object_type=BackendException._meta.label_lower,
            object_id__in=ids(proposal.exceptions),
        )
    )


def _exception_form(
    proposal: UpgradeProposal, data=None, *, device_types=None, exceptions=None
) -> ExceptionForm:
    """``device_types`` and ``exceptions``: the proposal's, where the page
    has read them already."""
    if device_types is None:
        device_types = proposal.device_types.all()
    backends = {dt.backend for dt in device_types}
    if data is None:
        # Offer only what can still be granted; a posted backend is checked
        # by the service, which says why a second exception is refused.
        if exceptions is None:
            exceptions = proposal.exceptions.all()
        backends -= {e.backend for e in exceptions}
    return ExceptionForm(data, backends=backends)


def _back_to_proposal(request, proposal: UpgradeProposal):
    """After an action that worked: the whole page again, since it changes
    the gate status, the decisions and the audit trail alike."""
    url = reverse("upgrade", args=[proposal.pk])
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect(url)


def _form_again(request, proposal: UpgradeProposal, partial: str, **forms):
    """A refused form with its errors and the text typed into it: the form's
    partial for htmx, which swaps it in place, else the whole page."""
    template = "gate/detail.html"
    if request.htmx:
        template += f"#{partial}"
    return render(request, template, _detail_context(request, proposal, **forms))


@login_required
@require_POST
@vary_on_headers("HX-Request")
def upgrade_decide(request, pk: int):
    proposal = _get_proposal_for_user(request.user, pk)
    if request.user.pk == proposal.proposer_id:
        raise Refused(
            "You proposed this upgrade, so your decision cannot count: "
            "another reviewer approves or rejects it"
        )
    if not services.is_reviewer(request.user):
        raise PermissionDenied("only reviewers decide on upgrades")
    form = DecisionForm(request.POST)
    if form.is_valid():
        approving = form.cleaned_data["decision"] == "approve"
        withdrawn = _manifest_withdrawn(proposal, approving)
        published = _manifest_published(proposal, request.user) if approving else ""
        if (withdrawn or published) and not form.cleaned_data["confirm"]:
            form.add_error(
                "confirm", f"{withdrawn or published} Tick the box to confirm."
            )
            return _form_again(request, proposal, "decision-form", decision_form=form)
        decide = services.proposal_approve if approving else services.proposal_reject
        try:
            decide(
                proposal=proposal, by=request.user, comment=form.cleaned_data["comment"]
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, _decision_said(proposal, approving, withdrawn))
            return _back_to_proposal(request, proposal)
    return _form_again(request, proposal, "decision-form", decision_form=form)


def _manifest_withdrawn(proposal: UpgradeProposal, approving: bool) -> str:
    """What rejecting an approved proposal does to production, in words; ""
    for a decision that withdraws nothing."""
    if approving or proposal.state != UpgradeProposal.State.APPROVED:
        return ""
    entries = proposal.manifest_entries.count()
    return (
        f"Rejecting it withdraws its manifest: {proposal.candidate.name} goes from "
        f"{entries} entries to 0, and production reading it serves the reference "
        "everywhere."
    )


def _manifest_published(proposal: UpgradeProposal, user) -> str:
    """What approving does to production where this approval is the last
    the policy asks for, in words; "" where it publishes nothing."""
    if proposal.state != UpgradeProposal.State.READY:
        return ""
    policy = Policy.current()
    # Counted as the gate counts them (matrix.gate.evaluation).
    others = (
        proposal.approvals.filter(
            voided=False,
            decision=Approval.Decision.APPROVE,
            diff_digest=proposal.diff_digest,
            reviewer__groups__name=policy.reviewer_group,
        )
        .exclude(reviewer=user)
        .exclude(reviewer_id=proposal.proposer_id)
        .count()
    )
    if others + 1 < policy.required_approvals:
        return ""
    entries = manifest_entries(proposal=proposal, policy=policy)
    tilelang = sum(e.choice == "tilelang" for e in entries)
    return (
        f"Approving publishes the manifest for {proposal.candidate.name}: "
        f"{len(entries)} entries, {tilelang} serving TileLang and "
        f"{len(entries) - tilelang} the reference; production hosts reading it "
        "switch at their next read."
    )


def _decision_said(proposal: UpgradeProposal, approving: bool, withdrawn: str) -> str:
    """What a decision did, for the page it returns to."""
    proposal.refresh_from_db()
    if withdrawn:
        return f"Rejected. The manifest for {proposal.candidate.name} is withdrawn."
    if not approving:
        return f"Rejected: the proposal is {proposal.get_state_display().lower()}."
    if proposal.state == UpgradeProposal.State.APPROVED:
        entries = proposal.manifest_entries
        tilelang = entries.filter(choice="tilelang").count()
        return (
            f"Approved. The manifest for {proposal.candidate.name} has "
            f"{entries.count()} entries, {tilelang} serving TileLang."
        )
    return (
        "Your approval is recorded; the proposal is "
        f"{proposal.get_state_display().lower()}."
    )


@login_required
@require_POST
def upgrade_reevaluate(request, pk: int):
    proposal = _get_proposal_for_user(request.user, pk)
    if not (
        request.user.pk == proposal.proposer_id
        or services.is_reviewer(request.user)
        or services.can_edit_policy(request.user)
    ):
        raise PermissionDenied("only the proposer, reviewers and admins re-evaluate")
    # In the background, as results ask for it: computing a large diff here
    # would hold the proposal, and the ingest of its results, meanwhile.
    services.proposal_reevaluation_ask(proposal=proposal)
    messages.info(
        request, "Re-evaluation requested: this page updates when it is done."
    )
    return redirect("upgrade", pk=pk)


@login_required
@require_POST
def upgrade_rollout(request, pk: int):
    """Final, so asked for twice: the button's form carries a confirmation
    box that says what changes."""
    proposal = _get_proposal_for_user(request.user, pk)
    if not services.can_rollout(request.user):
        raise PermissionDenied(
            f"only members of the {Policy.current().rollout_group} group roll out "
            "an upgrade"
        )
    comment = request.POST.get("comment", "").strip()
    if request.POST.get("confirm") != "on" or not comment:
        messages.error(
            request,
            "Not rolled out: write why, and tick the box that says what rolling "
            "out changes.",
        )
        return redirect("upgrade", pk=pk)
    try:
        services.proposal_rollout(proposal=proposal, by=request.user, comment=comment)
    except ValidationError as exc:
        _refusal(request, exc)
    else:
        messages.success(
            request,
            f"Rolled out: {proposal.candidate.name} is the current toolchain.",
        )
    return redirect("upgrade", pk=pk)


@login_required
@require_POST
@vary_on_headers("HX-Request")
def upgrade_exception(request, pk: int):
    proposal = _get_proposal_for_user(request.user, pk)
    if request.user.pk == proposal.proposer_id:
        raise Refused(
            "You proposed this upgrade, so another reviewer grants any exception to it"
        )
    if not services.is_reviewer(request.user):
        raise PermissionDenied("only reviewers grant exceptions")
    form = _exception_form(proposal, request.POST)
    if form.is_valid():
        try:
            services.exception_grant(
                proposal=proposal,
                backend=form.cleaned_data["backend"],
                reason=form.cleaned_data["reason"],
                by=request.user,
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return _back_to_proposal(request, proposal)
    return _form_again(request, proposal, "exception-form", exception_form=form)


@login_required
@require_POST
def exception_sign_off(request, pk: int):
    exception = get_object_or_404(BackendException, pk=pk)
    if request.user.get_username() not in Policy.current().owners_of(exception.backend):
        raise PermissionDenied(f"only an owner of {exception.backend} signs off")
    try:
        services.exception_sign_off(exception=exception, by=request.user)
    except ValidationError as exc:
        _refusal(request, exc)
    return redirect("upgrade", pk=exception.proposal_id)


@login_required
@require_http_methods(["GET", "POST"])
def policy_page(request):
    if not services.can_edit_policy(request.user):
        raise PermissionDenied("only admins edit the upgrade policy")
    current = Policy.current()
    form = PolicyForm(request.POST or None, instance=current)
    if request.method == "POST" and form.is_valid():
        changes = {name: form.cleaned_data[name] for name in PolicyForm.Meta.fields}
        try:
            policy = services.policy_save(by=request.user, **changes)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"saved policy v{policy.version}")
            return redirect("upgrade-policy")
    return render(
        request,
        "gate/policy.html",
        {"form": form, "policy": current, "history": Policy.objects.all()[:20]},
    )
