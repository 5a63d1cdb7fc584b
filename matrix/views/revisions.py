"""An operator's kernel revisions: which one runs on each backend, and the
reviewed revert to an earlier approved one (a preview first, then the
confirmed decision)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from matrix import revisions, submissions
from matrix.accounts.roles import is_reviewer
from matrix.gate.forms import FocusesItsError
from matrix.models import ID_MAX, Backend, KernelRevision, Operator


class RevertForm(FocusesItsError, forms.Form):
    revision = forms.IntegerField(
        min_value=1, max_value=ID_MAX, widget=forms.HiddenInput
    )
    backends = forms.MultipleChoiceField(
        choices=Backend.choices,
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "choose the backends to revert"},
    )
    comment = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": "write why you revert"},
    )
    # Absent on the first post, which answers with the preview.
    confirm = forms.BooleanField(
        required=False, label="I have read what the revert changes"
    )


def _rows(operator: Operator) -> list[dict]:
    """The operator's approved revisions, newest first, with the backends
    each covers and where it is current."""
    labels = dict(Backend.choices)
    current: dict[int, list[str]] = {}
    for backend, rev in operator.current.values_list("backend", "revision_id"):
        current.setdefault(rev, []).append(backend)
    rows = []
    for revision in (
        operator.revisions.filter(review_state=KernelRevision.Review.APPROVED)
        .defer("source")
        .select_related("author")
        .order_by("-created_at")
    ):
        covers = revisions.backends_of(revision)
        on = current.get(revision.pk, [])
        rows.append(
            {
                "revision": revision,
                "covers": [labels[b] for b in covers],
                "current_on": [labels[b] for b in Backend.values if b in on],
                "revertible": [(b, labels[b]) for b in covers if b not in on],
            }
        )
    return rows


def _page(request, operator, *, form=None, change=None, chosen=None, status=200):
    labels = dict(Backend.choices)
    current = dict(operator.current.values_list("backend", "revision__source_sha256"))
    context = {
        "operator": operator,
        "by_backend": [(labels[b], current.get(b)) for b in Backend.values],
        "rows": _rows(operator),
        "can_revert": is_reviewer(request.user),
        "form": form,
        "change": change,
        "chosen": chosen,
    }
    return render(request, "matrix/revisions.html", context, status=status)


@require_GET
def revisions_page(request, name: str):
    return _page(request, get_object_or_404(Operator, name=name))


@login_required
@require_POST
def revision_revert(request, name: str):
    operator = get_object_or_404(Operator, name=name)
    if not is_reviewer(request.user):
        raise PermissionDenied("only reviewers revert kernel revisions")
    form = RevertForm(request.POST)
    if not form.is_valid():
        return _page(request, operator, form=form, status=400)
    revision = operator.revisions.filter(
        pk=form.cleaned_data["revision"],
        review_state=KernelRevision.Review.APPROVED,
    ).first()
    if revision is None:
        form.add_error(None, "no approved revision of this operator by that id")
        return _page(request, operator, form=form, status=400)
    backends = form.cleaned_data["backends"]
    change = revisions.change_preview(revision, backends)
    if not form.cleaned_data["confirm"]:
        # The first post answers with what the revert would change.
        return _page(request, operator, form=form, change=change, chosen=revision)
    try:
        submissions.revision_revert(
            revision=revision,
            backends=backends,
            by=request.user,
            comment=form.cleaned_data["comment"],
        )
    except ValidationError as exc:
        form.add_error(None, " ".join(exc.messages))
        return _page(
            request, operator, form=form, change=change, chosen=revision, status=400
        )
    messages.success(
        request,
        f"Reverted: new jobs on {', '.join(change.backend_labels)} run "
        f"{revision.source_sha256[:12]}; {change.stale_words}, to run again.",
    )
    return redirect("operator-revisions", name=operator.name)
