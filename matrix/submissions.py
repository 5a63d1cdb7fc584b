"""Kernel submissions: a kernel author submits a TileLang source for an
operator; a reviewer other than the author approves or rejects it. Until it
is approved it runs nowhere (the planner only plans approved current
revisions); approved, it becomes the operator's current revision on the backends it
names (``matrix.revisions``; the library's stays current elsewhere) and runs in
sandboxes only (its jobs carry its text and hash, see ``matrix.fleet.services``).

These are the workflows; the views and the API call them and nothing else.
"""

from __future__ import annotations

import difflib
import hashlib

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q

from matrix import revisions
from matrix.accounts.roles import is_reviewer
from matrix.models import AuditEvent, Backend, KernelRevision, Operator
from runners.harness.precheck import precheck
from runners.kernels.revision import operator_module

SOURCE_CAP = 128 * 1024


def can_submit(user) -> bool:
    return user.is_authenticated and user.has_perm("matrix.add_kernelrevision")


def can_review(user, revision: KernelRevision) -> bool:
    return is_reviewer(user) and revision.author_id != user.pk


def visible_submissions(user):
    """Submissions a user may read: reviewers and admins see all, an author
    sees their own, a viewer sees the approved ones."""
    submitted = KernelRevision.objects.filter(
        origin=KernelRevision.Origin.SUBMITTED
    ).select_related("operator", "author")
    if is_reviewer(user):
        return submitted
    return submitted.filter(
        Q(review_state=KernelRevision.Review.APPROVED) | Q(author_id=user.pk)
    )


def clean_backends(backends) -> list[str]:
    """The backends a submission covers, known and in a fixed order."""
    if not isinstance(backends, list | tuple) or not backends:
        raise ValidationError(
            f"name the backends the kernel covers, of {', '.join(Backend.values)}"
        )
    unknown = sorted({str(b) for b in backends} - set(Backend.values))
    if unknown:
        raise ValidationError(
            f"unknown backends {', '.join(unknown)}; "
            f"expected some of {', '.join(Backend.values)}"
        )
    return [b for b in Backend.values if b in backends]


def kernel_submit(
    *, operator: Operator, source: str, author, backends
) -> KernelRevision:
    """Store a pending submitted revision for ``backends``, or raise
    PermissionDenied / ValidationError (the pre-check's reasons, one per
    message)."""
    if not can_submit(author):
        raise PermissionDenied("submitting kernels needs the kernel author role")
    backends = clean_backends(backends)
    source = source.replace("\r\n", "\n")
    if not source.strip():
        raise ValidationError("the source is empty")
    if len(source.encode()) > SOURCE_CAP:
        raise ValidationError(f"the source is over {SOURCE_CAP // 1024} KB")
    refusals = precheck(source)
    if refusals:
        raise ValidationError([str(r) for r in refusals])
    digest = hashlib.sha256(source.encode()).hexdigest()
    with transaction.atomic():
        existing = KernelRevision.objects.filter(
            operator=operator, source_sha256=digest
        ).first()
        if existing is not None:
            raise ValidationError(
                f"this exact source is already revision {digest[:12]} "
                f"({existing.get_review_state_display()})"
            )
        return KernelRevision.objects.create(
            operator=operator,
            source=source,
            source_sha256=digest,
            origin=KernelRevision.Origin.SUBMITTED,
            review_state=KernelRevision.Review.PENDING,
            is_current=False,
            backends=backends,
            author=author,
        )


