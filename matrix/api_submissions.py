"""Kernel submissions over the API: POST /api/v1/kernels (a kernel author's
session; CSRF applies as on the page), read one, review one."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from ninja import Field, Router, Schema, Status
from ninja.security import django_auth

from matrix import revisions, submissions
from matrix.accounts.roles import has_role
from matrix.models import ID_MAX, KernelRevision, Operator

router = Router(tags=["kernels"], auth=django_auth)


class KernelIn(Schema):
    # Operator names are slugs; NUL characters are refused up front because
    # PostgreSQL cannot store them in text (found by the API fuzzing).
    operator: str = Field(pattern=r"^[-a-zA-Z0-9_]{1,60}$")
    source: str = Field(pattern=r"^[^\x00]*$")
    # What approving it changes: these backends' current revision, only.
    backends: list[str] = Field(min_length=1, max_length=8)


class KernelOut(Schema):
    id: int
    operator: str
    source_sha256: str
    review_state: str
    is_current: bool
    backends: list[str]
    current_on: list[str]
    author: str | None


class ReviewIn(Schema):
    decision: str
    comment: str = Field("", max_length=2000, pattern=r"^[^\x00]*$")


class RevertIn(Schema):
    backends: list[str] = Field(min_length=1, max_length=8)
    comment: str = Field(min_length=1, max_length=2000, pattern=r"^[^\x00]*$")


class Refused(Schema):
    detail: str
    reasons: list[str] = []


def _out(revision: KernelRevision) -> dict:
    return {
        "id": revision.pk,
        "operator": revision.operator.name,
        "source_sha256": revision.source_sha256,
        "review_state": revision.review_state,
        "is_current": revision.is_current,
        "backends": revisions.backends_of(revision),
        "current_on": sorted(revision.current_on.values_list("backend", flat=True)),
        "author": revision.author.get_username() if revision.author else None,
    }


def _visible(request, pk: int) -> KernelRevision:
    """The submission ``pk`` as the user may read it: none for an account
    with no role, which the pages let read nothing (hidden, as another
    author's pending submission is); then the submissions' own rule."""
    anyone = getattr(settings, "TILEMATRIX_ANONYMOUS_READ", False)
    if not (anyone or has_role(request.user)) or not 0 < pk <= ID_MAX:
        raise Http404("no such submission")
    try:
        return submissions.visible_submissions(request.user).get(pk=pk)
    except KernelRevision.DoesNotExist:
        raise Http404("no such submission") from None


@router.post(
    "/kernels",
    response={201: KernelOut, 400: Refused, 403: Refused, 404: Refused},
    summary="Submit a kernel revision for review",
)
def kernel_create(request, body: KernelIn):
    """Store the source with its sha256 as a pending revision; it runs nowhere
    until a reviewer other than its author approves it."""
    if not submissions.can_submit(request.user):
        return Status(
            403, {"detail": "submitting kernels needs the kernel author role"}
        )
    operator = Operator.objects.filter(name=body.operator).first()
    if operator is None:
        return Status(404, {"detail": f"no operator {body.operator!r}"})
    try:
        revision = submissions.kernel_submit(
            operator=operator,
            source=body.source,
            author=request.user,
            backends=body.backends,
        )
    except PermissionDenied as exc:
        return Status(403, {"detail": str(exc)})
    except ValidationError as exc:
        return Status(
            400, {"detail": "the source was refused", "reasons": exc.messages}
        )
    return Status(201, _out(revision))


@router.get("/kernels/{pk}", response={200: KernelOut, 404: Refused})
def kernel_read(request, pk: int):
    return Status(200, _out(_visible(request, pk)))


@router.post(
    "/kernels/{pk}/review",
    response={200: KernelOut, 400: Refused, 403: Refused, 404: Refused, 409: Refused},
)
def kernel_review(request, pk: int, body: ReviewIn):
    """Approve or reject a pending submission (reviewers, never its author)."""
    revision = _visible(request, pk)
    if revision.author_id == request.user.pk:
        return Status(403, {"detail": "the author cannot review their own submission"})
    if not submissions.can_review(request.user, revision):
        return Status(403, {"detail": "only reviewers review submissions"})
    if body.decision not in ("approve", "reject"):
        return Status(400, {"detail": "decision must be approve or reject"})
    try:
        revision = submissions.kernel_review(
            revision=revision,
            by=request.user,
            approve=body.decision == "approve",
            comment=body.comment,
        )
    except PermissionDenied as exc:
        return Status(403, {"detail": str(exc)})
    except ValidationError as exc:
        return Status(409, {"detail": " ".join(exc.messages)})
    return Status(200, _out(revision))


@router.post(
    "/kernels/{pk}/revert",
    response={200: KernelOut, 400: Refused, 403: Refused, 404: Refused},
    summary="Make an approved revision current again on some backends",
)
def kernel_revert(request, pk: int, body: RevertIn):
    """A reviewer's revert, with its reason; audited as ``revision.revert``."""
    if not submissions.is_reviewer(request.user):
        return Status(403, {"detail": "only reviewers revert kernel revisions"})
    if not 0 < pk <= ID_MAX:
        raise Http404("no such revision")
    revision = KernelRevision.objects.filter(pk=pk).first()
    if revision is None:
        raise Http404("no such revision")
    try:
        submissions.revision_revert(
            revision=revision,
            backends=body.backends,
            by=request.user,
            comment=body.comment,
        )
    except ValidationError as exc:
        return Status(400, {"detail": " ".join(exc.messages)})
    revision.refresh_from_db()
    return Status(200, _out(revision))
