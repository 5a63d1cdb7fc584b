"""Runner workflows on the server side: registration, heartbeats, planning
sweeps, claiming jobs, ingesting signed results and reaping lost runners.

Each is keyword-only and atomic. Bad input raises ``ValidationError`` (400),
an identity or permission problem ``PermissionDenied`` (403) and a conflict
with what is stored ``Conflict`` (409); nothing is half-written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from matrix.models import (
    AuditEvent,
    Backend,
    Cell,
    DeviceType,
    JobStage,
    JobState,
    KernelRevision,
    Result,
    Shape,
    Status,
    Sweep,
    Toolchain,
    ValidationJob,
    fingerprint_of,
)
from matrix.services import toolchain_register
from runners import bulk, signing
from runners.harness.fingerprint import TOOLCHAIN_KEYS
from runners.models import (
    Receipt,
    RegistrationToken,
    Runner,
    RunnerToolchain,
    compile_queue,
    token_digest,
    validate_queue,
)

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
JOBS_PER_MESSAGE_MIN = 5
JOBS_PER_MESSAGE_MAX = 25
MISSED_HEARTBEATS = 3
INVENTORY_MAX_BYTES = 64 * 1024
INVENTORY_MAX_DEVICES = 64
INVENTORY_MAX_TOOLCHAINS = 16
ERROR_MESSAGE_CAP = 8 * 1024
VERIFY_PARALLEL_FROM = 64
VERIFY_THREADS = 4
# Offline bundles travel by hand from labs without a network path, so a
# result may be weeks old when it arrives; its nonce still makes it single-use.
RESULT_MAX_AGE_S = 90 * 24 * 3600
HEARTBEAT_MAX_AGE_S = 300


class Conflict(ValidationError):
    """The request is well formed but clashes with what is stored."""


def heartbeat_interval_s() -> float:
    return float(getattr(settings, "TILEMATRIX_HEARTBEAT_S", 30))


# Registration ---------------------------------------------------------------


@transaction.atomic
def token_create(*, expires: timedelta, created_by=None) -> str:
    """A new single-use registration token; only its digest is stored."""
    if expires <= timedelta(0):
        raise ValidationError("a token must expire in the future")
    # Hex: a token starting with "-" would read as an option on a command line.
    token = secrets.token_hex(32)
    record = RegistrationToken.objects.create(
        digest=token_digest(token),
        created_by=created_by,
        expires_at=timezone.now() + expires,
    )
    AuditEvent.record(
        actor=created_by,
        verb="token.create",
        obj=record,
        after={"expires_at": record.expires_at.isoformat()},
    )
    return token


def _clean_device(i: int, raw) -> dict:
    if not isinstance(raw, dict):
        raise ValidationError(f"inventory.devices[{i}] must be an object")
    backend = raw.get("backend")
    if backend not in Backend.values:
        raise ValidationError(
            f"inventory.devices[{i}].backend must be one of {Backend.values}"
        )
    clean = {"backend": backend}
    for field, limit in (("vendor", 40), ("model", 80), ("arch", 40)):
        value = raw.get(field, "")
        if not isinstance(value, str) or len(value) > limit:
            raise ValidationError(
                f"inventory.devices[{i}].{field} must be text of at most {limit} characters"
            )
        clean[field] = value.strip()
    if not clean["vendor"] or not clean["model"]:
        raise ValidationError(f"inventory.devices[{i}] needs a vendor and a model")
    memory = raw.get("memory_gb")
    if memory is not None and (
        isinstance(memory, bool) or not isinstance(memory, int) or memory < 0
    ):
        raise ValidationError(f"inventory.devices[{i}].memory_gb must be an integer")
    clean["memory_gb"] = memory
    return clean


def _clean_toolchain(i: int, raw) -> dict:
    if not isinstance(raw, dict):
        raise ValidationError(f"inventory.toolchains[{i}] must be an object")
    name, interpreter = raw.get("name"), raw.get("interpreter")
    components, harness_hash = raw.get("components"), raw.get("fingerprint", "")
    if not isinstance(name, str) or not 0 < len(name) <= 80:
        raise ValidationError(f"inventory.toolchains[{i}].name must be 1-80 characters")
    if not isinstance(interpreter, str) or not interpreter.startswith("/"):
        raise ValidationError(
            f"inventory.toolchains[{i}].interpreter must be an absolute path"
        )
    if not isinstance(components, dict) or not components.get("tilelang"):
        raise ValidationError(
            f"inventory.toolchains[{i}].components must name at least tilelang"
        )
    if not isinstance(harness_hash, str) or len(harness_hash) > 64:
        raise ValidationError(f"inventory.toolchains[{i}].fingerprint must be a hash")
    # Only the toolchain itself identifies it: the same toolchain on two hosts
    # with different GPUs or kernels must match one Toolchain row.
    components = {k: components.get(k) for k in TOOLCHAIN_KEYS}
    return {
        "name": name,
        "interpreter": interpreter[:300],
        "components": components,
        "harness_fingerprint": harness_hash,
    }


def inventory_clean(inventory) -> dict:
    """Check an inventory's size and shape; raise ValidationError naming the
    first problem."""
    if not isinstance(inventory, dict):
        raise ValidationError("inventory must be a JSON object")
    size = len(signing.canonical(inventory))
    if size > INVENTORY_MAX_BYTES:
        raise ValidationError(
            f"inventory is {size} bytes; the limit is {INVENTORY_MAX_BYTES}"
        )
    devices, toolchains = inventory.get("devices"), inventory.get("toolchains")
    if not isinstance(devices, list) or not isinstance(toolchains, list):
        raise ValidationError("inventory needs lists 'devices' and 'toolchains'")
    if len(devices) > INVENTORY_MAX_DEVICES:
        raise ValidationError(
            f"inventory lists more than {INVENTORY_MAX_DEVICES} devices"
        )
    if not toolchains:
        raise ValidationError(
            "inventory lists no toolchain: the runner could run nothing"
        )
    if len(toolchains) > INVENTORY_MAX_TOOLCHAINS:
        raise ValidationError(
            f"inventory lists more than {INVENTORY_MAX_TOOLCHAINS} toolchains"
        )
    host = inventory.get("host", {})
    if not isinstance(host, dict):
        raise ValidationError("inventory.host must be an object")
    return {
        "devices": [_clean_device(i, d) for i, d in enumerate(devices)],
        "toolchains": [_clean_toolchain(i, t) for i, t in enumerate(toolchains)],
        "nvcc": bool(inventory.get("nvcc", False)),
        "host": host,
    }


def _public_key_clean(public_key) -> str:
    try:
        if not isinstance(public_key, str) or len(bytes.fromhex(public_key)) != 32:
            raise ValueError
    except ValueError:
        raise ValidationError(
            "public_key must be a 32-byte Ed25519 key in hex"
        ) from None
    return public_key.lower()


@transaction.atomic
def runner_register(*, token: str, name: str, public_key: str, inventory) -> Runner:
    """Exchange a registration token for a Runner holding the runner's public
    key, its device types and its toolchains."""
    if not isinstance(token, str) or not token:
        raise PermissionDenied("a registration token is required")
    record = (
        RegistrationToken.objects.select_for_update()
        .filter(digest=token_digest(token))
        .first()
    )
    if record is None:
        raise PermissionDenied("unknown registration token")
    if record.used_at is not None:
        raise PermissionDenied("registration token already used")
    if record.expires_at <= timezone.now():
        raise PermissionDenied("registration token expired")
    try:
        Runner._meta.get_field("name").run_validators(name)
        if not name or len(name) > 60:
            raise ValidationError("name must be 1-60 characters")
    except ValidationError:
        raise ValidationError(
            "name must be 1-60 letters, digits, hyphens or underscores"
        ) from None
    public_key = _public_key_clean(public_key)
    clean = inventory_clean(inventory)
    if Runner.objects.filter(name=name).exists():
        raise Conflict(f"a runner named {name!r} is already registered")

    device_types = []
    for spec in clean["devices"]:
        device_type, _ = DeviceType.objects.get_or_create(
            vendor=spec["vendor"],
            model=spec["model"],
            arch=spec["arch"],
            backend=spec["backend"],
            defaults={"memory_gb": spec["memory_gb"]},
        )
        device_types.append(device_type)
    hosted = []
    for spec in clean["toolchains"]:
        toolchain = Toolchain.objects.filter(
            fingerprint=fingerprint_of(spec["components"])
        ).first() or toolchain_register(
            name=spec["name"], components=spec["components"]
        )
        hosted.append((toolchain, spec))

    runner = Runner.objects.create(
        name=name,
        public_key=public_key,
        inventory=clean,
        state=Runner.State.OFFLINE,
    )
    runner.device_types.set(device_types)
    RunnerToolchain.objects.bulk_create(
        RunnerToolchain(
            runner=runner,
            toolchain=toolchain,
            interpreter=spec["interpreter"],
            harness_fingerprint=spec["harness_fingerprint"],
        )
        for toolchain, spec in {t.pk: (t, s) for t, s in hosted}.values()
    )
    record.used_at = timezone.now()
    record.used_by = runner
    record.save(update_fields=["used_at", "used_by"])
    AuditEvent.record(
        actor_label=name,
        verb="runner.register",
        obj=runner,
        after={
            "device_types": [str(d) for d in device_types],
            "toolchains": sorted({t.name for t, _ in hosted}),
        },
    )
    return runner


@transaction.atomic
def runner_revoke(*, name: str, by=None) -> Runner:
    runner = Runner.objects.select_for_update().filter(name=name).first()
    if runner is None:
        raise ValidationError(f"no runner named {name!r}")
    runner.revoke(by=by)
    runner.go_offline()
    return runner


# Identity -------------------------------------------------------------------


def _runner_for_envelope(envelope, runners: dict | None = None) -> Runner:
    """The signer's Runner, from ``runners`` (by name) when given, so that
    checking a batch makes no query per envelope."""
    name = signing.envelope_signer(envelope)
    if runners is not None:
        runner = runners.get(name)
    else:
        runner = Runner.objects.filter(name=name).first()
    if runner is None:
        raise PermissionDenied(f"unknown runner {name!r}")
    if runner.revoked_at is not None:
        raise PermissionDenied(f"runner {name!r} is revoked")
    return runner


def _verify(envelope, runner: Runner, *, kind: str, max_age_s: float) -> dict:
    try:
        payload = signing.envelope_verify(
            envelope, public_key=runner.public_key, max_age_s=max_age_s
        )
    except signing.EnvelopeError as exc:
        raise PermissionDenied(str(exc)) from None
    if payload.get("kind") != kind:
        raise ValidationError(
            f"expected a {kind} envelope, got {payload.get('kind')!r}"
        )
    if payload.get("runner") != runner.name:
        raise PermissionDenied("the payload names a different runner than its signer")
    return payload


@transaction.atomic
def runner_heartbeat(*, envelope) -> Runner:
    """Record a signed heartbeat; its sequence must grow, so an old one
    replayed is refused."""
    try:
        runner = _runner_for_envelope(envelope)
    except signing.EnvelopeError as exc:
        raise ValidationError(str(exc)) from None
    payload = _verify(envelope, runner, kind="heartbeat", max_age_s=HEARTBEAT_MAX_AGE_S)
    sequence = payload.get("sequence")
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise ValidationError("heartbeat sequence must be an integer")
    runner = Runner.objects.select_for_update().get(pk=runner.pk)
    if sequence <= runner.last_sequence:
        raise Conflict(
            f"stale heartbeat: sequence {sequence} is not above {runner.last_sequence}"
        )
    runner.last_sequence = sequence
    runner.last_heartbeat = timezone.now()
    runner.save(update_fields=["last_sequence", "last_heartbeat"])
    if payload.get("state") == Runner.State.BUSY:
        runner.go_busy()
    else:
        runner.go_online()
    return runner


# Planning -------------------------------------------------------------------


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
        text = str(device_type)
        if text.isdigit():
            device_types = device_types.filter(pk=int(text))
        elif text in Backend.values:
            device_types = device_types.filter(backend=text)
        else:
            device_types = device_types.filter(model__icontains=text)
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


def routes_for(*, pairs: set[tuple[int, int]]) -> dict[tuple[int, int], Route]:
    """Where the jobs of each (device type, toolchain) go: validation on a
    runner that has the device, else compile-only work any runner hosting the
    toolchain may take."""
    runners = list(
        Runner.objects.online().prefetch_related("device_types", "toolchains")
    )
    can_validate, nvcc_hosts = set(), set()
    for runner in runners:
        tc_ids = {t.pk for t in runner.toolchains.all()}
        for d in runner.device_types.all():
            can_validate.update((d.pk, t) for t in tc_ids)
        if runner.has_nvcc:
            nvcc_hosts.update(tc_ids)
    backends = dict(
        DeviceType.objects.filter(pk__in={d for d, _ in pairs}).values_list(
            "id", "backend"
        )
    )
    routes = {}
    for d, t in pairs:
        if (d, t) in can_validate:
            routes[d, t] = Route(
                JobStage.VALIDATE, validate_queue(device_type_id=d, toolchain_id=t)
            )
        elif backends.get(d) == Backend.CUDA and t in nvcc_hosts:
            routes[d, t] = Route(
                JobStage.BUILD, compile_queue(toolchain_id=t, nvcc=True)
            )
        else:
            routes[d, t] = Route(JobStage.LOWER, compile_queue(toolchain_id=t))
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
def sweep_plan(*, cells: Iterable, created_by=None, filters=None) -> Sweep:
    """Plan one job per cell without an open job, route it, and enqueue it
    on commit. ``cells`` holds (shape, device type, toolchain) as objects or
    ids."""
    wanted = list(dict.fromkeys(_ids(cells)))
    sweep = Sweep.objects.create(created_by=created_by, filters=filters or {})
    if not wanted:
        return sweep
    todo, objects = _plannable(wanted)
    routes = routes_for(pairs={(d, t) for _, d, t in todo})
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
        raise ValidationError(f"no active, unrevoked runner named {runner_name!r}")
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


# Running --------------------------------------------------------------------


def job_claim(*, job_id: int, attempt: int, runner: Runner) -> bool:
    """Take a queued job for this runner; False when another delivery, another
    runner or a newer attempt has it, or the runner may not take work."""
    if runner.revoked_at is not None or runner.health != Runner.Health.ACTIVE:
        return False
    return bool(
        ValidationJob.objects.filter(
            pk=job_id, attempt=attempt, state=JobState.QUEUED
        ).update(state=JobState.RUNNING, runner=runner, started_at=timezone.now())
    )


def _infra_result(job: ValidationJob, message: str) -> Result:
    return Result(
        job=job,
        attempt=job.attempt,
        revision_id=job.revision_id,
        shape_id=job.shape_id,
        device_type_id=job.device_type_id,
        toolchain_id=job.toolchain_id,
        status=Status.INFRA_ERROR,
        stage_reached="",
        error_signature=hashlib.sha256(message.encode()).hexdigest()[:16],
        error_message=message,
    )


def jobs_requeue(*, jobs: list[ValidationJob], reason: str) -> dict:
    """Give running jobs another attempt, or end them `lost` with an
    infra_error result once they have had MAX_ATTEMPTS."""
    now = timezone.now()
    retry, lost = [], []
    for job in jobs:
        if job.attempt >= MAX_ATTEMPTS:
            job.state, job.finished_at = JobState.LOST, now
            lost.append(job)
        else:
            job.attempt += 1
            job.state, job.runner, job.started_at = JobState.QUEUED, None, None
            retry.append(job)
    ValidationJob.objects.bulk_update(
        retry, ["attempt", "state", "runner", "started_at"]
    )
    ValidationJob.objects.bulk_update(lost, ["state", "finished_at"])
    Result.objects.bulk_create(
        [
            _infra_result(job, f"lost after {MAX_ATTEMPTS} attempts: {reason}")
            for job in lost
        ],
        ignore_conflicts=True,
    )
    if retry:
        jobs_publish(
            list(
                ValidationJob.objects.filter(
                    pk__in=[j.pk for j in retry]
                ).select_related(
                    "revision__operator", "shape", "device_type", "toolchain"
                )
            )
        )
    return {"requeued": len(retry), "lost": len(lost)}


@transaction.atomic
def runner_reap(*, now=None) -> dict:
    """Mark runners silent for MISSED_HEARTBEATS intervals offline and give
    their running jobs to someone else."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=MISSED_HEARTBEATS * heartbeat_interval_s())
    silent = list(
        Runner.objects.select_for_update()
        .exclude(state=Runner.State.OFFLINE)
        .filter(Q(last_heartbeat__lt=cutoff) | Q(last_heartbeat__isnull=True))
    )
    totals = {"offline": 0, "requeued": 0, "lost": 0}
    for runner in silent:
        runner.go_offline()
        totals["offline"] += 1
    # Revoked or silent runners' running jobs, whether just marked or earlier.
    jobs = list(
        ValidationJob.objects.select_for_update()
        .filter(state=JobState.RUNNING)
        .filter(
            Q(runner__state=Runner.State.OFFLINE) | Q(runner__revoked_at__isnull=False)
        )
        .exclude(queue__startswith="bundle.")
    )
    counts = jobs_requeue(jobs=jobs, reason="runner went offline")
    totals["requeued"], totals["lost"] = counts["requeued"], counts["lost"]
    return totals


