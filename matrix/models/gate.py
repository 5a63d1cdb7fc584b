"""Gate models: Policy (a new row per edit), UpgradeProposal, its stored
DiffRow rows, Approval, BackendException and ManifestEntry."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q


# How a cell changed from the baseline toolchain to the candidate: a diff
# row's ``change`` (matrix/gate/diff.py computes it).
class Change:
    GREEN_TO_RED = "green_to_red"
    RED_TO_GREEN = "red_to_green"
    NEW = "new"
    MISSING = "missing"
    STILL_GREEN = "still_green"
    STILL_RED = "still_red"

    LABELS = {
        GREEN_TO_RED: "green → red",
        RED_TO_GREEN: "red → green",
        NEW: "new",
        MISSING: "missing",
        STILL_GREEN: "still green",
        STILL_RED: "still red",
    }
    ORDER = [GREEN_TO_RED, MISSING, RED_TO_GREEN, NEW, STILL_RED, STILL_GREEN]


class Policy(models.Model):
    """One version of the upgrade policy. Rows are never edited: an admin's
    change writes the next version, so every decision names the rules it was
    taken under."""

    DEFAULT_PERF_BUDGET = 0.05
    DEFAULT_SPEED_BUDGET = 0.0
    DEFAULT_REQUIRED_APPROVALS = 2
    DEFAULT_REVIEWER_GROUP = "reviewer"

    version = models.PositiveIntegerField(unique=True)
    forbid_served_regressions = models.BooleanField(
        default=True, help_text="no served cell may go from pass to any other status"
    )
    perf_budget = models.FloatField(
        default=DEFAULT_PERF_BUDGET,
        help_text="allowed slowdown of the candidate, 0.05 = 5% slower",
    )
    perf_budgets = models.JSONField(
        default=dict, blank=True, help_text="per operator: {'gemm': 0.02}"
    )
    speed_budget = models.FloatField(
        default=DEFAULT_SPEED_BUDGET,
        help_text="how much slower than the PyTorch reference on the same cell a "
        "passing TileLang kernel may be measured and still be served: "
        "0 = not slower, 0.1 = up to 10% slower",
    )
    require_candidate_results = models.BooleanField(
        default=True, help_text="every served cell needs a candidate result"
    )
    required_approvals = models.PositiveSmallIntegerField(
        default=DEFAULT_REQUIRED_APPROVALS
    )
    reviewer_group = models.CharField(max_length=150, default=DEFAULT_REVIEWER_GROUP)
    # Rolling out changes production's toolchain: the policy names who may.
    rollout_group = models.CharField(
        max_length=150,
        default=DEFAULT_REVIEWER_GROUP,
        help_text="the group whose members roll out an approved upgrade "
        "(superusers too)",
    )
    backend_owners = models.JSONField(
        default=dict,
        blank=True,
        help_text="per backend, the user names who sign off its exceptions: "
        "{'cuda': ['alice']}",
    )
    note = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-version"]
        verbose_name_plural = "policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(required_approvals__gte=1),
                name="policy_required_approvals_positive",
            ),
            models.CheckConstraint(
                condition=Q(perf_budget__gte=0), name="policy_perf_budget_nonnegative"
            ),
            models.CheckConstraint(
                condition=Q(speed_budget__gte=0),
                name="policy_speed_budget_nonnegative",
            ),
        ]

    def __str__(self) -> str:
        return f"policy v{self.version}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise PermissionError("a policy version is never edited; save a new one")
        super().save(*args, **kwargs)

    @classmethod
    def current(cls) -> Policy:
        """The latest version; version 1 with the defaults when none exists."""
        policy = cls.objects.order_by("-version").first()
        if policy is None:
            policy, _ = cls.objects.get_or_create(version=1)
        return policy

    def budget_for(self, operator_name: str) -> float:
        return float(self.perf_budgets.get(operator_name, self.perf_budget))

    def owners_of(self, backend: str) -> list[str]:
        return list(self.backend_owners.get(backend, []))

    def as_dict(self) -> dict:
        return {
            "version": self.version,
            "forbid_served_regressions": self.forbid_served_regressions,
            "perf_budget": self.perf_budget,
            "perf_budgets": self.perf_budgets,
            "speed_budget": self.speed_budget,
            "require_candidate_results": self.require_candidate_results,
            "required_approvals": self.required_approvals,
            "reviewer_group": self.reviewer_group,
            "rollout_group": self.rollout_group,
            "backend_owners": self.backend_owners,
        }


class ProposalState(models.TextChoices):
    COLLECTING = "collecting"
    READY = "ready"
    BLOCKED = "blocked"
    APPROVED = "approved"
    REJECTED = "rejected"
    ROLLED_OUT = "rolled_out", "Rolled out"


class ProposalQuerySet(models.QuerySet):
    def open(self):
        return self.exclude(state=ProposalState.ROLLED_OUT)


class UpgradeProposal(models.Model):
    """Baseline toolchain -> candidate toolchain on some device types.

    The state is derived by ``proposal_reevaluate`` from the diff, the policy
    and the standing approvals; only rollout is final."""

    State = ProposalState

    baseline = models.ForeignKey(
        "matrix.Toolchain", on_delete=models.PROTECT, related_name="+"
    )
    candidate = models.ForeignKey(
        "matrix.Toolchain", on_delete=models.PROTECT, related_name="+"
    )
    device_types = models.ManyToManyField("matrix.DeviceType", related_name="+")
    proposer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    note = models.TextField(blank=True)
    state = models.CharField(
        max_length=12, choices=State.choices, default=State.COLLECTING
    )
    policy = models.ForeignKey(
        Policy,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="the policy version of the last evaluation",
    )
    diff_digest = models.CharField(max_length=64, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    blocking_reasons = models.JSONField(default=list, blank=True)
    sweeps = models.ManyToManyField("matrix.Sweep", blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    evaluated_at = models.DateTimeField(null=True, blank=True)
    diff_computed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when the computation of the stored diff began: the cells it "
        "read are those stored by then",
    )
    reevaluation_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="set when new results touch the proposal, cleared when the "
        "background re-evaluation they wait for begins",
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    rolled_out_at = models.DateTimeField(null=True, blank=True)

    objects = ProposalQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("propose_upgrade", "Can propose a toolchain upgrade")]
        constraints = [
            models.CheckConstraint(
                condition=~Q(baseline=F("candidate")),
                name="proposal_baseline_differs_from_candidate",
            ),
            models.CheckConstraint(
                condition=Q(state__in=ProposalState.values), name="proposal_state_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"upgrade #{self.pk}: {self.baseline} → {self.candidate}"

    @property
    def reevaluation_pending(self) -> bool:
        return self.reevaluation_requested_at is not None

    def snapshot(self) -> dict:
        """The fields an audit event records before and after a transition."""
        return {
            "state": self.state,
            "diff_digest": self.diff_digest,
            "policy_version": self.policy.version if self.policy_id else None,
            "blocking_reasons": list(self.blocking_reasons),
        }


class DiffRowQuerySet(models.QuerySet):
    def changed_first(self):
        return self.order_by("sort_key")

    def blocking(self):
        return self.exclude(blocking_rule="")

    def may_block(self):
        """Served rows a rule could block on: a regression, a missing
        candidate result, or a slowdown outside the noise band. Every budget
        is at least 0, so no row outside these is ever over one."""
        return self.filter(served=True).filter(
            Q(change__in=["green_to_red", "missing"]) | Q(perf_step__gt=0)
        )


class DiffRow(models.Model):
    """One cell of a proposal's A/B diff, as its last re-evaluation found it.

    Written by the background re-evaluation (only the rows that changed);
    the proposal page, the policy and the manifest read these rows, never
    the matrix itself. ``rank`` puts changed rows first, served before
    unserved; ``position`` is the diff's own order (operator, dtype, dims,
    device type); ``sort_key`` is both in one number, so a page goes on from
    the last row shown (a cursor) rather than skipping rows;
    ``blocking_rule`` names the policy rule the row fails (``regression``,
    ``missing`` or ``slower``), set at each evaluation."""

    proposal = models.ForeignKey(
        UpgradeProposal, on_delete=models.CASCADE, related_name="diff_rows"
    )
    shape = models.ForeignKey(
        "matrix.Shape", on_delete=models.CASCADE, related_name="+"
    )
    device_type = models.ForeignKey(
        "matrix.DeviceType", on_delete=models.CASCADE, related_name="+"
    )
    position = models.PositiveIntegerField()
    rank = models.PositiveSmallIntegerField()
    sort_key = models.BigIntegerField()
    operator = models.CharField(max_length=60)
    dtype = models.CharField(max_length=10)
    dims_key = models.CharField(max_length=200)
    served = models.BooleanField()
    weight = models.FloatField()
    backend = models.CharField(max_length=8)
    device_type_label = models.CharField(max_length=200)
    baseline_status = models.CharField(max_length=16, blank=True)
    candidate_status = models.CharField(max_length=16, blank=True)
    change = models.CharField(max_length=12)
    candidate_result = models.ForeignKey(
        "matrix.Result",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    candidate_revision_sha256 = models.CharField(max_length=64, blank=True)
    candidate_error = models.CharField(max_length=300, blank=True)
    baseline_ms = models.FloatField(null=True, blank=True)
    candidate_ms = models.FloatField(null=True, blank=True)
    ratio = models.FloatField(null=True, blank=True)
    band = models.FloatField(null=True, blank=True)
    perf_step = models.IntegerField(null=True, blank=True)
    reference_ms = models.FloatField(
        null=True, blank=True, help_text="the PyTorch reference on the candidate"
    )
    speed = models.FloatField(
        null=True, blank=True, help_text="reference / TileLang time on the candidate"
    )
    speed_band = models.FloatField(null=True, blank=True)
    speed_verdict = models.CharField(
        max_length=12, blank=True, help_text="the rank test's verdict on the samples"
    )
    confidence = models.FloatField(
        null=True, blank=True, help_text="1 - p of the rank test"
    )
    candidate_distrust = models.CharField(
        max_length=200,
        blank=True,
        help_text="why the candidate's pass may not be served whatever its speed",
    )
    blocking_rule = models.CharField(max_length=12, blank=True)

    RULES = ("regression", "missing", "slower")

    objects = DiffRowQuerySet.as_manager()

    class Meta:
        ordering = ["sort_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["proposal", "shape", "device_type"],
                name="diff_row_one_per_cell",
            ),
        ]
        indexes = [
            models.Index(
                fields=["proposal", "sort_key"], name="diff_row_changed_first"
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.proposal_id} {self.label}: {self.change}"

    @property
    def label(self) -> str:
        return (
            f"{self.operator}[{self.dims_key}] {self.dtype} on {self.device_type_label}"
        )

    @property
    def change_label(self) -> str:
        return Change.LABELS[self.change]


class Decision(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"


class Approval(models.Model):
    """A reviewer's decision on one diff. ``proposer`` is copied from the
    proposal so the database itself can refuse a self-approval; a trigger
    (migration 0003) keeps the copy equal to the proposal's proposer."""

    Decision = Decision

    proposal = models.ForeignKey(
        UpgradeProposal, on_delete=models.CASCADE, related_name="approvals"
    )
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    proposer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    decision = models.CharField(max_length=8, choices=Decision.choices)
    comment = models.TextField()
    diff_digest = models.CharField(max_length=64)
    voided = models.BooleanField(default=False)
    voided_reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(reviewer=F("proposer")), name="approval_not_by_proposer"
            ),
            models.CheckConstraint(
                condition=Q(decision__in=Decision.values),
                name="approval_decision_valid",
            ),
            models.UniqueConstraint(
                fields=["proposal", "reviewer"],
                condition=Q(voided=False),
                name="approval_one_standing_per_reviewer",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reviewer} {self.decision}s #{self.proposal_id}"


