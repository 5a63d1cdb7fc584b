"""Alerts: cells whose confirmed verdict turned worse, grouped by cause.

A cause is what changed between the last pass and the first bad result
(the toolchain, the kernel revision, or nothing pinned) and how the cells
fail (their status and error signature): 500 cells broken by one TileLang
release are one alert with 500 cells. ``matrix.alerts`` opens, grows and
closes them; people triage them (``matrix.alerts.services.alert_triage``),
every change audited."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from matrix.models import choices_check


class AlertState(models.TextChoices):
    NEW = "new"
    ACKNOWLEDGED = "acknowledged"
    UPSTREAM = "upstream", "upstream (TileLang issue)"
    FIXED = "fixed"
    WONT_FIX = "wont_fix", "won't fix"


# States in which an alert still asks for attention.
OPEN_STATES = (AlertState.NEW, AlertState.ACKNOWLEDGED, AlertState.UPSTREAM)


class CauseKind(models.TextChoices):
    TOOLCHAIN = "toolchain", "toolchain change"
    REVISION = "revision", "kernel revision change"
    # The same revision on the same toolchain failed where it passed (a
    # confirmed flake, a driver or host change the fingerprint missed).
    UNCHANGED = "unchanged", "nothing pinned changed"
    # A served cell fails on the current toolchain, where it never passed,
    # and passes on a newer release with the same kernel revision: what
    # production runs is broken, and an upgrade is known to fix it.
    CURRENT = "current", "current toolchain fails, a newer one passes"


# The status an alert of a significant slowdown carries: the cells still
# pass, their kernel is slower than before beyond the policy's budget.
SLOWER = "slower"


class AlertQuerySet(models.QuerySet):
    def open(self):
        return self.filter(state__in=OPEN_STATES)

    def by_weight(self):
        """Open alerts first, then the most served weight touched."""
        return self.annotate(
            closed=models.Case(
                models.When(state__in=OPEN_STATES, then=0),
                default=1,
                output_field=models.IntegerField(),
            )
        ).order_by("closed", "-served_weight", "-open_cells", "-pk")


class Alert(models.Model):
    State = AlertState
    Kind = CauseKind

    # kind:changed-to id:status:signature; one alert per cause, reopened
    # when its cells go bad again after a fix.
    cause = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=10, choices=CauseKind.choices)
    status = models.CharField(
        max_length=16, help_text="the failing status, or 'slower' for a slowdown"
    )
    signature = models.CharField(max_length=64, blank=True)
    # The toolchain of the first bad result, and of the last pass before it.
    toolchain = models.ForeignKey(
        "matrix.Toolchain", on_delete=models.PROTECT, related_name="+"
    )
    good_toolchain = models.ForeignKey(
        "matrix.Toolchain",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    revision = models.ForeignKey(
        "matrix.KernelRevision", on_delete=models.PROTECT, related_name="+"
    )
    good_revision = models.ForeignKey(
        "matrix.KernelRevision",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    first_bad_result = models.ForeignKey(
        "matrix.Result", on_delete=models.PROTECT, related_name="+"
    )
    state = models.CharField(
        max_length=12, choices=AlertState.choices, default=AlertState.NEW
    )
    upstream_url = models.URLField(
        max_length=500, blank=True, help_text="the TileLang issue it waits on"
    )
    wont_fix_reason = models.TextField(blank=True)
    # From the policy's backend owners when the alert opened or grew.
    owners = models.JSONField(default=list, blank=True)
    backends = models.JSONField(default=list, blank=True)
    # Sum of the served weight of its cells, and how many still fail: the
    # list's order, kept with the cells so that it is one ORDER BY.
    served_weight = models.FloatField(default=0.0)
    cell_count = models.PositiveIntegerField(default=0)
    open_cells = models.PositiveIntegerField(default=0)
    # Written by the toolchain bisection (``matrix.alerts.receivers``): its
    # id, state, ``summary`` (the conclusion), the named release and what
    # would test the releases left untested. Null until one ran.
    bisection = models.JSONField(null=True, blank=True)
    reopened = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)
    fixed_at = models.DateTimeField(null=True, blank=True)

    objects = AlertQuerySet.as_manager()

    class Meta:
        ordering = ["-opened_at", "-pk"]
        indexes = [
            models.Index(fields=["state", "served_weight"], name="alert_state_weight")
        ]
        constraints = [
            choices_check("state", AlertState, "alert_state_valid"),
            choices_check("kind", CauseKind, "alert_kind_valid"),
            models.CheckConstraint(
                condition=~Q(state=AlertState.WONT_FIX) | ~Q(wont_fix_reason=""),
                name="alert_wont_fix_has_reason",
            ),
            models.CheckConstraint(
                condition=~Q(state=AlertState.UPSTREAM) | ~Q(upstream_url=""),
                name="alert_upstream_has_link",
            ),
        ]

    def __str__(self) -> str:
        return f"alert #{self.pk}: {self.title}"

    @property
    def title(self) -> str:
        what = "significantly slower" if self.status == SLOWER else self.status
        what = what.replace("_", " ")
        sig = f" ({self.signature[:12]})" if self.signature else ""
        if self.kind == CauseKind.CURRENT:
            return f"{what}{sig} on the current toolchain"
        return f"{what}{sig} after a {self.get_kind_display()}"

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    def snapshot(self) -> dict:
        """The fields an audit event records before and after a change."""
        return {
            "state": self.state,
            "upstream_url": self.upstream_url,
            "wont_fix_reason": self.wont_fix_reason,
            "owners": list(self.owners),
            "cell_count": self.cell_count,
            "open_cells": self.open_cells,
        }


class AlertCell(models.Model):
    """One cell of an alert: its first bad result, the pass before it, and
    since when it passes again (null while it is still bad)."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="cells")
    shape = models.ForeignKey(
        "matrix.Shape", on_delete=models.CASCADE, related_name="+"
    )
    device_type = models.ForeignKey(
        "matrix.DeviceType", on_delete=models.CASCADE, related_name="+"
    )
    toolchain = models.ForeignKey(
        "matrix.Toolchain", on_delete=models.CASCADE, related_name="+"
    )
    first_bad_result = models.ForeignKey(
        "matrix.Result", on_delete=models.PROTECT, related_name="+"
    )
    good_result = models.ForeignKey(
        "matrix.Result",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    passing_since = models.DateTimeField(null=True, blank=True)
    added_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["alert", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["alert", "shape", "device_type", "toolchain"],
                name="alert_cell_unique",
            ),
        ]
        indexes = [
            # The open alert cells of a batch's cells, when they pass again.
            models.Index(
                fields=["shape", "device_type", "toolchain"], name="alert_cell_key"
            ),
        ]

    def __str__(self) -> str:
        return f"alert #{self.alert_id}: cell {self.shape_id}/{self.device_type_id}"
