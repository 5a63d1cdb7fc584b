"""Evidence a GPU lab brought home, kept as a file and replayed into another
server (a fresh demo database, a colleague's instance).

An evidence file holds the lab runner (name, public key, inventory), the
jobs of its offline bundle (id, attempt and cell of each) and the results
the runner signed. Importing it registers the runner with its own public
key, recreates its jobs under their ids, assigned to it, and hands the
signed results to the normal ingest: signature, runner identity,
assignment, replay and idempotency checks all apply, so a result altered
after the lab signed it is refused; only its age is not held against it. A malformed job (named by its index in
the file, ``jobs[N]``), a job listed twice, a job id already used by
another job, a result that is not a signed envelope of the file's runner
for one of its jobs (``results[N]``), or a file with no jobs or no results
stops the import before anything is written.
"""

from __future__ import annotations

import re
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.core.management.color import no_style
from django.db import connection, transaction
from django.utils import timezone

from matrix.fleet import services
from matrix.fleet.models import Runner
from matrix.fleet.services.envelopes import shown
from matrix.fleet.services.ingest import ARCHIVED
from matrix.models import (
    ID_MAX,
    AuditEvent,
    DeviceType,
    JobStage,
    JobState,
    KernelRevision,
    Operator,
    Shape,
    Sweep,
    Toolchain,
    ValidationJob,
    dims_key,
)
from matrix.services import (
    largest_device_gb,
    shape_clean,
    shape_import,
    weight_clean,
)
from runners import signing

FORMAT = "tilematrix-evidence/1"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
JOB_FIELDS = (
    "job",
    "attempt",
    "operator",
    "dims",
    "dtype",
    "device",
    "stage",
    "toolchain",
    "revision",
)
# The ranges of the columns a job's numbers are stored in (PostgreSQL's
# bigint, ID_MAX, then smallint and integer; SQLite would take more and
# PostgreSQL fail).
ATTEMPT_MAX = 2**15 - 1
SEED_MAX = 2**31 - 1
PROFILE_MAX = Shape._meta.get_field("source_profile").max_length


def evidence_export(*, sweeps: list[Sweep], results: list, measured: dict) -> dict:
    """The evidence of offline bundles' sweeps: their runner, their jobs and
    the signed ``results`` that came home for them. Refuses, as
    evidence_import would, ``results`` or ``measured`` it could not replay."""
    if not isinstance(measured, dict):
        raise ValidationError(
            f"measured must be an object of figures, got {shown(measured)}"
        )
    jobs = list(
        ValidationJob.objects.filter(sweep__in=sweeps)
        .select_related(
            "runner", "shape__operator", "device_type", "toolchain", "revision"
        )
        .order_by("pk")
    )
    runners = {job.runner for job in jobs}
    if len(runners) != 1 or None in runners:
        raise ValidationError("these sweeps are not one runner's offline bundles")
    (runner,) = runners
    _results_check(results, runner_name=runner.name, job_ids={job.pk for job in jobs})
    return {
        "format": FORMAT,
        "runner": {
            "name": runner.name,
            "public_key": runner.public_key,
            "inventory": runner.inventory,
        },
        "jobs": [
            {
                "job": job.pk,
                "attempt": job.attempt,
                "operator": job.shape.operator.name,
                # In the operator's declared order: jsonb (PostgreSQL) does
                # not keep the stored one, and the order makes the shape's key.
                "dims": {d: job.shape.dims[d] for d in job.shape.operator.dims},
                "dtype": job.shape.dtype,
                "served": job.shape.served,
                "weight": job.shape.weight,
                "profile": job.shape.source_profile,
                "device": {
                    "vendor": job.device_type.vendor,
                    "model": job.device_type.model,
                    "arch": job.device_type.arch,
                    "backend": job.device_type.backend,
                },
                "toolchain": job.toolchain.fingerprint,
                "revision": job.revision.source_sha256,
                "stage": job.stage,
                "seed": job.seed,
            }
            for job in jobs
        ],
        "results": results,
        "measured": measured,
    }


