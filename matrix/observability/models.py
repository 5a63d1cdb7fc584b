"""Counts no stored row can give at scrape time."""

from __future__ import annotations

from django.db import models


class IngestRefusal(models.Model):
    """How many results ingest refused for one reason, since this table was
    made. A refused result leaves no row behind, and the control worker that
    refuses it is not the web process that answers a scrape: the count is
    kept here, one row per reason (``matrix.observability.ingest``)."""

    reason = models.CharField(max_length=40, primary_key=True)
    count = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.reason}: {self.count}"
