"""Served gaps: the served cells that need work, classified, counted, ranked
and paged by the database.

A gap is a served cell (shape × device type, on one toolchain), or one of a
served shape's neighbours (``Shape.guards``, matrix/neighbours.py), whose latest
result is missing, stale (an older kernel revision, or a superseded
toolchain), failing, or evidence only (lowered or built: never run on the
device). A current pass is never a gap, and neither is a current
``unsupported`` (outside what the kernel declares: production uses the
reference there by design, an answer rather than work). Every gap has one
kind, so the kinds add up to the total. "No runner" (no online runner with
the device hosts the toolchain) is said of a gap, never a gap by itself.

The candidates are the served shapes × device types under the filters,
joined to the toolchain's cells and open jobs: as many as the catalogue
holds, whatever the number of stored results. The database classifies,
counts, orders and cuts them into pages, so a page builds its own rows only,
in a fixed number of queries.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import statistics
from dataclasses import dataclass, field

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Exists, Max, Min, OuterRef

from matrix import read_versions
from matrix.cache import cached_read
from matrix.models import (
    BACKEND_PRIORITY,
    EVIDENCE,
    FAILURES,
    ID_MAX,
    Cell,
    CurrentRevision,
    DeviceType,
    JobStage,
    JobState,
    Operator,
    Result,
    ServedCall,
    Shape,
    Status,
    Toolchain,
    ValidationJob,
)
from matrix.queries import EMPTY, STALE, MatrixFilters, state_label, status_kind

MISSING = "missing"
FAILING = "failing"
NOT_VALIDATED = "not validated"
NO_RUNNER = "no runner"
# Every gap has exactly one of these, in this order of precedence.
KINDS = (MISSING, STALE, FAILING, NOT_VALIDATED)
STAGES = (JobStage.VALIDATE, JobStage.BUILD, JobStage.LOWER)
# A backend missing from BACKEND_PRIORITY ranks below all of them.
OTHER_BACKEND_PRIORITY = 0.1
PAGE_SIZE = 100


# --- what Run missing would do ------------------------------------------------


@dataclass
class GapScope:
    """What a gap list is read under: the page's filters, what the online
    runners can take (``matrix.fleet.services.capabilities_online``), the device
    types by id, and whether cuda cells are built with nvcc (else lowered)
    where no online runner has the device."""

    filters: MatrixFilters
    capabilities: object
    device_types: dict[int, DeviceType]
    build: bool = False
    # gaps_version(), read once per request when a cached read needs it.
    version: tuple | None = None

    @property
    def toolchain_id(self) -> int | None:
        return self.filters.toolchain.pk if self.filters.toolchain else None

    @property
    def hosted(self) -> bool:
        """Some online runner hosts the toolchain: it takes these cells."""
        return self.toolchain_id in self.capabilities.hosted

    @property
    def nvcc(self) -> bool:
        """Some online runner with nvcc hosts the toolchain."""
        return self.toolchain_id in self.capabilities.nvcc

    def no_runner(self, device_type_id: int) -> bool:
        return (device_type_id, self.toolchain_id) not in self.capabilities.validate

    def stage(
        self,
        *,
        kind: str,
        status: str,
        device_type_id: int,
        queued: bool,
        build: bool | None = None,
    ) -> str | None:
        """The stage of the job Run missing plans for a gap; None when it
        plans none: a job is on its way, the toolchain is superseded (a
        fresh result would be stale too) or hosted by no online runner, or
        a compile-only run would add nothing."""
        if self.toolchain_id is None or queued or self.filters.toolchain_stale:
            return None
        device_type = self.device_types.get(device_type_id)
        stage = self.capabilities.stage_for(
            device_type_id=device_type_id,
            toolchain_id=self.toolchain_id,
            backend=device_type.backend if device_type else "",
            build=self.build if build is None else build,
        )
        if stage is None or stage == JobStage.VALIDATE:
            return stage
        # Without the device a run only compiles: planned where that brings
        # new evidence, never over a verdict a device gave on this revision
        # and toolchain (a lowering would hide a mismatch). An infra error
        # is the runner's trouble, so it is worth another try.
        if kind in (MISSING, STALE):
            return stage
        if kind == FAILING and status == Status.INFRA_ERROR:
            return stage
        if kind == NOT_VALIDATED and stage == JobStage.BUILD:
            return stage if status == Status.LOWERED else None
        return None


# --- the SQL ---------------------------------------------------------------

# Columns ordering the list, ascending, as compared in a cursor: heaviest
# served weight × backend priority first, then operator, shape and dtype,
# then the device types of one shape by priority and name.
ORDER_KEY = (
    "-(g.weight * g.priority)",
    "g.operator",
    "g.dims_key",
    "g.dtype",
    "-g.priority",
    "g.vendor",
    "g.model",
    "g.device_type_id",
)
KEY_TYPES = (float, str, str, str, float, str, str, int)


def _candidates_sql(scope: GapScope) -> tuple[str, list]:
    """SQL of every gap under the scope, one row each, unordered; and its
    parameters."""
    filters = scope.filters
    table = {
        "shape": Shape._meta.db_table,
        "operator": Operator._meta.db_table,
        "device_type": DeviceType._meta.db_table,
        "current": CurrentRevision._meta.db_table,
        "cell": Cell._meta.db_table,
        "job": ValidationJob._meta.db_table,
        "served_call": ServedCall._meta.db_table,
    }
    params: list = []
    priority = "CASE d.backend "
    for backend, value in BACKEND_PRIORITY.items():
        priority += "WHEN %s THEN CAST(%s AS DOUBLE PRECISION) "
        params += [backend, value]
    priority += "ELSE CAST(%s AS DOUBLE PRECISION) END"
    params.append(OTHER_BACKEND_PRIORITY)
    failures = ", ".join(["%s"] * len(FAILURES))
    evidence = ", ".join(["%s"] * len(EVIDENCE))
    params += [MISSING, filters.toolchain_stale, STALE]
    params += [*sorted(FAILURES), FAILING, *sorted(EVIDENCE), NOT_VALIDATED]
    params += [scope.toolchain_id, JobState.QUEUED, JobState.RUNNING]
    params += [scope.toolchain_id, True, True]
    where = ""
    if filters.dtype:
        where += " AND s.dtype = %s"
        params.append(filters.dtype)
    if filters.backend:
        where += " AND d.backend = %s"
        params.append(filters.backend)
    if filters.device_type is not None:
        where += " AND d.id = %s"
        params.append(filters.device_type.pk)
    if filters.operator:
        where += " AND o.name = %s"
        params.append(filters.operator)
    if filters.model:
        where += f" AND s.id IN (SELECT shape_id FROM {table['served_call']} WHERE source = %s)"
        params.append(filters.model)
    if filters.text:
        # As Django's icontains: the text is matched literally.
        where += " AND UPPER(s.dims_key) LIKE UPPER(%s) ESCAPE '\\'"
        escaped = re.sub(r"([\\%_])", r"\\\1", filters.text)
        params.append(f"%{escaped}%")
    status = ""
    if filters.status in (STALE, EMPTY):
        status = " AND g.kind = %s"
        params.append(STALE if filters.status == STALE else MISSING)
    elif filters.status:
        status = " AND g.status = %s"
        params.append(filters.status)
    # Open jobs are found by their state's index alone ("+ 0" keeps the
    # planner from also reading the toolchain's index, which lists every job
    # ever run on it: 20 times slower at 200,000 jobs).
    sql = f"""
        SELECT g.* FROM (
            SELECT s.id AS shape_id, d.id AS device_type_id, o.name AS operator,
                s.dims AS dims, s.dims_key AS dims_key, s.dtype AS dtype,
                s.weight AS weight, d.vendor AS vendor, d.model AS model,
                {priority} AS priority, c.status AS status,
                CASE
                    WHEN c.id IS NULL THEN %s
                    WHEN %s OR r.id IS NULL OR c.revision_id <> r.revision_id THEN %s
                    WHEN c.status IN ({failures}) THEN %s
                    WHEN c.status IN ({evidence}) THEN %s
                END AS kind,
                j.sweep_id AS open_sweep
            FROM {table["shape"]} s
            JOIN {table["operator"]} o ON o.id = s.operator_id
            CROSS JOIN {table["device_type"]} d
            LEFT JOIN {table["current"]} r
                ON r.operator_id = s.operator_id AND r.backend = d.backend
            LEFT JOIN {table["cell"]} c
                ON c.shape_id = s.id AND c.device_type_id = d.id
                AND c.toolchain_id = %s
            LEFT JOIN (
                SELECT shape_id, device_type_id,
                    MAX(COALESCE(sweep_id, 0)) AS sweep_id
                FROM {table["job"]}
                WHERE state IN (%s, %s) AND toolchain_id + 0 = %s
                GROUP BY shape_id, device_type_id
            ) j ON j.shape_id = s.id AND j.device_type_id = d.id
            WHERE (s.served = %s OR s.guards = %s){where}
        ) g
        WHERE g.kind IS NOT NULL{status}
    """
    return sql, params


def _fetch(sql: str, params: list) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


# --- the cache -------------------------------------------------------------

# Keyed by the data version, so a stale entry is never read: the time only
# bounds what the cache holds.
CACHE_S = 300


def gaps_version() -> tuple:
    """Changes whenever a gap list can have changed: a stored result (a cell
    moved on, a job ended), a planned job, an edit of the served shapes, a
    current revision or a device type. One query: index lookups and a pass
    over the shapes. What the runners can take is not part of it: a page
    applies that to what it reads from the cache."""
    shape, current = Shape._meta.db_table, CurrentRevision._meta.db_table
    # The served shapes and their neighbours in one pass over the table.
    served = (
        "SELECT CAST(COUNT(*) AS TEXT) || ',' || CAST(SUM(id) AS TEXT) || ','"
        f" || CAST(SUM(weight) AS TEXT) FROM {shape} WHERE served = %s OR guards = %s"
    )
    # With a shared cache, every result's counter in place of the newest
    # result id (read_versions): gaps name cells passing on other toolchains.
    newest = f"SELECT MAX(id) FROM {Result._meta.db_table}"
    if read_versions.shared():
        newest = "SELECT 0"
    sql = f"""
        SELECT ({newest}),
            (SELECT MAX(id) FROM {ValidationJob._meta.db_table}),
            ({served}),
            (SELECT SUM(id * revision_id) FROM {current}),
            (SELECT COUNT(*) FROM {DeviceType._meta.db_table}),
            (SELECT SUM(id) FROM {DeviceType._meta.db_table}),
            (SELECT MAX(id) FROM {Toolchain._meta.db_table} WHERE is_current)
    """
    version = tuple(_fetch(sql, [True, True])[0])
    if read_versions.shared():
        version = (read_versions.scope_version(), *version[1:])
    return version


def current_toolchain_in(version: tuple) -> int | None:
    """The current toolchain's id as ``gaps_version()`` read it (last)."""
    return version[-1]


