"""Planning: choosing cells, routing them to queues, writing their jobs and
sending them, signed, to the runners (or in a bundle for an offline lab)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from matrix.fleet import bulk, keys  # noqa: F401 (bulk registers the __any lookup)
from matrix.fleet.models import Runner, RunnerToolchain, compile_queue, validate_queue
from matrix.models import (
    Backend,
    Cell,
    CurrentRevision,
    DeviceType,
    JobStage,
    JobState,
    KernelRevision,
    Result,
    Shape,
    Sweep,
    Toolchain,
    ValidationJob,
)
from runners import config, protocol, signing

log = logging.getLogger(__name__)
JOBS_PER_MESSAGE_MIN = 5
JOBS_PER_MESSAGE_MAX = 25


def _ids(cells) -> list[tuple[int, int, int]]:
    def pk(x):
        return x if isinstance(x, int) else x.pk

    return [(pk(s), pk(d), pk(t)) for s, d, t in cells]


def cells_select(
    *,
    operator: str | None = None,
    device_type: str | int | None = None,
    toolchain: str | None = None,
    served_only: bool = False,
    missing_only: bool = False,
) -> list[tuple[int, int, int]]:
    """Cells as (shape id, device type id, toolchain id). Without a
    toolchain: the current ones and those a routable runner hosts. A device
    type is an id, a backend (``c``, ``cuda``) or part of its model name."""
    shapes = Shape.objects.all()
    if operator:
        shapes = shapes.filter(operator__name=operator)
    if served_only:
        shapes = shapes.served()
    device_types = DeviceType.objects.all()
    if device_type not in (None, ""):
        device_types = device_types.named(device_type)
    toolchains = Toolchain.objects.all()
    if toolchain:
        toolchains = toolchains.filter(name=toolchain)
    else:
        toolchains = toolchains.filter(
            Q(is_current=True) | Q(runners__in=Runner.objects.routable())
        ).distinct()
    shape_ids = list(shapes.values_list("id", flat=True))
    dt_ids = list(device_types.values_list("id", flat=True))
    tc_ids = list(toolchains.values_list("id", flat=True))
    cells = [(s, d, t) for s in shape_ids for d in dt_ids for t in tc_ids]
    if missing_only and cells:
        have = set(
            Cell.objects.filter(
                shape_id__in=shape_ids,
                device_type_id__in=dt_ids,
                toolchain_id__in=tc_ids,
            ).values_list("shape_id", "device_type_id", "toolchain_id")
        )
        cells = [c for c in cells if c not in have]
    return cells


@dataclass(frozen=True)
class Route:
    stage: str
    queue: str


@dataclass(frozen=True)
class Capabilities:
    """What the online runners can take now."""

    # (device type, toolchain) pairs some online runner validates on.
    validate: frozenset[tuple[int, int]]
    # Toolchains some online runner hosts: it lowers their cells for any device.
    hosted: frozenset[int]
    # Toolchains some online runner with nvcc hosts: it builds cuda cells.
    nvcc: frozenset[int]

    def stage_for(
        self, *, device_type_id: int, toolchain_id: int, backend: str, build: bool
    ) -> str | None:
        """The stage a job for this cell would run to, None when no online
        runner hosts the toolchain. Without the device, a cell is lowered:
        an nvcc build of a cuda cell costs many times a lowering (15 to 34 s
        against about 2 on a laptop) and is planned only when ``build`` asks
        for it."""
        if (device_type_id, toolchain_id) in self.validate:
            return JobStage.VALIDATE
        if toolchain_id not in self.hosted:
            return None
        if build and backend == Backend.CUDA and toolchain_id in self.nvcc:
            return JobStage.BUILD
        return JobStage.LOWER


def capabilities_online() -> Capabilities:
    """Read what the online runners have: one query, a row per (toolchain
    hosted, device type had) of each online runner (None for a runner with
    no device type)."""
    sql, params, convert = _hosts_query(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        hosts = convert(cursor.fetchall())
    validate, hosted, nvcc = set(), set(), set()
    for toolchain_id, has_nvcc, device_type_id in hosts:
        hosted.add(toolchain_id)
        if has_nvcc:
            nvcc.add(toolchain_id)
        if device_type_id is not None:
            validate.add((device_type_id, toolchain_id))
    return Capabilities(frozenset(validate), frozenset(hosted), frozenset(nvcc))


@functools.cache
def _hosts_query(vendor: str):
    """``capabilities_online``'s query, compiled once per process (building
    it through the ORM was about 1.5 ms of every gaps page view and API gaps
    answer, both served from the cache otherwise): its SQL, its parameters
    and what turns its rows into the values the ORM would give."""
    hosts = RunnerToolchain.objects.filter(
        runner__in=Runner.objects.online()
    ).values_list("toolchain_id", "runner__inventory__nvcc", "runner__device_types")
    compiler = hosts.query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    converters = compiler.get_converters([col for col, _, _ in compiler.select])

    def convert(rows: list) -> list:
        return list(compiler.apply_converters(rows, converters)) if converters else rows

    return sql, tuple(params), convert


def routes_for(
    *, pairs: set[tuple[int, int]], build: bool = False
) -> dict[tuple[int, int], Route]:
    """Where the jobs of each (device type, toolchain) go: validation on a
    runner that has the device, else compile-only work any runner hosting the
    toolchain may take: lowering, or with ``build`` an nvcc build of a cuda
    cell where a runner with nvcc hosts the toolchain."""
    capabilities = capabilities_online()
    backends = dict(
        DeviceType.objects.filter(pk__in={d for d, _ in pairs}).values_list(
            "id", "backend"
        )
    )
    routes = {}
    for d, t in pairs:
        stage = capabilities.stage_for(
            device_type_id=d, toolchain_id=t, backend=backends.get(d, ""), build=build
        )
        if stage == JobStage.VALIDATE:
            queue = validate_queue(device_type_id=d, toolchain_id=t)
        else:
            stage = stage or JobStage.LOWER
            queue = compile_queue(toolchain_id=t, nvcc=stage == JobStage.BUILD)
        routes[d, t] = Route(stage, queue)
    return routes


def _revision_part(revision: KernelRevision) -> dict:
    """What a job's payload says of its kernel revision."""
    part = {
        "operator": revision.operator.name,
        "source_sha256": revision.source_sha256,
        "library": revision.origin == KernelRevision.Origin.LIBRARY,
    }
    if not part["library"]:
        # A reviewed submission travels with its text; the harness checks
        # it against the hash and runs it in a child of its own.
        part["source"] = revision.source
    return part


