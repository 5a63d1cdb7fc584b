"""The device x operator matrix: what was run, where, with which toolchain,
and what came out.

A *cell* is (shape with its dtype, device type, toolchain); the kernel
revision that produced its latest result is stored on it, so a cell whose
revision is no longer current, or whose toolchain is older than the current
one (``queries.toolchain_superseded``), reads as stale. ``Cell`` keeps the
latest result per cell so that no page ever scans all results.
"""

from __future__ import annotations

import math

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from matrix.models.blobs import Blob
from runners.harness.fingerprint import canonical_sha256


class Backend(models.TextChoices):
    CUDA = "cuda", "CUDA"
    HIP = "hip", "ROCm (HIP)"
    METAL = "metal", "Metal"
    C = "c", "CPU (C)"
    NPU = "npu", "NPU"


# Higher first: gaps on the backends that serve production traffic rank first.
# Ids are stored in signed 64-bit columns: a larger number names no row, and
# SQLite fails on it (OverflowError) instead of finding nothing.
ID_MAX = 2**63 - 1
BACKEND_PRIORITY = {"cuda": 1.0, "hip": 0.8, "c": 0.5, "metal": 0.4, "npu": 0.3}


class Dtype(models.TextChoices):
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


class Status(models.TextChoices):
    """The status ladder of DESIGN.md; only PASS is green."""

    LOWERED = "lowered"
    BUILT = "built"
    PASS = "pass"
    COMPILE_ERROR = "compile_error"
    MISMATCH = "mismatch"
    UNSTABLE = "unstable"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    UNSUPPORTED = "unsupported"
    INFRA_ERROR = "infra_error"


EVIDENCE = {Status.LOWERED, Status.BUILT}
FAILURES = {
    Status.COMPILE_ERROR,
    Status.MISMATCH,
    Status.UNSTABLE,
    Status.RUNTIME_ERROR,
    Status.TIMEOUT,
    Status.INFRA_ERROR,
}


def choices_check(field: str, choices: type[models.TextChoices], name: str):
    return models.CheckConstraint(
        condition=Q(**{f"{field}__in": choices.values}), name=name
    )


class DeviceTypeQuerySet(models.QuerySet):
    def named(self, text: str):
        """The device types ``text`` names: an id (ASCII digits), a backend
        (``c``, ``cuda``) or part of a model name."""
        text = str(text)
        if text.isascii() and text.isdigit():
            return self.filter(pk=int(text)) if int(text) <= ID_MAX else self.none()
        if text in Backend.values:
            return self.filter(backend=text)
        return self.filter(model__icontains=text)


class DeviceType(models.Model):
    """A column of the matrix: vendor model + arch + backend."""

    vendor = models.CharField(max_length=40)
    model = models.CharField(max_length=80)
    arch = models.CharField(max_length=40, blank=True)
    backend = models.CharField(max_length=8, choices=Backend.choices)
    memory_gb = models.PositiveIntegerField(null=True, blank=True)

    objects = DeviceTypeQuerySet.as_manager()

    class Meta:
        ordering = ["backend", "vendor", "model"]
        constraints = [
            models.UniqueConstraint(
                fields=["vendor", "model", "arch", "backend"], name="device_type_unique"
            ),
            choices_check("backend", Backend, "device_type_backend_valid"),
        ]

    def __str__(self) -> str:
        return " · ".join(
            p for p in (f"{self.vendor} {self.model}", self.arch, self.backend) if p
        )

    @property
    def target(self) -> dict:
        """The TileLang target dict a job for this device type compiles for."""
        if self.backend == Backend.CUDA:
            return {"kind": "cuda", "arch": self.arch}
        if self.backend == Backend.HIP:
            return {"kind": "hip", "mcpu": self.arch}
        return {"kind": self.backend}


