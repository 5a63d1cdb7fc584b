"""Texts stored once per SHA-256: the generated kernel source and the error
message of results.

A result's generated source is about 5 KB; at 100M results that was 500 GB
for at most a few hundred thousand distinct sources. A result points at its
texts instead (``Result.source``, ``Result.error``), and two results share a
row exactly when their texts are byte for byte the same, so comparing the
ids says whether the generated code changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from django.db import models
from django.db.models import Q


def normalized(text: str) -> str:
    """``text`` as a database stores it: PostgreSQL refuses NUL characters
    and lone surrogates (UTF-8 cannot encode them), which a runner's JSON
    may carry; one odd text must not fail the batch it came in."""
    return text.replace("\x00", "\ufffd").encode(errors="replace").decode()


def text_sha256(text: str) -> str:
    """The name of a text: the SHA-256 of its UTF-8 bytes, as ingest named
    a kernel source before texts were shared (``kernel_source_sha256``)."""
    return hashlib.sha256(text.encode(errors="replace")).hexdigest()


class BlobQuerySet(models.QuerySet):
    def resolve(self, blobs: Iterable[Blob]) -> None:
        """Give each unsaved blob (``Blob.of``) the id of the row that holds
        its text, inserting the texts not stored yet. One query when every
        text is stored already; three when some are new.

        Safe with two workers storing the same new text at once: the insert
        ignores a row another transaction holds (PostgreSQL waits for it to
        end first), and the texts go in in SHA-256 order, so two batches
        sharing new texts wait for each other instead of deadlocking."""
        blobs = [b for b in blobs if b.pk is None]
        if not blobs:
            return
        wanted = {b.sha256: b for b in blobs}
        found = dict(self.filter(sha256__in=wanted).values_list("sha256", "pk"))
        missing = sorted(set(wanted) - set(found))
        if missing:
            self.bulk_create(
                [Blob(sha256=sha, text=wanted[sha].text) for sha in missing],
                ignore_conflicts=True,
            )
            found.update(self.filter(sha256__in=missing).values_list("sha256", "pk"))
        for blob in blobs:
            blob.pk = found[blob.sha256]
            blob._state.adding = False


class Blob(models.Model):
    """One text, stored once, named by the SHA-256 of its UTF-8 bytes.
    Never changed nor deleted: results of any age point at it."""

    id = models.BigAutoField(primary_key=True)
    sha256 = models.CharField(max_length=64, unique=True)
    text = models.TextField()

    objects = BlobQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(sha256__regex=r"^[0-9a-f]{64}$"), name="blob_sha256_hex"
            ),
        ]

    def __str__(self) -> str:
        return f"text {self.sha256[:12]} ({len(self.text):,} characters)"

    @classmethod
    def of(cls, text: str | None) -> Blob | None:
        """An unsaved blob of ``text`` (None for no text), for a new result's
        ``source`` or ``error``: ``texts_store`` stores a batch's."""
        if not text:
            return None
        text = normalized(text)
        return cls(sha256=text_sha256(text), text=text)

    @classmethod
    def stored(cls, text: str | None) -> Blob | None:
        """The stored blob of ``text``, inserted if new: for a single text
        (a lost job's reason, a test's fixture), not per row of a batch."""
        blob = cls.of(text)
        if blob is not None:
            cls.objects.resolve([blob])
        return blob


def texts_store(results: list) -> None:
    """Store the texts of new results (their ``source`` and ``error``, made
    by ``Blob.of``) and point each result at their rows: the same few queries
    for a batch of any size."""
    Blob.objects.resolve(
        blob for r in results for blob in (r.source, r.error) if blob is not None
    )
    for r in results:
        # Assigned again now that the blobs have ids: this sets the columns.
        r.source, r.error = r.source, r.error
