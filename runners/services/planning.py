"""Planning: choosing cells, routing them to queues, writing their jobs and
sending them, signed, to the runners (or in a bundle for an offline lab)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from matrix.models import (
    Backend,
    Cell,
    DeviceType,
    JobStage,
    JobState,
    KernelRevision,
    Shape,
    Sweep,
    Toolchain,
    ValidationJob,
)
from runners import signing
from runners.models import Runner, RunnerToolchain, compile_queue, validate_queue

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
    hosts = RunnerToolchain.objects.filter(
        runner__in=Runner.objects.online()
    ).values_list("toolchain_id", "runner__inventory__nvcc", "runner__device_types")
    validate, hosted, nvcc = set(), set(), set()
    for toolchain_id, has_nvcc, device_type_id in hosts:
        hosted.add(toolchain_id)
        if has_nvcc:
            nvcc.add(toolchain_id)
        if device_type_id is not None:
            validate.add((device_type_id, toolchain_id))
    return Capabilities(frozenset(validate), frozenset(hosted), frozenset(nvcc))


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


def job_payload(job: ValidationJob) -> dict:
    """What a runner needs to run one job, so it trusts nothing it did not
    verify."""
    payload = {
        "job": job.pk,
        "attempt": job.attempt,
        "operator": job.revision.operator.name,
        "shape": job.shape.dims,
        "dtype": job.shape.dtype,
        "target": job.device_type.target,
        "stage": job.stage,
        "seed": job.seed,
        "source_sha256": job.revision.source_sha256,
        "toolchain": job.toolchain.fingerprint,
        "library": job.revision.origin == KernelRevision.Origin.LIBRARY,
    }
    if not payload["library"]:
        # A reviewed submission travels with its text; the harness checks
        # it against the hash and runs it in a child of its own.
        payload["source"] = job.revision.source
    return payload


def jobs_envelope(jobs: list[ValidationJob]) -> dict:
    """One server-signed message for a few jobs of one queue."""
    return signing.envelope_sign(
        payload={"kind": "jobs", "jobs": [job_payload(job) for job in jobs]},
        signer=signing.SERVER_SIGNER,
        key=signing.server_key(),
    )


def job_chunks(jobs: list[ValidationJob]) -> list[tuple[str, list[ValidationJob]]]:
    """Jobs grouped by queue into messages: one message, one signature and
    one harness child (one TileLang import) per chunk rather than per job.
    A queue's jobs make at least eight messages while chunks stay above
    JOBS_PER_MESSAGE_MIN, so a sweep still spreads over the runners on it."""
    by_queue: dict[str, list[ValidationJob]] = {}
    for job in jobs:
        by_queue.setdefault(job.queue, []).append(job)
    chunks = []
    for queue, queued in by_queue.items():
        size = min(
            JOBS_PER_MESSAGE_MAX, max(JOBS_PER_MESSAGE_MIN, -(-len(queued) // 8))
        )
        chunks += [(queue, queued[i : i + size]) for i in range(0, len(queued), size)]
    return chunks


def job_budget_s() -> float:
    return float(os.environ.get("TILEMATRIX_JOB_TIMEOUT_S", 300))


def jobs_publish(jobs: list[ValidationJob]) -> None:
    """Sign and enqueue jobs once the transaction that wrote them commits,
    over one broker connection."""
    from matrix.celery import app
    from runners.tasks import execute_job

    messages = [
        (queue, len(chunk), jobs_envelope(chunk)) for queue, chunk in job_chunks(jobs)
    ]

    def publish():
        with app.producer_or_acquire() as producer:
            for queue, count, envelope in messages:
                soft = count * job_budget_s() + 60
                execute_job.apply_async(
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


def _plannable(wanted: list[tuple[int, int, int]]) -> tuple[list, dict]:
    """The cells that can get a job now (no open job, an approved current
    revision), with the objects a job needs."""
    shape_ids = {s for s, _, _ in wanted}
    open_cells = set(
        ValidationJob.objects.open()
        .filter(shape_id__in=shape_ids)
        .values_list("shape_id", "device_type_id", "toolchain_id")
    )
    shapes = Shape.objects.in_bulk(shape_ids)
    revisions = {
        r.operator_id: r
        for r in KernelRevision.objects.filter(
            is_current=True,
            review_state=KernelRevision.Review.APPROVED,
            operator_id__in={s.operator_id for s in shapes.values()},
        ).select_related("operator")
    }
    objects = {
        "shape": shapes,
        "device_type": DeviceType.objects.in_bulk({d for _, d, _ in wanted}),
        "toolchain": Toolchain.objects.in_bulk({t for _, _, t in wanted}),
    }
    todo = [
        (s, d, t)
        for s, d, t in wanted
        if (s, d, t) not in open_cells
        and s in shapes
        and d in objects["device_type"]
        and t in objects["toolchain"]
        and shapes[s].operator_id in revisions
    ]
    objects["revision"] = revisions
    return todo, objects


def _job(objects: dict, cell: tuple[int, int, int], **fields) -> ValidationJob:
    s, d, t = cell
    shape = objects["shape"][s]
    return ValidationJob(
        revision=objects["revision"][shape.operator_id],
        shape=shape,
        device_type=objects["device_type"][d],
        toolchain=objects["toolchain"][t],
        **fields,
    )


JOB_COLUMNS = (
    ("revision_id", "bigint"),
    ("shape_id", "bigint"),
    ("device_type_id", "bigint"),
    ("toolchain_id", "bigint"),
    ("stage", "text"),
    ("state", "text"),
    ("attempt", "smallint"),
    ("seed", "integer"),
    ("queue", "text"),
    ("sweep_id", "bigint"),
    ("runner_id", "bigint"),
    ("created_at", "timestamptz"),
    ("started_at", "timestamptz"),
)


def jobs_insert(jobs: list[ValidationJob]) -> list[ValidationJob]:
    """Insert new jobs and set their ids. On PostgreSQL one INSERT from
    column arrays: Django's bulk_create spends most of a 10,000-job sweep
    preparing values one field at a time."""
    if connection.vendor != "postgresql" or not jobs:
        return ValidationJob.objects.bulk_create(jobs)
    now = timezone.now()
    for job in jobs:
        job.created_at = now
    names = ", ".join(name for name, _ in JOB_COLUMNS)
    arrays = ", ".join(f"%s::{kind}[]" for _, kind in JOB_COLUMNS)
    params = [[getattr(job, name) for job in jobs] for name, _ in JOB_COLUMNS]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {ValidationJob._meta.db_table} ({names}) "
            f"SELECT * FROM unnest({arrays}) RETURNING id",
            params,
        )
        ids = [row[0] for row in cursor.fetchall()]
    for job, pk in zip(jobs, ids, strict=True):
        job.pk = pk
        job._state.adding = False
    return jobs


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
    todo, objects = _plannable(wanted)
    routes = routes_for(pairs={(d, t) for _, d, t in todo}, build=build)
    jobs = jobs_insert(
        [
            _job(
                objects,
                cell,
                stage=routes[cell[1:]].stage,
                queue=routes[cell[1:]].queue,
                sweep=sweep,
            )
            for cell in todo
        ]
    )
    sweep.total = len(jobs)
    sweep.save(update_fields=["total"])
    jobs_publish(jobs)
    return sweep


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
    todo, objects = _plannable(wanted)
    now = timezone.now()
    jobs = ValidationJob.objects.bulk_create(
        _job(
            objects,
            cell,
            stage=JobStage.VALIDATE if cell[1] in devices else JobStage.LOWER,
            queue=f"bundle.{runner.name}",
            state=JobState.RUNNING,
            runner=runner,
            started_at=now,
            sweep=sweep,
        )
        for cell in todo
    )
    sweep.total = len(jobs)
    sweep.save(update_fields=["total"])
    return sweep, [jobs_envelope(chunk) for _, chunk in job_chunks(jobs)]