def evidence_import(data: object, *, current_if_none: bool = False) -> dict:
    """Replay an evidence file; returns the ingest's counts. Raises
    ValidationError, saying why, for a file that cannot be replayed here.
    ``current_if_none`` makes the lab's toolchain the current one on a server
    that has none yet (the demo: the matrix opens on the lab's evidence)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValidationError(f"not an evidence file (format {FORMAT!r} expected)")
    runner_spec, jobs, results = (data.get(k) for k in ("runner", "jobs", "results"))
    if not isinstance(runner_spec, dict) or not isinstance(jobs, list):
        raise ValidationError("an evidence file needs a runner and a list of jobs")
    if not all(isinstance(runner_spec.get(k), str) for k in ("name", "public_key")):
        raise ValidationError("the evidence's runner needs a name and a public key")
    measured = data.get("measured") or {}
    if not isinstance(measured, dict):
        raise ValidationError("measured must be an object of figures")
    if not jobs:
        raise ValidationError("the evidence lists no jobs: nothing to import")
    _jobs_check(jobs)
    _results_check(
        results,
        runner_name=runner_spec["name"],
        job_ids={job["job"] for job in jobs},
    )
    with transaction.atomic():
        runner = _runner(runner_spec)
        waiting = _jobs_recreate(jobs, runner, measured)
        if current_if_none:
            _toolchain_current_if_none(jobs)
    counts = {"stored": 0, "duplicate": 0, "refused": []}
    if not waiting:
        # Imported before: its results are stored and their nonces spent.
        counts["duplicate"] = len(results)
        return counts
    # Evidence does not expire: a file archived years ago replays as it did
    # the day it came home (the live upload keeps its age limit).
    outcomes = services.results_ingest(envelopes=results, max_age_s=ARCHIVED)
    for index, outcome in enumerate(outcomes):
        if outcome.status == "refused":
            counts["refused"].append(f"result {index}: {outcome.reason}")
        else:
            counts[outcome.status] += 1
    return counts


def _whole(value, low: int, high: int) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    )


def _jobs_check(jobs: list) -> None:
    """Refuse a file whose jobs could not all be stored, before anything is
    written, naming the job by its index in the file."""
    operators = {op.name: op for op in Operator.objects.all()}
    largest_gb = largest_device_gb()  # once, not once a job
    listed: dict[int, int] = {}
    for i, job in enumerate(jobs):
        where = f"jobs[{i}]"
        if not isinstance(job, dict):
            raise ValidationError(f"{where} is not an object")
        missing = [k for k in JOB_FIELDS if k not in job]
        if missing:
            raise ValidationError(f"{where} lacks {', '.join(missing)}")
        if not _whole(job["job"], 1, ID_MAX):
            raise ValidationError(f"{where}: job must be an id from 1 to {ID_MAX}")
        if job["job"] in listed:
            raise ValidationError(
                f"{where}: job {job['job']} is listed twice (also jobs[{listed[job['job']]}])"
            )
        listed[job["job"]] = i
        if not _whole(job["attempt"], 1, ATTEMPT_MAX):
            raise ValidationError(
                f"{where}: attempt must be an integer from 1 to {ATTEMPT_MAX}"
            )
        if job.get("seed") is not None and not _whole(job["seed"], 0, SEED_MAX):
            raise ValidationError(
                f"{where}: seed must be an integer from 0 to {SEED_MAX}"
            )
        if job["stage"] not in JobStage.values:
            raise ValidationError(
                f"{where}: stage must be one of {', '.join(JobStage.values)}"
            )
        operator = (
            operators.get(job["operator"]) if isinstance(job["operator"], str) else None
        )
        if operator is None:
            raise ValidationError(f"{where}: unknown operator {job['operator']!r}")
        try:
            # Cleaned dims come in the declared order, which makes the key a
            # shape is found by, whatever order the file lists them in.
            job["dims"] = shape_clean(
                operator=operator,
                dims=job["dims"],
                dtype=job["dtype"],
                largest_gb=largest_gb,
            )
            weight_clean(job.get("weight", 0.0))
        except ValidationError as exc:
            raise ValidationError(
                f"{where} ({operator.name}): {'; '.join(exc.messages)}"
            ) from None
        profile = job.get("profile")
        if profile is not None and not (
            isinstance(profile, str)
            and len(profile) <= PROFILE_MAX
            and "\x00" not in profile
        ):
            raise ValidationError(
                f"{where}: profile must be a name of at most {PROFILE_MAX} characters"
            )
        if not isinstance(job["device"], dict):
            raise ValidationError(f"{where}: device must be an object")
        if not isinstance(job["toolchain"], str):
            raise ValidationError(f"{where}: toolchain must be a fingerprint")
        if not isinstance(job["revision"], str) or not SHA256.match(job["revision"]):
            raise ValidationError(f"{where}: revision must be a sha256")


def _results_check(results, *, runner_name: str, job_ids: set[int]) -> None:
    """Refuse results that could not all reach the ingest, before anything
    is written, naming the result by its index in the file. Signatures are
    left to the ingest: a result altered after signing is refused alone and
    the others are still stored."""
    if not isinstance(results, list):
        raise ValidationError("an evidence file needs a list of signed results")
    if not results:
        # Its jobs would be recreated running, holding their cells from
        # every later sweep until someone abandons them.
        raise ValidationError("the evidence holds no signed results")
    for i, envelope in enumerate(results):
        where = f"results[{i}]"
        try:
            signer = signing.envelope_signer(envelope)
        except signing.EnvelopeError as exc:
            raise ValidationError(f"{where}: {exc}") from None
        if signer != runner_name:
            raise ValidationError(
                f"{where} is signed by {signer!r}, not by the evidence's runner "
                f"{runner_name!r}"
            )
        job = envelope["payload"].get("job")
        if type(job) is not int or job not in job_ids:
            raise ValidationError(
                f"{where} is the result of job {shown(job)}, which the evidence "
                "does not list"
            )


def _runner(spec: dict) -> Runner:
    """The lab runner, registered with its own key the first time."""
    existing = Runner.objects.filter(name=spec.get("name")).first()
    if existing is not None:
        if existing.public_key != spec.get("public_key"):
            raise ValidationError(
                f"a runner named {existing.name!r} is registered here with "
                "another key: this evidence is not its"
            )
        return existing
    return services.runner_evidence_adopt(
        services.runner_register(
            token=services.token_create(expires=timedelta(minutes=5)),
            name=spec.get("name"),
            public_key=spec.get("public_key"),
            inventory=spec.get("inventory"),
        )
    )


def _toolchain_current_if_none(jobs: list) -> None:
    if Toolchain.objects.filter(is_current=True).exists() or not jobs:
        return
    toolchain = Toolchain.objects.get(fingerprint=jobs[0]["toolchain"])
    toolchain.is_current = True
    toolchain.save(update_fields=["is_current"])
    AuditEvent.record(
        verb="toolchain.current",
        obj=toolchain,
        before={"current_toolchains": []},
        after={"current_toolchains": [toolchain.name], "why": "evidence import"},
    )


def _shapes_add(jobs: list) -> dict:
    """Shapes of the jobs by (operator, dims key, dtype), adding those this
    server lacks (a profile never imported here) with the weight they were
    served at; known shapes stay as they are."""

    def known() -> dict:
        shapes = Shape.objects.filter(
            operator__name__in={job["operator"] for job in jobs}
        ).select_related("operator")
        return {(s.operator.name, s.dims_key, s.dtype): s for s in shapes}

    shapes = known()
    missing: dict[tuple, list] = {}
    for job in jobs:
        if (job["operator"], dims_key(job["dims"]), job["dtype"]) not in shapes:
            group = (str(job.get("profile") or "evidence"), bool(job.get("served")))
            missing.setdefault(group, []).append(
                (job["operator"], job["dims"], job["dtype"], job.get("weight", 0.0))
            )
    for (profile, served), rows in missing.items():
        shape_import(rows=rows, source_profile=profile, served=served)
    return known() if missing else shapes


def _jobs_recreate(jobs: list, runner: Runner, measured: dict) -> int:
    """Create the evidence's jobs this server lacks; returns how many of its
    jobs wait for a result."""
    wanted = {job["job"]: job for job in jobs}
    taken = ValidationJob.objects.filter(pk__in=wanted).select_related("shape")
    for job in taken:
        spec = wanted.pop(job.pk)
        if job.runner_id != runner.pk or job.shape.dims_key != dims_key(spec["dims"]):
            raise ValidationError(
                f"job id {job.pk} is another job here: evidence is replayed into "
                "a database whose job ids it does not share (a fresh one)"
            )
    if not wanted:
        return ValidationJob.objects.filter(
            pk__in=[job["job"] for job in jobs], state=JobState.RUNNING
        ).count()
    positions = {job["job"]: i for i, job in enumerate(jobs)}
    cells = _Cells(_shapes_add(list(wanted.values())), positions)
    sweep = Sweep.objects.create(
        filters={"evidence_of": runner.name, **measured}, total=len(wanted)
    )
    now = timezone.now()
    ValidationJob.objects.bulk_create(
        ValidationJob(
            pk=pk,
            **cells.of(spec),
            stage=spec["stage"],
            seed=spec.get("seed") or 0,
            attempt=spec["attempt"],
            queue=f"bundle.{runner.name}",
            state=JobState.RUNNING,
            runner=runner,
            started_at=now,
            sweep=sweep,
        )
        for pk, spec in wanted.items()
    )
    # Ids were given, not drawn: move PostgreSQL's sequence past them.
    with connection.cursor() as cursor:
        for sql in connection.ops.sequence_reset_sql(
            no_style(), [ValidationJob, Sweep]
        ):
            cursor.execute(sql)
    return len(jobs)


class _Cells:
    """The revision, shape, device type and toolchain each job ran, as this
    server knows them, read once for the whole file; a cell it does not know
    is the file's error."""

    def __init__(self, shapes: dict, positions: dict[int, int]):
        self.shapes, self.positions = shapes, positions
        self.device_types = list(DeviceType.objects.all())
        self.toolchains = {t.fingerprint: t for t in Toolchain.objects.all()}
        self.revisions: dict[tuple, KernelRevision] = {}

    def of(self, spec: dict) -> dict:
        where = (
            f"jobs[{self.positions[spec['job']]}] (job {spec['job']}, "
            f"{spec['operator']} {spec['dims']} {spec['dtype']})"
        )
        shape = self.shapes[spec["operator"], dims_key(spec["dims"]), spec["dtype"]]
        device = spec["device"] if isinstance(spec["device"], dict) else {}
        matches = [
            d
            for d in self.device_types
            if device and all(getattr(d, k, None) == v for k, v in device.items())
        ]
        device_type = matches[0] if matches else None
        toolchain = self.toolchains.get(spec["toolchain"])
        if device_type is None or toolchain is None:
            raise ValidationError(f"{where}: its device type or toolchain is unknown")
        key = (shape.operator_id, spec["revision"])
        if key not in self.revisions:
            self.revisions[key] = _revision(*key)
        return {
            "revision": self.revisions[key],
            "shape": shape,
            "device_type": device_type,
            "toolchain": toolchain,
        }


def _revision(operator_id: int, sha256: str) -> KernelRevision:
    """The library revision the lab ran. One this server no longer has (the
    library changed since) is kept, not current and without its text, so its
    cells show as stale rather than vanish."""
    revision, _ = KernelRevision.objects.get_or_create(
        operator_id=operator_id,
        source_sha256=sha256,
        defaults={
            "origin": KernelRevision.Origin.LIBRARY,
            "review_state": KernelRevision.Review.APPROVED,
        },
    )
    return revision