class Operator(models.Model):
    name = models.SlugField(max_length=60, unique=True)
    dims = models.JSONField(help_text="declared dim names, e.g. ['M', 'N', 'K']")
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean_dims(self, dims: dict) -> dict[str, int]:
        """Validate a shape's dims against the dims this operator declares."""
        if not isinstance(dims, dict):
            raise ValidationError({"dims": "dims must be an object like {'M': 1}"})
        missing = sorted(set(self.dims) - set(dims))
        extra = sorted(set(dims) - set(self.dims))
        if missing or extra:
            raise ValidationError(
                {
                    "dims": f"{self.name} takes dims {self.dims}; "
                    f"missing {missing}, unexpected {extra}"
                }
            )
        for name, value in dims.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError({"dims": f"{name} must be a positive integer"})
        return {d: dims[d] for d in self.dims}

    def current_revision(self, backend: str) -> KernelRevision | None:
        """The revision new jobs of this operator run on ``backend``."""
        found = self.current.filter(backend=backend).select_related("revision").first()
        return found.revision if found else None


class RevisionOrigin(models.TextChoices):
    LIBRARY = "library"
    SUBMITTED = "submitted"


class ReviewState(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class KernelRevision(models.Model):
    Origin = RevisionOrigin
    Review = ReviewState

    operator = models.ForeignKey(
        Operator, on_delete=models.PROTECT, related_name="revisions"
    )
    source_sha256 = models.CharField(max_length=64)
    source = models.TextField(blank=True)
    origin = models.CharField(max_length=10, choices=Origin.choices)
    review_state = models.CharField(max_length=10, choices=Review.choices)
    # Current on at least one backend (``CurrentRevision`` says which); kept
    # by ``matrix.revisions.make_current`` alone.
    is_current = models.BooleanField(default=False)
    # The backends a submission covers: approving it changes these only.
    # Empty for the library's revisions, which cover every backend.
    backends = models.JSONField(default=list, blank=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operator", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["operator", "source_sha256"], name="revision_unique_source"
            ),
            models.CheckConstraint(
                condition=Q(source_sha256__regex=r"^[0-9a-f]{64}$"),
                name="revision_sha256_hex",
            ),
            choices_check("origin", RevisionOrigin, "revision_origin_valid"),
            choices_check("review_state", ReviewState, "revision_review_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.operator.name}@{self.source_sha256[:12]}"


class CurrentRevision(models.Model):
    """The revision an operator's new jobs run on one backend: one row per
    operator and backend, so a submission approved for CUDA leaves the
    library's revision current on the CPU."""

    operator = models.ForeignKey(
        Operator, on_delete=models.CASCADE, related_name="current"
    )
    backend = models.CharField(max_length=8, choices=Backend.choices)
    revision = models.ForeignKey(
        KernelRevision, on_delete=models.PROTECT, related_name="current_on"
    )

    class Meta:
        ordering = ["operator", "backend"]
        constraints = [
            models.UniqueConstraint(
                fields=["operator", "backend"], name="current_revision_unique"
            ),
            choices_check("backend", Backend, "current_revision_backend_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.operator_id}/{self.backend} -> {self.revision_id}"


def dims_key(dims: dict) -> str:
    """A canonical text form of dims, for uniqueness and display."""
    return ",".join(f"{k}={dims[k]}" for k in dims)


class ShapeQuerySet(models.QuerySet):
    def served(self):
        return self.filter(served=True)

    def by_weight(self):
        return self.order_by(
            "-served", "-weight", "operator__name", "dims_key", "dtype"
        )


class Shape(models.Model):
    """An operator's dims and dtype; `served` when a production model calls it."""

    operator = models.ForeignKey(
        Operator, on_delete=models.PROTECT, related_name="shapes"
    )
    dims = models.JSONField()
    dims_key = models.CharField(max_length=200, editable=False)
    dtype = models.CharField(max_length=10, choices=Dtype.choices)
    served = models.BooleanField(default=False)
    weight = models.FloatField(
        default=0.0, help_text="calls per token or share of time"
    )
    source_profile = models.CharField(max_length=80, blank=True)
    # A neighbour of a served shape (matrix/neighbours.py): not called by a
    # model, but run beside the served cells (gaps, Run missing) to catch
    # the shape bugs that hide one size away.
    guards = models.BooleanField(default=False)

    objects = ShapeQuerySet.as_manager()

    class Meta:
        ordering = ["operator__name", "-served", "-weight", "dims_key", "dtype"]
        constraints = [
            models.UniqueConstraint(
                fields=["operator", "dims_key", "dtype"], name="shape_unique"
            ),
            choices_check("dtype", Dtype, "shape_dtype_valid"),
            models.CheckConstraint(
                condition=Q(weight__gte=0), name="shape_weight_nonnegative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operator.name}[{self.dims_key}] {self.dtype}"

    def save(self, *args, **kwargs):
        # PostgreSQL's jsonb keeps an object's keys in an order of its own:
        # a shape read back and saved again keeps its key in the operator's
        # declared order, not the stored one.
        declared = self.operator.dims if self.operator_id else []
        if set(declared) == set(self.dims):
            self.dims = {d: self.dims[d] for d in declared}
        self.dims_key = dims_key(self.dims)
        super().save(*args, **kwargs)

    def clean(self) -> None:
        if self.operator_id is None:
            return  # the form reports the missing operator itself
        self.dims = self.operator.clean_dims(self.dims)
        self.dims_key = dims_key(self.dims)


class ServedCall(models.Model):
    """How often one served model calls one shape in a forward step of
    ``tokens`` tokens. A shape two models call (Llama-3-8B and Mixtral-8x7B
    share their attention) has a row for each, with each model's own count;
    ``Shape.source_profile`` keeps only the model that brought it first."""

    source = models.CharField(max_length=80, help_text="the profile or trace")
    shape = models.ForeignKey(
        Shape, on_delete=models.CASCADE, related_name="served_calls"
    )
    tokens = models.PositiveIntegerField(
        default=0, help_text="tokens in the forward step; 0: not recorded"
    )
    calls = models.FloatField(help_text="calls per forward step")

    class Meta:
        ordering = ["source", "tokens", "shape"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "shape", "tokens"], name="served_call_unique"
            ),
            models.CheckConstraint(
                condition=Q(calls__gte=0), name="served_call_calls_nonnegative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source}: {self.shape} × {self.calls:g} at {self.tokens} tokens"


def fingerprint_of(components: dict) -> str:
    return canonical_sha256(components)


class Toolchain(models.Model):
    """A pinned set of TileLang, tvm-ffi, torch, device compiler, driver, Python."""

    name = models.CharField(max_length=80, unique=True)
    tilelang_version = models.CharField(max_length=40)
    components = models.JSONField(default=dict)
    fingerprint = models.CharField(max_length=64, unique=True)
    is_current = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-is_current", "-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(fingerprint__regex=r"^[0-9a-f]{64}$"),
                name="toolchain_fingerprint_hex",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def describe(self, hosts=()) -> str:
        """What the toolchain is, not only its hash: "TileLang 0.1.15 on
        h200-lab · torch 2.11.0 · driver nvidia 580.159.04 · e6efb837"."""
        components = self.components or {}
        parts = [f"TileLang {self.tilelang_version or 'unknown'}"]
        hosts = list(hosts)
        if hosts:
            shown = ", ".join(hosts[:2])
            more = f" +{len(hosts) - 2}" if len(hosts) > 2 else ""
            parts[0] += f" on {shown}{more}"
        if components.get("torch"):
            parts.append(f"torch {components['torch']}")
        if components.get("driver"):
            parts.append(f"driver {components['driver']}")
        parts.append(self.fingerprint[:8])
        return " · ".join(parts)


class Sweep(models.Model):
    """A batch of jobs planned together, so progress can be shown for it."""

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    filters = models.JSONField(default=dict)
    total = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"sweep {self.pk}"

    # An ETA follows the pace of the jobs finishing lately, not of the
    # sweep's whole life: a sweep may wait for a runner before its first job
    # starts, and a switch from lowering to validation changes the pace.
    PACE_WINDOW_S = 300
    # A runner starts many jobs at once and the first finish only after a
    # compile: a pace read off the first few results overstates the rest
    # eightfold (H100, 188 jobs, 2026-12-06). It is read once this many
    # have finished, or this share of the sweep.
    PACE_MIN_JOBS = 10
    PACE_MIN_SHARE = 0.05

    def progress(self, *, stage_seconds: dict[str, float] | None = None) -> dict:
        """Counts by job state, share finished, and an ETA: once enough jobs
        finished (``PACE_MIN_JOBS`` or ``PACE_MIN_SHARE``), at the pace of
        the last ``PACE_WINDOW_S`` (counted from the first job's start, not
        the sweep's creation); before that, from ``stage_seconds`` (what one
        job of each stage takes, as measured), where it names every stage
        left; else none. Two queries at most."""
        from django.utils import timezone

        now = timezone.now()
        counts: dict[str, int] = {}
        unfinished: dict[str, int] = {}
        rows = self.jobs.values_list("state", "stage").annotate(n=models.Count("id"))
        for state, stage, n in rows.order_by():
            counts[state] = counts.get(state, 0) + n
            if state in (JobState.QUEUED, JobState.RUNNING):
                unfinished[stage] = unfinished.get(stage, 0) + n
        done = counts.get(JobState.DONE, 0)
        failed = counts.get(JobState.FAILED, 0) + counts.get(JobState.LOST, 0)
        finished = done + failed
        total = self.total or sum(counts.values())
        eta, basis = None, ""
        paced = max(self.PACE_MIN_JOBS, math.ceil(total * self.PACE_MIN_SHARE))
        if min(paced, total) <= finished < total:
            eta, basis = self._eta_from_pace(now, finished, total), "pace"
        elif (
            finished < total and stage_seconds and set(unfinished) <= set(stage_seconds)
        ):
            eta = sum(n * stage_seconds[stage] for stage, n in unfinished.items())
            basis = "estimate"
        return {
            "total": total,
            "done": done,
            "failed": failed,
            "running": counts.get(JobState.RUNNING, 0),
            "queued": counts.get(JobState.QUEUED, 0),
            "finished": finished >= total,
            "percent": round(100 * finished / total) if total else 100,
            "eta_s": eta,
            # "pace": measured on this sweep; "estimate": from durations
            # measured elsewhere, before any of its jobs finished.
            "eta_basis": basis,
        }

    def _eta_from_pace(self, now, finished: int, total: int) -> float:
        from datetime import timedelta

        window_start = now - timedelta(seconds=self.PACE_WINDOW_S)
        pace = self.jobs.aggregate(
            first_start=models.Min("started_at"),
            first_finish=models.Min("finished_at"),
            recent=models.Count("id", filter=Q(finished_at__gte=window_start)),
        )
        start = pace["first_start"] or self.created_at
        # Counted from the first finish: the wait for the first results (a
        # compile, while many jobs start at once) is paid once, not per job.
        # An H100's fresh 188-job sweep read 2.35x its outcome counted from
        # the first start, 1.06x from the first finish (2026-12-06).
        since = max(pace["first_finish"] or start, window_start)
        seconds = (now - since).total_seconds()
        if pace["recent"] and seconds > 0:
            return (total - finished) * seconds / pace["recent"]
        # Nothing finished lately: the pace since the first start, which
        # slows down for as long as nothing finishes.
        elapsed = max((now - start).total_seconds(), 0.0)
        return (total - finished) * elapsed / finished


class JobQuerySet(models.QuerySet):
    def open(self):
        return self.filter(state__in=[JobState.QUEUED, JobState.RUNNING])


class JobState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    LOST = "lost"


class JobStage(models.TextChoices):
    LOWER = "lower"
    BUILD = "build"
    VALIDATE = "validate"


class ValidationJob(models.Model):
    """One cell's validation run; moves forward only."""

    State = JobState
    Stage = JobStage

    revision = models.ForeignKey(
        KernelRevision, on_delete=models.PROTECT, related_name="jobs"
    )
    shape = models.ForeignKey(Shape, on_delete=models.PROTECT, related_name="jobs")
    device_type = models.ForeignKey(
        DeviceType, on_delete=models.PROTECT, related_name="jobs"
    )
    toolchain = models.ForeignKey(
        Toolchain, on_delete=models.PROTECT, related_name="jobs"
    )
    stage = models.CharField(
        max_length=10, choices=Stage.choices, default=Stage.VALIDATE
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    attempt = models.PositiveSmallIntegerField(default=1)
    seed = models.PositiveIntegerField(default=0)
    queue = models.CharField(max_length=120, blank=True)
    # Looked up through the (sweep, ...) indexes below.
    sweep = models.ForeignKey(
        Sweep,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
        db_index=False,
    )
    runner = models.ForeignKey(
        "runners.Runner",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
    )
    # The failure this job reruns the cell to confirm, before a green cell
    # turns red (see matrix.fleet.services.ingest); null for every other job.
    confirms = models.ForeignKey(
        "Result",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="confirmed_by",
        db_index=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["state", "runner"]),
            models.Index(fields=["sweep", "state"]),
            # A sweep's latest claim, one index lookup: its progress is kept
            # until the next (matrix.cache.jobs_version).
            models.Index(fields=["sweep", "started_at"]),
        ]
        constraints = [
            choices_check("state", JobState, "job_state_valid"),
            choices_check("stage", JobStage, "job_stage_valid"),
            models.CheckConstraint(
                condition=Q(attempt__gte=1), name="job_attempt_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.state})"


class ResultQuerySet(models.QuerySet):
    def failing(self):
        return self.filter(status__in=FAILURES)

    def for_toolchain(self, toolchain):
        return self.filter(toolchain=toolchain)


class Result(models.Model):
    """What one job attempt produced. Stored once per (job, attempt)."""

    # No index of their own where an index of Meta leads with the column, or
    # where no query reads one (a toolchain or a revision is never deleted;
    # the admin shows them read-only): every result written maintains each
    # index of this table.
    job = models.ForeignKey(
        ValidationJob, on_delete=models.CASCADE, related_name="results", db_index=False
    )
    attempt = models.PositiveSmallIntegerField()
    # The cell, denormalized, so history and matrix reads need no job join.
    revision = models.ForeignKey(
        KernelRevision, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    shape = models.ForeignKey(
        Shape, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    device_type = models.ForeignKey(
        DeviceType, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    toolchain = models.ForeignKey(
        Toolchain, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    status = models.CharField(max_length=16, choices=Status.choices)
    stage_reached = models.CharField(max_length=10, blank=True)
    rel_err = models.FloatField(null=True, blank=True)
    max_abs_err = models.FloatField(null=True, blank=True)
    mismatch_ratio = models.FloatField(null=True, blank=True)
    compile_s = models.FloatField(null=True, blank=True)
    # The job's share of its runner's clock (harness ``timings.wall_s``):
    # what Run missing's estimates are made of.
    wall_s = models.FloatField(null=True, blank=True)
    kernel_ms = models.FloatField(null=True, blank=True)
    reference_ms = models.FloatField(null=True, blank=True)
    tflops = models.FloatField(null=True, blank=True)
    gbps = models.FloatField(null=True, blank=True)
    error_signature = models.CharField(max_length=64, blank=True)
    # The generated kernel source and the error message, each stored once
    # per SHA-256 (matrix/models/blobs.py): the same id is the same text.
    # No index: no query finds results by their text, and a blob is never
    # deleted.
    source = models.ForeignKey(
        Blob, models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )
    error = models.ForeignKey(
        Blob, models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )
    fingerprint = models.CharField(max_length=64, blank=True)
    details = models.JSONField(
        default=dict,
        blank=True,
        help_text="tolerance, target, timing samples, fingerprint components",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ResultQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The newest result of a device type's column on a toolchain, read
            # from the index alone (a cell page's version: matrix.cache).
            models.Index(
                fields=["device_type", "toolchain", "id"], name="result_column_newest"
            ),
            # The newest result of a cell's history, on any toolchain, from
            # the index alone: through the index above, a cell page's version
            # read one heap page per result of its history (433 at 1M).
            models.Index(
                fields=["shape", "device_type", "id"], name="result_history_newest"
            ),
            # The newest pass of each toolchain for a batch's cells, and
            # whether a cell ever passed (alert detection, every ingest):
            # through the index above, PostgreSQL read every result of
            # those cells' histories from the heap, 600 MB a batch at 10M.
            models.Index(
                fields=["shape", "device_type", "toolchain", "id"],
                condition=models.Q(status="pass"),
                name="result_pass_newest",
            ),
            # Equality only: db_index=True on a CharField would add a second,
            # LIKE-ready copy on PostgreSQL that no query reads.
            models.Index(fields=["error_signature"], name="result_signature"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt"], name="result_one_per_attempt"
            ),
            choices_check("status", Status, "result_status_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.shape} on {self.device_type}: {self.status}"

    # A page showing these selects ``source`` or ``error`` with the result,
    # else each is a query.
    @property
    def kernel_source(self) -> str:
        return self.source.text if self.source_id else ""

    @property
    def error_message(self) -> str:
        return self.error.text if self.error_id else ""


class CellQuerySet(models.QuerySet):
    def passing(self):
        return self.filter(status=Status.PASS)


class Cell(models.Model):
    """The latest result of one (shape, device type, toolchain)."""

    # Shape and toolchain need no index of their own: cell_unique leads with
    # the shape, cell_tally and cell_signature with the toolchain. A
    # toolchain index alone also misled the planner into reading a
    # toolchain's every cell (31k at 1M results) for one page of shapes.
    shape = models.ForeignKey(
        Shape, on_delete=models.CASCADE, related_name="cells", db_index=False
    )
    device_type = models.ForeignKey(
        DeviceType, on_delete=models.CASCADE, related_name="cells"
    )
    toolchain = models.ForeignKey(
        Toolchain, on_delete=models.CASCADE, related_name="cells", db_index=False
    )
    revision = models.ForeignKey(
        KernelRevision, on_delete=models.PROTECT, related_name="cells"
    )
    # No query looks a cell up by its result, and every upsert rewrote this
    # index (the newest result moves each time).
    result = models.ForeignKey(
        Result, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    status = models.CharField(max_length=16, choices=Status.choices)
    error_signature = models.CharField(max_length=64, blank=True)
    kernel_ms = models.FloatField(null=True, blank=True)
    reference_ms = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField()

    objects = CellQuerySet.as_manager()

    class Meta:
        indexes = [
            # The matrix's tallies per toolchain (queries.cell_groups), read
            # from the index alone, a device type column at a time.
            models.Index(
                fields=["toolchain", "device_type", "revision", "status"],
                name="cell_tally",
            ),
            # How many cells on a toolchain share an error signature (a cell
            # page's version counts them on every view), from the index alone.
            models.Index(
                fields=["toolchain", "error_signature"], name="cell_signature"
            ),
            # A signature's cells on every toolchain (the errors page with no
            # toolchain chosen); equality only, so no LIKE-ready copy.
            models.Index(fields=["error_signature"], name="cell_signature_any"),
            # Where a failing cell passes on another toolchain (the gaps and
            # Models reads; queries.passing_elsewhere), from the index alone:
            # 45 to 24 ms of a Models read at 1M results.
            models.Index(
                fields=["shape", "device_type", "toolchain", "revision"],
                condition=models.Q(status="pass"),
                name="cell_passing",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["shape", "device_type", "toolchain"], name="cell_unique"
            ),
            choices_check("status", Status, "cell_status_valid"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.shape} on {self.device_type} with {self.toolchain}: {self.status}"
        )


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise PermissionError("the audit log is append-only")

    def delete(self):
        raise PermissionError("the audit log is append-only")


class AuditEvent(models.Model):
    """Who did what, when, with the state before and after. Append-only."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    actor_label = models.CharField(max_length=150, help_text="user name or runner name")
    verb = models.CharField(max_length=60)
    object_type = models.CharField(max_length=60)
    object_id = models.CharField(max_length=64)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.actor_label} {self.verb} {self.object_type} {self.object_id}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise PermissionError("the audit log is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("the audit log is append-only")

    @classmethod
    def record(
        cls,
        *,
        actor=None,
        actor_label: str = "",
        verb: str,
        obj,
        before=None,
        after=None,
    ):
        label = actor_label or (actor.get_username() if actor is not None else "system")
        return cls.objects.create(
            actor=actor if actor is not None and actor.pk else None,
            actor_label=label,
            verb=verb,
            object_type=obj._meta.label_lower,
            object_id=str(obj.pk),
            before=before or {},
            after=after or {},
        )


# The upgrade gate's models live in their own module to keep this one short.
from matrix.models.alerts import Alert, AlertCell  # noqa: E402, F401
from matrix.models.bisection import (  # noqa: E402, F401
    Bisection,
    BisectionStep,
)
from matrix.models.gate import (  # noqa: E402, F401
    Approval,
    BackendException,
    DiffRow,
    ManifestEntry,
    ManifestSnapshot,
    Policy,
    SustainedSpeed,
    UpgradeProposal,
)
from matrix.models.notifications import (  # noqa: E402, F401
    Delivery,
    DeliveryAttempt,
    Notification,
    Subscription,
)