@transaction.atomic
def runner_recover(*, runner: Runner) -> dict:
    """After a runner's worker (re)starts: nothing it was running survives,
    so those jobs get another attempt; queued jobs on its queues are sent
    again because a broker without acknowledgements (the embedded one) drops
    messages a killed worker had prefetched. A duplicate is harmless: only
    one delivery can claim a job."""
    running = list(
        ValidationJob.objects.select_for_update().filter(
            state=JobState.RUNNING, runner=runner
        )
    )
    counts = jobs_requeue(jobs=running, reason=f"worker of {runner.name} restarted")
    republished = queued_republish(runner=runner, exclude={j.pk for j in running})
    return {**counts, "republished": republished}


def queued_republish(*, runner: Runner, exclude: set[int] = frozenset()) -> int:
    """Send again the queued jobs on a runner's queues (after its worker
    restarts or reconnects, when a broker may have lost them)."""
    queued = list(
        ValidationJob.objects.filter(state=JobState.QUEUED, queue__in=runner.queues())
        .exclude(pk__in=exclude)
        .select_related("revision__operator", "shape", "device_type", "toolchain")
    )
    jobs_publish(queued)
    return len(queued)


# Ingest ---------------------------------------------------------------------


@dataclass
class Outcome:
    status: str  # stored, duplicate or refused
    result: Result | None = None
    reason: str = ""
    code: int = 200


