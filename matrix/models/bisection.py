"""Bisection across toolchains: which TileLang release between a last good
and a first bad toolchain changed one cell (kernel revision, shape with its
dtype, device type).

The releases between are laid out once, at the start, as ``ladder``
(oldest first, both ends included); each ``BisectionStep`` is one rung
tested, by a job the planner ran or by a result that already existed. The
search itself is ``matrix.bisection``'s; these tables only keep it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from matrix.models import choices_check


class BisectionState(models.TextChoices):
    RUNNING = "running", "running"
    # The release is named: the rung before it gave the old verdict.
    FOUND = "found", "release named"
    # Narrowed to a range: a release between could not be tested (not
    # hosted, or no verdict); ``needs`` says what would test it.
    NARROWED = "narrowed", "narrowed to a range"
    # Both ends give the same verdict on this revision: nothing to find.
    NO_CHANGE = "no_change", "no change"
    # Cannot go on (an end untestable, the revision changed); ``conclusion``
    # says why.
    STOPPED = "stopped", "stopped"


class BisectionDirection(models.TextChoices):
    # Older release good, newer bad: the first bad release is sought.
    REGRESSION = "regression"
    # Older release bad, newer good: the first good release is sought.
    FIX = "fix"


class Verdict(models.TextChoices):
    GOOD = "good"
    BAD = "bad"
    # No answer to the question (infra_error, unsupported, lowered or
    # built only): the rung is left out, as `git bisect skip` does.
    SKIP = "skip"


class Bisection(models.Model):
    State = BisectionState
    Direction = BisectionDirection

    revision = models.ForeignKey(
        "matrix.KernelRevision", on_delete=models.PROTECT, related_name="+"
    )
    shape = models.ForeignKey(
        "matrix.Shape", on_delete=models.CASCADE, related_name="bisections"
    )
    device_type = models.ForeignKey(
        "matrix.DeviceType", on_delete=models.CASCADE, related_name="bisections"
    )
    last_good = models.ForeignKey(
        "matrix.Toolchain", on_delete=models.PROTECT, related_name="+"
    )
    first_bad = models.ForeignKey(
        "matrix.Toolchain", on_delete=models.PROTECT, related_name="+"
    )
    direction = models.CharField(max_length=12, choices=Direction.choices)
    state = models.CharField(
        max_length=12, choices=State.choices, default=State.RUNNING
    )
    # Where it was started from, when from an upgrade's diff row.
    proposal = models.ForeignKey(
        "matrix.UpgradeProposal",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="bisections",
    )
    # Oldest first, both ends included: {"version", "toolchain" (id or
    # null), "name", "hosted", "need"} per rung.
    ladder = models.JSONField(default=list)
    # The named release: the first bad (regression) or first good (fix).
    release = models.ForeignKey(
        "matrix.Toolchain",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    conclusion = models.TextField(blank=True)
    # The job JSON and the commands that show the change on one host.
    repro = models.JSONField(default=dict, blank=True)
    # What would test the rungs left untested: one sentence each.
    needs = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            choices_check("state", BisectionState, "bisection_state_valid"),
            choices_check("direction", BisectionDirection, "bisection_direction_valid"),
            models.CheckConstraint(
                condition=~Q(last_good=models.F("first_bad")),
                name="bisection_two_toolchains",
            ),
            # Pressing Bisect twice finds the running one, not a second.
            models.UniqueConstraint(
                fields=["revision", "shape", "device_type", "last_good", "first_bad"],
                condition=Q(state="running"),
                name="bisection_one_running",
            ),
        ]

    def __str__(self) -> str:
        return f"bisection {self.pk} ({self.state})"

    @property
    def is_running(self) -> bool:
        return self.state == BisectionState.RUNNING

    @property
    def sought(self) -> str:
        """What it names, in words."""
        return (
            "first bad release"
            if self.direction == BisectionDirection.REGRESSION
            else "first good release"
        )


class BisectionStep(models.Model):
    """One rung tested: by a job planned for it (``job``, until its result
    comes) or by a result that existed already (``reused``)."""

    Verdict = Verdict

    bisection = models.ForeignKey(
        Bisection, on_delete=models.CASCADE, related_name="steps"
    )
    number = models.PositiveSmallIntegerField()
    # The rung's place in the bisection's ladder.
    rung = models.PositiveSmallIntegerField()
    toolchain = models.ForeignKey(
        "matrix.Toolchain", on_delete=models.PROTECT, related_name="+"
    )
    job = models.ForeignKey(
        "matrix.ValidationJob",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="bisection_steps",
    )
    result = models.ForeignKey(
        "matrix.Result",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    reused = models.BooleanField(default=False)
    status = models.CharField(max_length=16, blank=True)
    verdict = models.CharField(max_length=8, choices=Verdict.choices, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["bisection", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["bisection", "number"], name="bisection_step_number_unique"
            ),
            models.UniqueConstraint(
                fields=["bisection", "rung"], name="bisection_step_rung_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"step {self.number} of bisection {self.bisection_id}"

    @property
    def is_waiting(self) -> bool:
        return not self.verdict
