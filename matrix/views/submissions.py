"""Kernel submissions: list, submit, read with its diff, review."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from matrix import submissions
from matrix.gate.forms import FocusesItsError
from matrix.models import KernelRevision, Operator
from matrix.refusals import Refused


class SubmissionForm(FocusesItsError, forms.Form):
    operator = forms.ModelChoiceField(
        queryset=Operator.objects.order_by("name"), to_field_name="name"
    )
    source = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 24, "spellcheck": "false"}),
        max_length=submissions.SOURCE_CAP,
        strip=False,
        help_text="A Python module defining program(shape, dtype, target) that "
        "returns a TileLang prim_func; it may import tilelang only.",
    )


class ReviewForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])


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
    base = submissions.diff_base(revision)
    pending = revision.review_state == KernelRevision.Review.PENDING
    context = {
        "revision": revision,
        "base": base,
        "diff": submissions.revision_diff(revision, base),
        "can_review": pending and submissions.can_review(request.user, revision),
        "own_pending": pending and revision.author_id == request.user.pk,
        "form": ReviewForm(),
    }
    return render(request, "submissions/detail.html", context)


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
        return HttpResponseBadRequest("decision must be approve or reject")
    try:
        submissions.kernel_review(
            revision=revision,
            by=request.user,
            approve=form.cleaned_data["decision"] == "approve",
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(
            request,
            "Approved: it is the operator's current revision, and new jobs run it."
            if form.cleaned_data["decision"] == "approve"
            else "Rejected: it never runs.",
        )
    return redirect("submission", pk=revision.pk)