def _number(value):
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value else None  # NaN is "no value"


def _error_fields(raw) -> tuple[str, str]:
    error = raw.get("error") or {}
    if not isinstance(error, dict):
        return "", ""
    message = str(error.get("message") or "")[:ERROR_MESSAGE_CAP]
    signature = str(error.get("signature") or "")[:64]
    if message and not signature:
        signature = hashlib.sha256(message.encode()).hexdigest()[:16]
    return signature, message


JOB_ROW = (
    "pk",
    "state",
    "attempt",
    "runner_id",
    "revision_id",
    "shape_id",
    "device_type_id",
    "toolchain_id",
)
STATUSES = frozenset(Status.values)


def _result_from(job: SimpleNamespace, attempt: int, raw: dict) -> Result:
    status = raw.get("status")
    if status not in STATUSES:
        raise ValidationError(f"unknown result status {status!r}")
    metrics = raw.get("metrics") if isinstance(raw.get("metrics"), dict) else {}
    timings = raw.get("timings") if isinstance(raw.get("timings"), dict) else {}
    fingerprint = (
        raw.get("fingerprint") if isinstance(raw.get("fingerprint"), dict) else {}
    )
    signature, message = _error_fields(raw)
    details = {
        k: raw[k]
        for k in ("tolerance", "kernel_source", "target", "stage", "seed")
        if k in raw
    }
    details["fingerprint_components"] = fingerprint.get("components") or {}
    if isinstance(raw.get("error"), dict) and raw["error"].get("pass_name"):
        details["pass_name"] = str(raw["error"]["pass_name"])[:120]
    return Result(
        job_id=job.pk,
        attempt=attempt,
        revision_id=job.revision_id,
        shape_id=job.shape_id,
        device_type_id=job.device_type_id,
        toolchain_id=job.toolchain_id,
        status=status,
        stage_reached=str(raw.get("stage_reached") or "")[:10],
        rel_err=_number(metrics.get("rel_err")),
        max_abs_err=_number(metrics.get("max_abs_err")),
        mismatch_ratio=_number(metrics.get("mismatch_ratio")),
        compile_s=_number(timings.get("compile_s")),
        kernel_ms=_number(timings.get("kernel_ms")),
        reference_ms=_number(timings.get("reference_ms")),
        tflops=_number(timings.get("tflops")),
        gbps=_number(timings.get("gbps")),
        error_signature=signature,
        error_message=message,
        fingerprint=str(fingerprint.get("hash") or "")[:64],
        details=details,
    )