def _payload(job: dict, revision: dict, shape: dict, target: dict, toolchain: str):
    """One job's payload from its row (``job``: pk, attempt, stage, seed)
    and the parts it shares with other jobs."""
    return {
        "job": job["pk"],
        "attempt": job["attempt"],
        "operator": revision["operator"],
        "shape": shape["dims"],
        "dtype": shape["dtype"],
        "target": target,
        "stage": job["stage"],
        "seed": job["seed"],
        "source_sha256": revision["source_sha256"],
        "toolchain": toolchain,
        "library": revision["library"],
        **({} if revision["library"] else {"source": revision["source"]}),
    }


def job_payload(job: ValidationJob) -> dict:
    """What a runner needs to run one job, so it trusts nothing it did not
    verify."""
    return _payload(
        {"pk": job.pk, "attempt": job.attempt, "stage": job.stage, "seed": job.seed},
        _revision_part(job.revision),
        {"dims": job.shape.dims, "dtype": job.shape.dtype},
        job.device_type.target,
        job.toolchain.fingerprint,
    )


def _envelope(payloads: list[dict]) -> dict:
    return signing.envelope_sign(
        payload={"kind": "jobs", "jobs": payloads},
        signer=signing.SERVER_SIGNER,
        key=keys.server_key(),
    )


def jobs_envelope(jobs: list[ValidationJob]) -> dict:
    """One server-signed message for a few jobs of one queue."""
    return _envelope([job_payload(job) for job in jobs])


