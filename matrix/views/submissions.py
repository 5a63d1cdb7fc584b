"""Kernel submissions: list, submit, read with its diff, review."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from matrix import revisions, submissions
from matrix.gate.forms import FocusesItsError
from matrix.models import Backend, KernelRevision, Operator
from matrix.refusals import Refused
from runners.harness.precheck import precheck


class SubmissionForm(FocusesItsError, forms.Form):
    operator = forms.ModelChoiceField(
        queryset=Operator.objects.order_by("name"), to_field_name="name"
    )
    # No default: approving changes what these backends run, and only these.
    backends = forms.MultipleChoiceField(
        choices=Backend.choices,
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "choose the backends the kernel covers"},
        help_text="Approved, it runs on these backends' device types; the "
        "library's revision stays current on the others.",
    )
    source = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 24, "spellcheck": "false"}),
        max_length=submissions.SOURCE_CAP,
        strip=False,
        help_text="A Python module defining program(shape, dtype, target) that "
        "returns a TileLang prim_func; it may import tilelang only.",
    )

    def clean_source(self):
        # Said whatever else the form lacks; kernel_submit checks it again.
        source = self.cleaned_data["source"]
        refusals = precheck(source.replace("\r\n", "\n"))
        if refusals:
            raise forms.ValidationError([str(r) for r in refusals])
        return source


class ReviewForm(FocusesItsError, forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": "write a comment: it explains the decision"},
    )
    # An approval changes what production's jobs run: asked for below.
    confirm = forms.BooleanField(
        required=False, label="I have read what approving changes"
    )

    def clean(self):
        data = super().clean()
        if data.get("decision") == "approve" and not data.get("confirm"):
            self.add_error("confirm", "tick the box: approving changes what runs")
        return data


def _get_submission_for_user(request, pk: int) -> KernelRevision:
    try:
        return submissions.visible_submissions(request.user).get(pk=pk)
    except KernelRevision.DoesNotExist:
        raise Http404("no such submission") from None


@require_GET
def submissions_page(request):
    # The list shows no source: each is up to 64 KB.
    rows = (
        submissions.visible_submissions(request.user)
        .defer("source")
        .order_by("-created_at")
    )
    context = {"rows": rows[:200], "can_submit": submissions.can_submit(request.user)}
    return render(request, "submissions/list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def submission_new(request):
    if not submissions.can_submit(request.user):
        raise PermissionDenied("submitting kernels needs the kernel author role")
    form = SubmissionForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            revision = submissions.kernel_submit(
                operator=form.cleaned_data["operator"],
                source=form.cleaned_data["source"],
                author=request.user,
                backends=form.cleaned_data["backends"],
            )
        except ValidationError as exc:
            for message in exc.messages:
                form.add_error("source", message)
        else:
            messages.success(
                request, "Submitted; it runs once another reviewer approves it."
            )
            return redirect("submission", pk=revision.pk)
    status = 400 if request.method == "POST" else 200
    context = {"form": form, "no_operators": not Operator.objects.exists()}
    return render(request, "submissions/new.html", context, status=status)


@require_GET
def submission_page(request, pk: int):
    revision = _get_submission_for_user(request, pk)
    return _detail(request, revision, ReviewForm())


def _detail(request, revision: KernelRevision, form, status: int = 200):
    base = submissions.diff_base(revision)
    pending = revision.review_state == KernelRevision.Review.PENDING
    can_review = pending and submissions.can_review(request.user, revision)
    context = {
        "revision": revision,
        "covers": revision_labels(revision),
        "current_on": _labels_of(revision.current_on.values_list("backend", flat=True)),
        "base": base,
        "base_current": base is not None
        and submissions.is_current_beside(base, revision),
        "diff": submissions.revision_diff(revision, base),
        "can_review": can_review,
        "change": revisions.change_preview(revision, revisions.backends_of(revision))
        if can_review
        else None,
        "own_pending": pending and revision.author_id == request.user.pk,
        "form": form,
    }
    return render(request, "submissions/detail.html", context, status=status)


def revision_labels(revision: KernelRevision) -> list[str]:
    return _labels_of(revisions.backends_of(revision))


def _labels_of(backends) -> list[str]:
    """Backends' names, in the choices' order."""
    chosen = set(backends)
    return [label for value, label in Backend.choices if value in chosen]


@login_required
@require_POST
def submission_review(request, pk: int):
    revision = _get_submission_for_user(request, pk)
    if revision.author_id == request.user.pk:
        raise Refused(
            "You wrote this submission, so another reviewer approves or rejects it"
        )
    if not submissions.can_review(request.user, revision):
        raise PermissionDenied("only reviewers review submissions")
    form = ReviewForm(request.POST)
    if not form.is_valid():
        return _detail(request, revision, form, status=400)
    approve = form.cleaned_data["decision"] == "approve"
    change = revisions.change_preview(revision, revisions.backends_of(revision))
    try:
        submissions.kernel_review(
            revision=revision,
            by=request.user,
            approve=approve,
            comment=form.cleaned_data["comment"],
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(
            request,
            f"Approved: new jobs on {', '.join(revision_labels(revision))} run it; "
            f"{change.stale_words}. "
            "The library's revision stays current on the other backends."
            if approve
            else "Rejected: it never runs.",
        )
    return redirect("submission", pk=revision.pk)