RESULT_FIELDS = [
    "job",
    "attempt",
    "revision",
    "shape",
    "device_type",
    "toolchain",
    "status",
    "stage_reached",
    "rel_err",
    "max_abs_err",
    "mismatch_ratio",
    "compile_s",
    "kernel_ms",
    "reference_ms",
    "tflops",
    "gbps",
    "error_signature",
    "error_message",
    "fingerprint",
    "details",
    "created_at",
]
CELL_FIELDS = [
    "shape",
    "device_type",
    "toolchain",
    "revision",
    "result",
    "status",
    "error_signature",
    "kernel_ms",
    "reference_ms",
    "updated_at",
]


def _cells_upsert(results: list[Result]) -> None:
    """Point each cell at its newest result in one statement per kind. An
    infra_error is the runner's trouble, not the kernel's: it fills an empty
    cell but never hides an answer already there."""
    latest = {}
    for result in results:
        latest[result.shape_id, result.device_type_id, result.toolchain_id] = result
    now = timezone.now()

    def cell(r: Result) -> Cell:
        return Cell(
            shape_id=r.shape_id,
            device_type_id=r.device_type_id,
            toolchain_id=r.toolchain_id,
            revision_id=r.revision_id,
            result=r,
            status=r.status,
            error_signature=r.error_signature,
            kernel_ms=r.kernel_ms,
            reference_ms=r.reference_ms,
            updated_at=now,
        )

    answers = [cell(r) for r in latest.values() if r.status != Status.INFRA_ERROR]
    infra = [cell(r) for r in latest.values() if r.status == Status.INFRA_ERROR]
    bulk.rows_insert(
        Cell,
        answers,
        fields=CELL_FIELDS,
        unique=["shape", "device_type", "toolchain"],
        update=[
            f for f in CELL_FIELDS if f not in ("shape", "device_type", "toolchain")
        ],
    )
    bulk.rows_insert(
        Cell, infra, fields=CELL_FIELDS, unique=["shape", "device_type", "toolchain"]
    )