def _cached(scope: GapScope, read: tuple, compute):
    """``compute()``, or what it returned for the same read of the same
    gap list at the same data version."""
    if scope.version is None:
        scope.version = gaps_version()
    filters = scope.filters
    key = repr(
        (
            read,
            scope.toolchain_id,
            filters.toolchain_stale,
            filters.dtype,
            filters.backend,
            filters.status,
            filters.device_type.pk if filters.device_type else None,
            filters.operator,
            filters.model,
            filters.text,
            scope.version,
        )
    )
    key = "gaps:" + hashlib.sha256(key.encode()).hexdigest()
    return cached_read(key, compute, CACHE_S)


# --- counts ----------------------------------------------------------------


@dataclass
class GapSummary:
    total: int = 0
    # Gaps of each kind, in KINDS order: they add up to ``total``.
    kinds: dict[str, int] = field(default_factory=dict)
    no_runner: int = 0
    queued: int = 0
    # The newest sweep with a job open for one of the gaps, and whether
    # others (older sweeps, an upgrade's jobs) hold some too.
    newest_sweep: int | None = None
    queued_elsewhere: bool = False
    # stage -> device type id -> jobs Run missing plans: lowering where no
    # online runner has the device, and with nvcc builds instead.
    plan: dict[str, dict[int, int]] = field(default_factory=dict)
    build_plan: dict[str, dict[int, int]] = field(default_factory=dict)

    @property
    def runnable(self) -> int:
        return sum(n for per_type in self.plan.values() for n in per_type.values())

    @property
    def validating(self) -> int:
        return sum(self.plan.get(JobStage.VALIDATE, {}).values())

    @property
    def compile_only(self) -> int:
        return self.runnable - self.validating

    @property
    def reasons(self) -> dict[str, int]:
        """Gaps per reason: the kinds, then "no runner", which overlaps them."""
        reasons = {kind: n for kind, n in self.kinds.items() if n}
        if self.no_runner:
            reasons[NO_RUNNER] = self.no_runner
        return reasons