class BackendException(models.Model):
    """A granted exception for one backend's performance regressions; it
    takes effect only once an owner of that backend (per the policy) signs."""

    proposal = models.ForeignKey(
        UpgradeProposal, on_delete=models.CASCADE, related_name="exceptions"
    )
    backend = models.CharField(max_length=8)
    reason = models.TextField()
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    signed_off_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    signed_off_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["backend"]
        constraints = [
            models.UniqueConstraint(
                fields=["proposal", "backend"], name="exception_one_per_backend"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.backend} exception on #{self.proposal_id}"

    @property
    def signed(self) -> bool:
        return self.signed_off_by_id is not None


class Choice(models.TextChoices):
    TILELANG = "tilelang"
    REFERENCE = "reference"


class ManifestEntry(models.Model):
    """One approved row of the manifest, written when a proposal is approved
    and served while it stays approved or rolled out."""

    Choice = Choice

    proposal = models.ForeignKey(
        UpgradeProposal, on_delete=models.CASCADE, related_name="manifest_entries"
    )
    toolchain = models.ForeignKey(
        "matrix.Toolchain", on_delete=models.PROTECT, related_name="+"
    )
    device_type = models.ForeignKey(
        "matrix.DeviceType", on_delete=models.PROTECT, related_name="+"
    )
    shape = models.ForeignKey(
        "matrix.Shape", on_delete=models.PROTECT, related_name="+"
    )
    operator = models.CharField(max_length=60)
    dtype = models.CharField(max_length=10)
    dims = models.JSONField()
    choice = models.CharField(max_length=10, choices=Choice.choices)
    reason = models.CharField(max_length=200)
    revision_sha256 = models.CharField(max_length=64, blank=True)
    result = models.ForeignKey(
        "matrix.Result",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )

    class Meta:
        ordering = ["operator", "dtype", "device_type", "shape"]
        constraints = [
            models.UniqueConstraint(
                fields=["proposal", "device_type", "shape"],
                name="manifest_entry_unique",
            ),
            models.CheckConstraint(
                condition=Q(choice__in=Choice.values), name="manifest_choice_valid"
            ),
            # A TileLang row must name the validated kernel it vouches for.
            models.CheckConstraint(
                condition=Q(choice=Choice.REFERENCE)
                | Q(revision_sha256__regex=r"^[0-9a-f]{64}$"),
                name="manifest_tilelang_names_revision",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operator} {self.dtype} {self.dims} → {self.choice}"


class SustainedSpeed(models.Model):
    """TileLang's speed against the PyTorch reference on one cell, measured
    outside the harness over a sustained run at the device's power cap
    (``bench/sustained_speed.py``), for the kernel revision current when it
    was imported. It is not signed, so it can only take TileLang away: the
    manifest serves the reference where this says slower, and never serves
    TileLang because of it."""

    toolchain = models.ForeignKey(
        "matrix.Toolchain", on_delete=models.CASCADE, related_name="+"
    )
    device_type = models.ForeignKey(
        "matrix.DeviceType", on_delete=models.CASCADE, related_name="+"
    )
    shape = models.ForeignKey(
        "matrix.Shape", on_delete=models.CASCADE, related_name="+"
    )
    revision = models.ForeignKey(
        "matrix.KernelRevision", on_delete=models.CASCADE, related_name="+"
    )
    # The reference's median time over TileLang's: above 1 TileLang is faster.
    speed = models.FloatField()
    source = models.CharField(max_length=200, help_text="the file it came from")
    imported_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["toolchain", "device_type", "shape", "revision"],
                name="sustained_speed_unique",
            ),
            models.CheckConstraint(
                condition=Q(speed__gt=0), name="sustained_speed_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.speed:.3f}x at the power cap ({self.source})"


class ManifestSnapshot(models.Model):
    """The manifest as a reader was last given it, gzipped, one row per read
    (a toolchain, all device types or one): what answers when the shared
    cache lost it (restarted, evicted), where building it again took 0.4 s
    a read at 1M results on a busy host, every serving host asking at once.
    ``key`` names the version it shows (matrix.cache.read_key): a snapshot
    of another version is never served."""

    read = models.CharField(max_length=100, unique=True)
    key = models.CharField(max_length=200)
    body_gzip = models.BinaryField()
    created_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.key