def _check(envelope, runners: dict) -> tuple[Runner, dict, dict]:
    """Identity and shape checks that need no lock."""
    try:
        runner = _runner_for_envelope(envelope, runners)
    except signing.EnvelopeError as exc:
        raise ValidationError(str(exc)) from None
    payload = _verify(envelope, runner, kind="result", max_age_s=RESULT_MAX_AGE_S)
    job_id, attempt, raw = (
        payload.get("job"),
        payload.get("attempt"),
        payload.get("result"),
    )
    if (
        not isinstance(job_id, int)
        or not isinstance(attempt, int)
        or not isinstance(raw, dict)
    ):
        raise ValidationError(
            "a result payload needs integer job and attempt and a result object"
        )
    return runner, payload, raw


def results_ingest(*, envelopes: list) -> list[Outcome]:
    """Store signed results, one Outcome per envelope in order. Each is
    checked alone (a bad one does not block the rest); the accepted ones are
    written together with their cells in one transaction."""
    if not isinstance(envelopes, list):
        raise ValidationError("expected a list of result envelopes")
    outcomes: list[Outcome | None] = [None] * len(envelopes)
    names = {
        e.get("signer")
        for e in envelopes
        if isinstance(e, dict) and isinstance(e.get("signer"), str)
    }
    runners = {r.name: r for r in Runner.objects.filter(name__in=names)}

    def check(envelope):
        try:
            return _check(envelope, runners)
        except PermissionDenied as exc:
            return Outcome("refused", reason=str(exc), code=403)
        except ValidationError as exc:
            return Outcome("refused", reason="; ".join(exc.messages), code=400)

    # Ed25519 verification releases the GIL and was most of a batch's time:
    # large batches verify on a few threads.
    if len(envelopes) >= VERIFY_PARALLEL_FROM:
        with ThreadPoolExecutor(VERIFY_THREADS) as pool:
            verdicts = list(pool.map(check, envelopes, chunksize=64))
    else:
        verdicts = [check(envelope) for envelope in envelopes]
    checked = {}
    for i, verdict in enumerate(verdicts):
        if isinstance(verdict, Outcome):
            outcomes[i] = verdict
        else:
            checked[i] = verdict

    with transaction.atomic():
        nonces = {envelopes[i]["nonce"] for i in checked}
        seen = dict(
            Receipt.objects.filter(nonce__in=nonces).values_list("nonce", "result_id")
        )
        # Rows, not model instances: building thousands of instances cost
        # more than the query.
        jobs = {
            row["pk"]: SimpleNamespace(**row)
            for row in ValidationJob.objects.select_for_update()
            .filter(pk__in={p["job"] for _, p, _ in checked.values()})
            .values(*JOB_ROW)
        }
        stored = {
            (r.job_id, r.attempt): r
            for r in Result.objects.filter(job_id__in=jobs).only(
                "id", "job_id", "attempt"
            )
        }
        new_results, receipts, finished, batch_nonces = [], [], [], set()
        for i, (runner, payload, raw) in checked.items():
            envelope, job = envelopes[i], jobs.get(payload["job"])
            key = (payload["job"], payload["attempt"])
            if envelope["nonce"] in seen or envelope["nonce"] in batch_nonces:
                outcomes[i] = Outcome(
                    "refused",
                    reason="replayed envelope: this nonce was already used",
                    code=409,
                )
            elif job is None:
                outcomes[i] = Outcome(
                    "refused", reason=f"no job {payload['job']}", code=400
                )
            elif job.runner_id != runner.pk:
                outcomes[i] = Outcome(
                    "refused",
                    reason=f"job {job.pk} is not assigned to runner {runner.name!r}",
                    code=403,
                )
            elif key in stored:
                outcomes[i] = Outcome("duplicate", result=stored[key])
            elif payload["attempt"] != job.attempt or job.state != JobState.RUNNING:
                outcomes[i] = Outcome(
                    "refused",
                    reason=f"job {job.pk} attempt {payload['attempt']} is no longer "
                    f"running (now attempt {job.attempt}, {job.state})",
                    code=409,
                )
            else:
                try:
                    result = _result_from(job, payload["attempt"], raw)
                except ValidationError as exc:
                    outcomes[i] = Outcome(
                        "refused", reason="; ".join(exc.messages), code=400
                    )
                    continue
                new_results.append(result)
                stored[key] = result
                batch_nonces.add(envelope["nonce"])
                receipts.append((result, runner, envelope))
                finished.append((job, result))
                outcomes[i] = Outcome("stored", result=result)
        if new_results:
            now = timezone.now()
            for result in new_results:
                result.created_at = now
            bulk.rows_insert(Result, new_results, fields=RESULT_FIELDS)
            bulk.rows_insert(
                Receipt,
                [
                    Receipt(
                        result=result,
                        runner=runner,
                        nonce=envelope["nonce"],
                        signature=envelope["signature"],
                        issued_at=envelope["issued_at"][:40],
                        received_at=now,
                    )
                    for result, runner, envelope in receipts
                ],
                fields=[
                    "result",
                    "runner",
                    "nonce",
                    "signature",
                    "issued_at",
                    "received_at",
                ],
            )
            # One UPDATE per outcome: bulk_update's CASE per row cost more
            # than the rest of the batch.
            for state, ids in (
                (
                    JobState.DONE,
                    [j.pk for j, r in finished if r.status != Status.INFRA_ERROR],
                ),
                (
                    JobState.FAILED,
                    [j.pk for j, r in finished if r.status == Status.INFRA_ERROR],
                ),
            ):
                if ids:
                    ValidationJob.objects.filter(pk__in=ids).update(
                        state=state, finished_at=now
                    )
            _cells_upsert(new_results)
            # The gate re-evaluates as results arrive, in the same transaction.
            from matrix.gate.services import proposals_reevaluate_for_results

            proposals_reevaluate_for_results(results=new_results)
    return outcomes


def result_ingest(*, envelope) -> tuple[Result, bool]:
    """Store one signed result; (result, created). A second copy of the same
    job attempt returns the stored one; a refusal raises with the reason."""
    (outcome,) = results_ingest(envelopes=[envelope])
    if outcome.status == "refused":
        exc = {403: PermissionDenied, 409: Conflict}.get(outcome.code, ValidationError)
        raise exc(outcome.reason)
    return outcome.result, outcome.status == "stored"


def result_envelope(*, job: dict, result: dict, runner_name: str, key) -> dict:
    """A runner signs what its harness produced for one job attempt."""
    return signing.envelope_sign(
        payload={
            "kind": "result",
            "runner": runner_name,
            "job": job["job"],
            "attempt": job["attempt"],
            "result": result,
        },
        signer=runner_name,
        key=key,
    )


def heartbeat_envelope(*, runner_name: str, sequence: int, state: str, key) -> dict:
    return signing.envelope_sign(
        payload={
            "kind": "heartbeat",
            "runner": runner_name,
            "sequence": sequence,
            "state": state,
        },
        signer=runner_name,
        key=key,
    )