def kernel_review(
    *, revision: KernelRevision, by, approve: bool, comment: str = ""
) -> KernelRevision:
    """Approve (the revision becomes current on the backends it covers, and
    there only) or reject a pending submission. The author never reviews
    their own."""
    if not is_reviewer(by):
        raise PermissionDenied("only reviewers review submissions")
    if revision.author_id == by.pk:
        raise PermissionDenied("the author cannot review their own submission")
    state = (
        KernelRevision.Review.APPROVED if approve else KernelRevision.Review.REJECTED
    )
    with transaction.atomic():
        claimed = KernelRevision.objects.filter(
            pk=revision.pk,
            origin=KernelRevision.Origin.SUBMITTED,
            review_state=KernelRevision.Review.PENDING,
        ).update(review_state=state)
        if not claimed:
            raise ValidationError("this submission was already reviewed")
        replaced = (
            revisions.make_current(revision, revisions.backends_of(revision))
            if approve
            else {}
        )
        AuditEvent.record(
            actor=by,
            verb="submission.approve" if approve else "submission.reject",
            obj=revision,
            before={
                "review_state": KernelRevision.Review.PENDING,
                "current": _digests(replaced),
            },
            after={
                "review_state": state,
                "current": dict.fromkeys(replaced, revision.source_sha256),
                "comment": comment,
            },
        )
    revision.refresh_from_db()
    return revision


def revision_revert(
    *, revision: KernelRevision, backends, by, comment: str
) -> dict[str, int | None]:
    """Make an earlier approved revision current again on ``backends``: a
    reviewed decision like an approval, with its reason. Returns what each
    backend ran before."""
    if not is_reviewer(by):
        raise PermissionDenied("only reviewers revert kernel revisions")
    if revision.review_state != KernelRevision.Review.APPROVED:
        raise ValidationError("only an approved revision can be made current")
    if not comment.strip():
        raise ValidationError("say why you revert")
    backends = clean_backends(backends)
    outside = sorted(set(backends) - set(revisions.backends_of(revision)))
    if outside:
        raise ValidationError(
            f"this revision does not cover {', '.join(outside)}; "
            f"it covers {', '.join(revisions.backends_of(revision))}"
        )
    with transaction.atomic():
        replaced = revisions.make_current(revision, backends)
        if all(r == revision.pk for r in replaced.values()):
            raise ValidationError("this revision is already current there")
        AuditEvent.record(
            actor=by,
            verb="revision.revert",
            obj=revision,
            before={"current": _digests(replaced)},
            after={
                "current": dict.fromkeys(replaced, revision.source_sha256),
                "comment": comment,
            },
        )
    return replaced


def _digests(replaced: dict[str, int | None]) -> dict[str, str | None]:
    """backend -> sha256 of the revision it ran, for the audit log."""
    sha = dict(
        KernelRevision.objects.filter(
            pk__in=[r for r in replaced.values() if r]
        ).values_list("pk", "source_sha256")
    )
    return {b: sha.get(r) for b, r in replaced.items()}


def diff_base(revision: KernelRevision) -> KernelRevision | None:
    """What a revision is shown against: the revision current on a backend
    it covers, or, once it is current there itself, the one it replaced."""
    others = KernelRevision.objects.filter(
        operator_id=revision.operator_id, review_state=KernelRevision.Review.APPROVED
    ).exclude(pk=revision.pk)
    return (
        others.filter(current_on__backend__in=revisions.backends_of(revision))
        .order_by("-created_at")
        .first()
        or others.filter(created_at__lte=revision.created_at)
        .order_by("-created_at")
        .first()
    )


def is_current_beside(base: KernelRevision, revision: KernelRevision) -> bool:
    """Whether ``base`` is current on a backend ``revision`` covers."""
    return base.current_on.filter(backend__in=revisions.backends_of(revision)).exists()


def revision_diff(revision: KernelRevision, base: KernelRevision | None) -> list[str]:
    """The unified diff of a revision against ``base`` (for a library
    revision, the operator's own module within its text)."""
    # A library revision's text carries the library modules it imports;
    # a submission replaces the operator's own module alone.
    before = operator_module(base.source) if base else ""
    label = "nothing"
    if base is not None:
        role = "current" if is_current_beside(base, revision) else "replaced"
        label = f"{role} {base.source_sha256[:12]}"
    return list(
        difflib.unified_diff(
            before.splitlines(),
            revision.source.splitlines(),
            fromfile=label,
            tofile=f"submitted {revision.source_sha256[:12]}",
            lineterm="",
        )
    )