def _summary_groups(scope: GapScope) -> list[tuple]:
    """The whole list's gaps counted by kind, device type, status and whether
    a sweep holds them: one grouped query, kept per data version."""
    candidates, params = _candidates_sql(scope)
    sql = f"""
        SELECT g.kind, g.device_type_id, g.status, g.open_sweep IS NOT NULL,
            COUNT(*), MIN(g.open_sweep), MAX(g.open_sweep)
        FROM ({candidates}) g
        GROUP BY g.kind, g.device_type_id, g.status, g.open_sweep IS NOT NULL
    """
    return _cached(scope, ("summary",), lambda: _fetch(sql, params))


def gap_extent(scope: GapScope) -> tuple[int, int | None]:
    """How many gaps the list holds and the newest sweep holding some: what a
    kept page's key needs, without planning each group as the summary does
    (most of what a gaps page view served from the cache still cost)."""
    total = newest = 0
    for _kind, _dt_id, _status, queued, n, _low, high in _summary_groups(scope):
        total += n
        if queued:
            newest = max(newest, high)
    return total, newest or None


def gap_summary(scope: GapScope) -> GapSummary:
    """The counts of the whole list, by kind and by what Run missing would
    plan for it."""
    summary = GapSummary(kinds=dict.fromkeys(KINDS, 0))
    oldest = None
    groups = _summary_groups(scope)
    for kind, dt_id, status, queued, n, low, high in groups:
        queued = bool(queued)
        summary.total += n
        summary.kinds[kind] += n
        summary.no_runner += n if scope.no_runner(dt_id) else 0
        if queued:
            summary.queued += n
            oldest = low if oldest is None else min(oldest, low)
            summary.newest_sweep = max(summary.newest_sweep or 0, high) or None
        for plan, build in ((summary.plan, False), (summary.build_plan, True)):
            stage = scope.stage(
                kind=kind,
                status=status or EMPTY,
                device_type_id=dt_id,
                queued=queued,
                build=build,
            )
            if stage is not None:
                per_type = plan.setdefault(stage, {})
                per_type[dt_id] = per_type.get(dt_id, 0) + n
    if summary.queued:
        summary.queued_elsewhere = oldest != (summary.newest_sweep or 0)
    return summary