def _chunks(queued: list[tuple[str, object]]) -> list[tuple[str, list]]:
    by_queue: dict[str, list] = {}
    for queue, item in queued:
        by_queue.setdefault(queue, []).append(item)
    chunks = []
    for queue, items in by_queue.items():
        size = min(JOBS_PER_MESSAGE_MAX, max(JOBS_PER_MESSAGE_MIN, -(-len(items) // 8)))
        chunks += [(queue, items[i : i + size]) for i in range(0, len(items), size)]
    return chunks


def job_chunks(jobs: list[ValidationJob]) -> list[tuple[str, list[ValidationJob]]]:
    """Jobs grouped by queue into messages: one message, one signature and
    one harness child (one TileLang import) per chunk rather than per job.
    A queue's jobs make at least eight messages while chunks stay above
    JOBS_PER_MESSAGE_MIN, so a sweep still spreads over the runners on it."""
    return _chunks([(job.queue, job) for job in jobs])


def jobs_publish(jobs: list[ValidationJob]) -> None:
    """Sign and enqueue jobs once the transaction that wrote them commits."""
    messages = [
        (queue, [job_payload(j) for j in chunk]) for queue, chunk in job_chunks(jobs)
    ]
    _messages_publish(messages)
    _planned_log(messages, {job.pk: job.sweep_id for job in jobs})


def _planned_log(messages: list[tuple[str, list[dict]]], sweeps: dict) -> None:
    """A line a job planned, with its id as a field: in JSON logs the same
    job_id finds its run on the runner and its storage (ingest)."""
    for queue, payloads in messages:
        for payload in payloads:
            log.info(
                "job %s planned on %s",
                payload["job"],
                queue,
                extra={
                    "job_id": payload["job"],
                    "attempt": payload["attempt"],
                    "sweep_id": sweeps.get(payload["job"]),
                    "queue": queue,
                },
            )


def _messages_publish(messages: list[tuple[str, list[dict]]]) -> None:
    """Sign each message of payloads now and enqueue them all once the
    transaction commits, over one broker connection, in one batch."""
    from matrix.celery import app

    signed = [
        (queue, len(payloads), _envelope(payloads)) for queue, payloads in messages
    ]

    def publish():
        # One round trip for every message where the broker takes batches
        # (Redis: a pipeline), one per message elsewhere.
        with app.producer_or_acquire() as producer, producer.batch():
            for queue, count, envelope in signed:
                soft = count * config.job_budget_s() + 60
                # By name: the task is the runner agent's (runners.jobs).
                app.signature(protocol.EXECUTE_JOB).apply_async(
                    args=[envelope],
                    queue=queue,
                    producer=producer,
                    soft_time_limit=soft,
                    time_limit=soft + 60,
                    # A short label instead of Celery's repr of the whole
                    # envelope, which cost more than the publish itself.
                    argsrepr=f"{count} jobs",
                    kwargsrepr="{}",
                )

    transaction.on_commit(publish)


@dataclass
class Plannable:
    """The cells that can get a job now, and what their jobs share: the
    revision current on each cell's backend, and the payload parts of revisions,
    shapes, device types and toolchains (read once, not per job)."""

    cells: list[tuple[int, int, int]]
    revision_of: dict[tuple[int, int], int]  # (shape, device type) -> revision
    revisions: dict[int, dict]
    shapes: dict[int, dict]
    targets: dict[int, dict]
    toolchains: dict[int, str]

    def payloads(self, jobs: list[dict]) -> list[tuple[str, dict]]:
        """(queue, payload) of each job row, in order."""
        return [
            (
                job["queue"],
                _payload(
                    job,
                    self.revisions[job["revision_id"]],
                    self.shapes[job["shape_id"]],
                    self.targets[job["device_type_id"]],
                    self.toolchains[job["toolchain_id"]],
                ),
            )
            for job in jobs
        ]


def _plannable(wanted: list[tuple[int, int, int]]) -> Plannable:
    """The cells that can get a job now: no open job, an approved current
    revision. Rows and values only: a sweep of 10,000 cells spent most of
    its time building model instances."""
    shape_ids = {s for s, _, _ in wanted}
    # Thousands of ids: one array parameter each (matrix.fleet.bulk), not a
    # placeholder per id.
    open_cells = set(
        ValidationJob.objects.open()
        .filter(shape__pk__any=shape_ids)
        .values_list("shape_id", "device_type_id", "toolchain_id")
    )
    shapes = {
        pk: (operator, {"dims": dims, "dtype": dtype})
        for pk, operator, dims, dtype in Shape.objects.filter(
            pk__any=shape_ids
        ).values_list("id", "operator_id", "dims", "dtype")
    }
    # The revision current on each backend (matrix.revisions).
    current = {
        (c.operator_id, c.backend): c.revision
        for c in CurrentRevision.objects.filter(
            revision__review_state=KernelRevision.Review.APPROVED,
            operator_id__in={op for op, _ in shapes.values()},
        ).select_related("revision__operator")
    }
    device_types = DeviceType.objects.filter(pk__in={d for _, d, _ in wanted})
    targets = {d.pk: d.target for d in device_types}
    backends = {d.pk: d.backend for d in device_types}
    revision_of = {}
    for s, d, _ in wanted:
        if s in shapes and d in backends:
            revision = current.get((shapes[s][0], backends[d]))
            if revision is not None:
                revision_of[s, d] = revision.pk
    toolchains = dict(
        Toolchain.objects.filter(pk__in={t for _, _, t in wanted}).values_list(
            "id", "fingerprint"
        )
    )
    cells = [
        (s, d, t)
        for s, d, t in wanted
        if (s, d, t) not in open_cells
        and s in shapes
        and d in targets
        and t in toolchains
        and (s, d) in revision_of
    ]
    return Plannable(
        cells=cells,
        revision_of=revision_of,
        revisions={r.pk: _revision_part(r) for r in current.values()},
        shapes={s: part for s, (_, part) in shapes.items()},
        targets=targets,
        toolchains=toolchains,
    )


# Written explicitly; any other column gets its field's default.
JOB_FIELDS = (
    "revision_id",
    "shape_id",
    "device_type_id",
    "toolchain_id",
    "stage",
    "state",
    "attempt",
    "seed",
    "queue",
    "sweep_id",
    "runner_id",
    "created_at",
    "started_at",
    "confirms_id",
)


def jobs_insert(plan: Plannable, **fields) -> list[dict]:
    """Insert a job for each plannable cell and return their rows (with
    ``pk``). ``fields``: what every job shares (``sweep_id``, ``state`` ...),
    and ``route``, a function of (device type id, toolchain id) giving the
    job's stage and queue. On PostgreSQL the ids are drawn from the
    sequence in one query and the rows sent with COPY: Django's bulk_create
    spent most of a 10,000-job sweep preparing values one field at a time,
    and an INSERT from arrays dumping them."""
    route = fields.pop("route")
    # Fields of single cells' jobs, by (shape, device type, toolchain).
    per_cell = fields.pop("per_cell", {})
    shared = {
        "state": JobState.QUEUED,
        "attempt": 1,
        "seed": 0,
        "sweep_id": None,
        "runner_id": None,
        "created_at": timezone.now(),
        "started_at": None,
        "confirms_id": None,
        **fields,
    }
    rows = []
    for s, d, t in plan.cells:
        stage, queue = route(d, t)
        rows.append(
            {
                **shared,
                "revision_id": plan.revision_of[s, d],
                "shape_id": s,
                "device_type_id": d,
                "toolchain_id": t,
                "stage": stage,
                "queue": queue,
                **per_cell.get((s, d, t), {}),
            }
        )
    if not rows:
        return rows
    if connection.vendor != "postgresql":
        jobs = ValidationJob.objects.bulk_create(
            ValidationJob(**{f: row[f] for f in JOB_FIELDS}) for row in rows
        )
        for row, job in zip(rows, jobs, strict=True):
            row["pk"] = job.pk
        return rows
    meta = ValidationJob._meta
    others = [
        f
        for f in meta.concrete_fields
        if not f.primary_key and f.attname not in JOB_FIELDS
    ]
    defaults = tuple(
        f.get_db_prep_save(f.get_default() if f.has_default() else None, connection)
        for f in others
    )
    names = ", ".join(["id", *JOB_FIELDS, *(f.column for f in others)])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) "
            "FROM generate_series(1, %s)",
            [meta.db_table, len(rows)],
        )
        ids = [pk for (pk,) in cursor.fetchall()]
        with cursor.copy(f"COPY {meta.db_table} ({names}) FROM STDIN") as copy:
            for pk, row in zip(ids, rows, strict=True):
                row["pk"] = pk
                copy.write_row((pk, *(row[f] for f in JOB_FIELDS), *defaults))
    return rows


@transaction.atomic
def sweep_plan(
    *, cells: Iterable, created_by=None, filters=None, build: bool = False
) -> Sweep:
    """Plan one job per cell without an open job, route it, and enqueue it
    on commit. ``cells`` holds (shape, device type, toolchain) as objects or
    ids. ``build``: cuda cells no online runner has the device for are built
    with nvcc where a runner has it, rather than lowered (see routes_for)."""
    wanted = list(dict.fromkeys(_ids(cells)))
    sweep = Sweep.objects.create(created_by=created_by, filters=filters or {})
    if not wanted:
        return sweep
    plan = _plannable(wanted)
    routes = routes_for(pairs={(d, t) for _, d, t in plan.cells}, build=build)
    jobs = jobs_insert(
        plan,
        sweep_id=sweep.pk,
        route=lambda d, t: (routes[d, t].stage, routes[d, t].queue),
    )
    sweep.total = len(jobs)
    sweep.save(update_fields=["total"])
    messages = _chunks(plan.payloads(jobs))
    _messages_publish(messages)
    _planned_log(messages, {job["pk"]: sweep.pk for job in jobs})
    return sweep


def confirmations_plan(*, failures: list[tuple[Result, int | None]]) -> list[dict]:
    """A rerun of each cell whose green verdict a failure would end, before
    it counts: on another online runner with the device and the toolchain
    where there is one (its own queue), else wherever the cell's jobs go.
    ``failures``: each failing result and the runner that sent it. Called
    inside ingest's transaction; published once it commits."""
    by_cell = {
        (r.shape_id, r.device_type_id, r.toolchain_id): (r, runner_id)
        for r, runner_id in failures
    }
    plan = _plannable(list(by_cell))
    if not plan.cells:
        return []
    routes = routes_for(pairs={(d, t) for _, d, t in plan.cells})
    per_cell = {}
    for s, d, t in plan.cells:
        failed, runner_id = by_cell[s, d, t]
        other = (
            Runner.objects.online()
            .filter(device_types=d, toolchains=t)
            .exclude(pk=runner_id)
            .order_by("pk")
            .first()
        )
        per_cell[s, d, t] = {"confirms_id": failed.pk}
        if other is not None:
            per_cell[s, d, t].update(stage=JobStage.VALIDATE, queue=other.queue)
    jobs = jobs_insert(
        plan,
        route=lambda d, t: (routes[d, t].stage, routes[d, t].queue),
        per_cell=per_cell,
    )
    _messages_publish(_chunks(plan.payloads(jobs)))
    return jobs


@transaction.atomic
def bundle_plan(
    *, runner_name: str, cells: Iterable, created_by=None
) -> tuple[Sweep, list]:
    """Plan jobs for a runner with no path to the broker and return them
    signed. They are assigned to it at once (it claims nothing) and left out
    of reaping: they come home by hand, through POST /api/v1/results."""
    runner = Runner.objects.routable().filter(name=runner_name).first()
    if runner is None:
        pending = Runner.objects.filter(
            name=runner_name, health=Runner.Health.PENDING, revoked_at__isnull=True
        ).exists()
        raise ValidationError(
            f"runner {runner_name!r} is waiting for approval: a runner admin "
            "approves it first (Runners page, or `runner approve NAME`)"
            if pending
            else f"no active, unrevoked runner named {runner_name!r}"
        )
    hosted = set(runner.toolchains.values_list("id", flat=True))
    devices = set(runner.device_types.values_list("id", flat=True))
    wanted = [c for c in dict.fromkeys(_ids(cells)) if c[2] in hosted]
    sweep = Sweep.objects.create(
        created_by=created_by, filters={"bundle_for": runner.name}
    )
    plan = _plannable(wanted)
    now = timezone.now()
    queue = f"bundle.{runner.name}"
    jobs = jobs_insert(
        plan,
        state=JobState.RUNNING,
        runner_id=runner.pk,
        started_at=now,
        sweep_id=sweep.pk,
        route=lambda d, t: (
            JobStage.VALIDATE if d in devices else JobStage.LOWER,
            queue,
        ),
    )
    sweep.total = len(jobs)
    sweep.save(update_fields=["total"])
    return sweep, [_envelope(chunk) for _, chunk in _chunks(plan.payloads(jobs))]