# --- rows ------------------------------------------------------------------


@dataclass(slots=True)
class Gap:
    rank: int
    shape_id: int
    device_type: DeviceType
    operator: str
    dims: dict
    dims_key: str
    dtype: str
    weight: float
    status: str  # a Status, or EMPTY: never run
    kind: str
    score: float
    no_runner: bool
    queued: bool
    # The newest sweep with a job open for it; None when none holds one.
    sweep_id: int | None
    # The stage of the job Run missing plans for it; None: it plans none.
    stage: str | None
    # Its place in the order (see ORDER_KEY).
    key: tuple
    # Failing here, its revision passing on another toolchain
    # (queries.PassesOn); set for a page's rows only.
    passes_on: tuple | None = None

    @property
    def cursor(self) -> str:
        """Where the page after this row starts."""
        return cursor_encode(self.key)

    @property
    def reasons(self) -> list[str]:
        return [self.kind, NO_RUNNER] if self.no_runner else [self.kind]

    @property
    def runnable(self) -> bool:
        return self.stage is not None

    @property
    def stale(self) -> bool:
        return self.kind == STALE

    @property
    def label(self) -> tuple[str, str, str]:
        return state_label(self.status)

    @property
    def status_kind(self) -> str:
        return status_kind(self.status)


def cursor_encode(key: tuple) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def cursor_decode(text: str) -> tuple | None:
    """The ordering key a cursor holds; None when it is not one this module
    gave out."""
    try:
        key = json.loads(base64.urlsafe_b64decode(text.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error):
        return None
    if not isinstance(key, list) or len(key) != len(KEY_TYPES):
        return None
    for value, kind in zip(key, KEY_TYPES, strict=True):
        allowed = (int, float) if kind is float else kind
        if isinstance(value, bool) or not isinstance(value, allowed):
            return None
        # NaN compares false with everything; an id past 64 bits fails in SQLite.
        if kind is not str and not (math.isfinite(value) and abs(value) <= ID_MAX):
            return None
    return tuple(key)


def gap_page(
    scope: GapScope,
    *,
    limit: int = PAGE_SIZE,
    offset: int = 0,
    after: tuple | None = None,
) -> list[Gap]:
    """One page of gaps in rank order: ``limit`` rows from ``offset``, or
    after the row whose cursor key is ``after`` (stable while rows come and
    go). One query; Gap objects for this page's rows only."""
    candidates, params = _candidates_sql(scope)
    keyed = ""
    if after is not None:
        keyed = f" WHERE ({', '.join(ORDER_KEY)}) > ({', '.join(['%s'] * len(after))})"
        params = [*params, *after]
    sql = f"""
        SELECT g.shape_id, g.device_type_id, g.operator, g.dims, g.dims_key,
            g.dtype, g.weight, g.status, g.kind, g.open_sweep,
            g.weight * g.priority, {", ".join(ORDER_KEY)}
        FROM ({candidates}) g{keyed}
        ORDER BY {", ".join(ORDER_KEY)}
        LIMIT %s OFFSET %s
    """
    rows = _cached(
        scope,
        ("page", limit, offset, after),
        lambda: _fetch(sql, [*params, limit, offset]),
    )
    dims_field = Shape._meta.get_field("dims")
    gaps = []
    for i, row in enumerate(rows):
        shape_id, dt_id, operator, dims, dims_key, dtype, weight = row[:7]
        status, kind, open_sweep, score = row[7:11]
        queued = open_sweep is not None
        status = status or EMPTY
        gaps.append(
            Gap(
                rank=offset + i + 1,
                shape_id=shape_id,
                device_type=scope.device_types[dt_id],
                operator=operator,
                dims=dims_field.from_db_value(dims, None, connection),
                dims_key=dims_key,
                dtype=dtype,
                weight=weight,
                status=status,
                kind=kind,
                score=score,
                no_runner=scope.no_runner(dt_id),
                queued=queued,
                sweep_id=open_sweep or None,
                stage=scope.stage(
                    kind=kind, status=status, device_type_id=dt_id, queued=queued
                ),
                key=tuple(row[11:]),
            )
        )
    return gaps


def gaps_all(scope: GapScope, *, chunk: int = 2000):
    """Every gap in rank order, read a chunk at a time after the last one's
    cursor (for a download)."""
    after = None
    while True:
        page = gap_page(scope, limit=chunk, after=after)
        yield from page
        if len(page) < chunk:
            return
        after = page[-1].key


def runnable_cells(scope: GapScope) -> list[tuple[int, int]]:
    """(shape id, device type id) of every gap Run missing plans a job for."""
    candidates, params = _candidates_sql(scope)
    sql = f"SELECT g.shape_id, g.device_type_id, g.kind, g.status, g.open_sweep FROM ({candidates}) g"
    return [
        (shape_id, dt_id)
        for shape_id, dt_id, kind, status, open_sweep in _fetch(sql, params)
        if scope.stage(
            kind=kind,
            status=status or EMPTY,
            device_type_id=dt_id,
            queued=open_sweep is not None,
        )
        is not None
    ]


# --- how long it takes -------------------------------------------------------

# What a job of each stage is taken to cost a runner before any was
# measured. A runner runs jobs side by side, so this is its time per job,
# not one job's wall time: 0.87 s a validation on an H100 (188 served cells
# in 164 s, 2026-12-06), 0.53 s a job in the demo's Run missing on a 2-core
# CPU (752 jobs, mostly lowerings, in 402 s); an nvcc build takes 15 to
# 34 s of wall time, a few side by side.
DEFAULT_STAGE_S = {JobStage.LOWER: 0.5, JobStage.BUILD: 10.0, JobStage.VALIDATE: 1.0}
# The newest results the medians are taken over: a bounded read however
# many are stored, recent enough to follow a new runner or toolchain.
DURATION_SAMPLE = 3000
DURATIONS_CACHE_S = 60


@dataclass
class Durations:
    """Median seconds a job takes, with how many runs it was measured on,
    by (stage, device type id), (stage, backend) and stage."""

    by_device_type: dict[tuple[str, int], tuple[float, int]]
    by_backend: dict[tuple[str, str], tuple[float, int]]
    by_stage: dict[str, tuple[float, int]]

    def each(self, stage: str, device_type: DeviceType) -> tuple[float, int, tuple]:
        """Seconds a job of ``stage`` for ``device_type`` takes, the runs
        measured (0: the stage's default) and the key they were found under."""
        for key, found in (
            ((stage, device_type.pk), self.by_device_type),
            ((stage, device_type.backend), self.by_backend),
        ):
            if key in found:
                return (*found[key], key)
        return DEFAULT_STAGE_S[stage], 0, (stage,)

    def per_stage(self) -> dict[str, float]:
        """Seconds a job of each stage takes, whatever its device type,
        for the stages measured: a sweep's ETA is not made of guesses."""
        return {
            stage: self.by_stage[stage][0] for stage in STAGES if stage in self.by_stage
        }


# A runner's pace is measured on runs of at least this many jobs of one
# stage and device type in one sweep: fewer say little about a batch.
PACE_RUN_MIN = 5


def job_durations() -> Durations:
    """Seconds of a runner's time a job takes: the medians of recent runs'
    paces (a sweep's jobs of one stage and device type on one runner, from
    its first start to its last finish, over the jobs). Not one job's wall
    time: a runner runs jobs side by side, and a fresh H100 sweep's first
    estimate made of wall times put its end 12x too late (2026-12-06).
    Cached a minute: an estimate, not a measurement."""
    found = cache.get("gaps:job-durations")
    if found is not None:
        return found
    samples = _paces(_runs())

    def medians(keys):
        return {k: (statistics.median(samples[k]), len(samples[k])) for k in keys}

    found = Durations(
        medians(k for k in samples if isinstance(k, tuple) and isinstance(k[1], int)),
        medians(k for k in samples if isinstance(k, tuple) and isinstance(k[1], str)),
        medians(k for k in samples if isinstance(k, str)),
    )
    cache.set("gaps:job-durations", found, DURATIONS_CACHE_S)
    return found


def _runs():
    """The runs of the newest DURATION_SAMPLE results' jobs: a sweep's jobs
    of one stage and device type on one runner, each with its job count,
    first start and last finish. Grouped by the database: a few hundred
    rows, where reading the jobs one by one (3,000 rows, two timestamps
    each) was a third of an uncached gaps page at 1M results."""
    recent = Result.objects.order_by("-id").values("job_id")[:DURATION_SAMPLE]
    # A sweep still running is no run yet: its first results, read as a
    # pace, put an H100's cold sweep's end 2.61x too late (2026-12-06).
    running = ValidationJob.objects.open().filter(sweep_id=OuterRef("sweep_id"))
    return (
        ValidationJob.objects.filter(
            pk__in=recent,
            sweep__isnull=False,
            runner__isnull=False,
            started_at__isnull=False,
            finished_at__isnull=False,
        )
        # An offline bundle's jobs start when planned and finish when their
        # results come home (an evidence import: both at once): no pace.
        .exclude(queue__startswith="bundle.")
        .exclude(Exists(running))
        .values("sweep_id", "runner_id", "stage", "device_type_id")
        .annotate(
            jobs=Count("id"),
            first=Min("started_at"),
            last=Max("finished_at"),
        )
        .filter(jobs__gte=PACE_RUN_MIN)
        .order_by()
        .values_list(
            "stage", "device_type_id", "device_type__backend", "jobs", "first", "last"
        )
    )


def _paces(runs) -> dict[tuple | str, list[float]]:
    """Seconds a job of each (stage, device type), (stage, backend) and
    stage, one sample per run (``_runs``): from the run's first start to
    its last finish, over its jobs."""
    paces: dict[tuple | str, list[float]] = {}
    for stage, dt_id, backend, n, first, last in runs:
        span = (last - first).total_seconds()
        if span <= 0:
            continue
        for key in ((stage, dt_id), (stage, backend), stage):
            paces.setdefault(key, []).append(span / n)
    return paces


@dataclass
class StagePlan:
    stage: str
    jobs: int
    seconds: float
    # Jobs whose estimate comes from measured runs, and how many runs.
    measured_jobs: int
    runs: int

    @property
    def time(self) -> str:
        return duration_text(self.seconds)

    @property
    def basis(self) -> str:
        if self.measured_jobs == self.jobs:
            return f"median of {self.runs} recent run{'s' if self.runs != 1 else ''}"
        default = f"{DEFAULT_STAGE_S[self.stage]:g} s"
        if not self.measured_jobs:
            return f"nothing measured yet: {default} a job assumed"
        return (
            f"measured for {self.measured_jobs} of them ({self.runs} recent runs), "
            f"{default} a job assumed for the rest"
        )


def plan_preview(
    plan: dict[str, dict[int, int]],
    durations: Durations,
    device_types: dict[int, DeviceType],
) -> list[StagePlan]:
    """Jobs and estimated runner time per stage, validate, build, lower."""
    stages = []
    for stage in STAGES:
        per_type = plan.get(stage)
        if not per_type:
            continue
        row = StagePlan(stage, 0, 0.0, 0, 0)
        # Device types of one backend may share their backend's runs.
        runs = {}
        for dt_id, n in per_type.items():
            each, measured, key = durations.each(stage, device_types[dt_id])
            row.jobs += n
            row.seconds += n * each
            if measured:
                row.measured_jobs += n
                runs[key] = measured
        row.runs = sum(runs.values())
        stages.append(row)
    return stages


def duration_text(seconds: float | None) -> str:
    """3 s, 4 min, 1 h 20 min."""
    if seconds is None:
        return ""
    if seconds < 90:
        return f"{max(round(seconds), 1)} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
