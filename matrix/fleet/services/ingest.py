"""Ingest: signed results checked (signature, runner identity, assignment,
replay) and stored once per job attempt, with their receipts, job states
and cells, in one transaction.

A batch costs a fixed number of statements whatever its size: one SELECT
each for the signers, the nonces already used, the jobs (locked), the
results already stored and the texts (kernel sources and error messages,
stored once per SHA-256: an INSERT and a SELECT more for the new ones),
then one INSERT each for results and receipts, one UPDATE per job outcome
and one upsert per kind of cell."""

from __future__ import annotations

import hashlib
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from matrix.events import results_checked, results_stored
from matrix.fleet import bulk
from matrix.fleet.models import Receipt, Runner
from matrix.fleet.services.coherence import result_check, samples_check
from matrix.fleet.services.envelopes import (
    RESULT_MAX_AGE_S,
    envelope_runner,
    payload_verify,
    shown,
)
from matrix.fleet.services.errors import Conflict
from matrix.fleet.services.planning import confirmations_plan
from matrix.models import Blob, Cell, JobState, Result, Status, ValidationJob
from matrix.models.blobs import texts_store

log = logging.getLogger(__name__)
ERROR_MESSAGE_CAP = 8 * 1024
VERIFY_PARALLEL_FROM = 64
VERIFY_THREADS = 4


@dataclass
class Outcome:
    status: str  # stored, duplicate or refused
    result: Result | None = None
    reason: str = ""
    code: int = 200


def _text(value, cap: int) -> str:
    """Text a database column can hold: PostgreSQL refuses NUL characters,
    and one runner message must not fail the batch it came in."""
    return str(value).replace("\x00", "\ufffd")[:cap]


def _json_safe(value):
    """``value`` with NUL characters replaced and non-finite or out-of-range
    numbers dropped, so that any JSON a runner signed can be stored."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_json_safe(str(k)): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**63:
        return None
    return value


def _error_fields(raw) -> tuple[str, str]:
    error = raw.get("error") or {}
    message = _text(error.get("message") or "", ERROR_MESSAGE_CAP)
    signature = _text(error.get("signature") or "", 64)
    if message and not signature:
        signature = hashlib.sha256(message.encode()).hexdigest()[:16]
    return signature, message


# A job's row as ingest reads it: attribute name -> column.
JOB_ROW = {
    "pk": "pk",
    "state": "state",
    "attempt": "attempt",
    "stage": "stage",
    "runner_id": "runner_id",
    "revision_id": "revision_id",
    "shape_id": "shape_id",
    "device_type_id": "device_type_id",
    "toolchain_id": "toolchain_id",
    "operator": "revision__operator__name",
    "dtype": "shape__dtype",
    "dims": "shape__dims",
    "device_model": "device_type__model",
    "device_backend": "device_type__backend",
    "confirms_id": "confirms_id",
    "sweep_id": "sweep_id",
}
STATUSES = frozenset(Status.values)
# Parts of a harness result that are objects when present (error is null
# when nothing failed).
RESULT_OBJECTS = ("metrics", "timings", "fingerprint", "error")


def _harness_evidence(raw: dict) -> dict:
    """What the harness learned beside the verdict, kept with the result:
    the input distributions a pass was checked on, how its sandbox confined
    the child and how far its timing can be trusted. Text only, capped."""
    kept = {}
    for key in ("timing_trust", "sandbox"):
        if isinstance(raw.get(key), str):
            kept[key] = _text(raw[key], 300)
    distributions = raw.get("distributions")
    if isinstance(distributions, list):
        kept["distributions"] = [
            _text(d, 40) for d in distributions[:16] if isinstance(d, str)
        ]
    return kept


# What the server stores for a result it refused for good (a pass beyond its
# tolerance, an impossible timing, a status the stage cannot reach).
REFUSED_FOR_GOOD = "the server refused this result, and would refuse it sent again: "


def _refused_result(job: SimpleNamespace, attempt: int, reason: str) -> Result:
    """The server's own infra_error result for a job attempt whose signed
    result it refused for good: the job ends failed, with the reason."""
    message = _text(REFUSED_FOR_GOOD + reason, 2000)
    return Result(
        job_id=job.pk,
        attempt=attempt,
        revision_id=job.revision_id,
        shape_id=job.shape_id,
        device_type_id=job.device_type_id,
        toolchain_id=job.toolchain_id,
        status=Status.INFRA_ERROR,
        stage_reached="",
        error_signature=hashlib.sha256(REFUSED_FOR_GOOD.encode()).hexdigest()[:16],
        error=Blob.of(message),
        details={"refused": True},
    )


def _result_from(job: SimpleNamespace, attempt: int, raw: dict) -> Result:
    status = raw.get("status")
    # A list or an object is no status either (and is not hashable).
    if not isinstance(status, str) or status not in STATUSES:
        raise ValidationError(
            f"result.status must be a status of the ladder, got {shown(status)}"
        )
    for part in RESULT_OBJECTS:
        if raw.get(part) is not None and not isinstance(raw[part], dict):
            raise ValidationError(
                f"result.{part} must be an object or null, got {shown(raw[part])}"
            )
    tolerance = result_check(
        stage=job.stage,
        operator=job.operator,
        dtype=job.dtype,
        raw=raw,
        shape=job.dims,
        device=(job.device_model, job.device_backend),
    )
    metrics = raw.get("metrics") or {}
    timings = raw.get("timings") or {}
    fingerprint = raw.get("fingerprint") or {}
    signature, message = _error_fields(raw)
    details = {k: raw[k] for k in ("target", "stage", "seed") if k in raw}
    details.update(_harness_evidence(raw))
    details.update(samples_check(raw))
    source = raw.get("kernel_source")
    # The tolerance the result was checked against: this server's.
    if tolerance is not None:
        details["tolerance"] = tolerance
    details["fingerprint_components"] = fingerprint.get("components") or {}
    if raw.get("error") and raw["error"].get("pass_name"):
        details["pass_name"] = _text(raw["error"]["pass_name"], 120)
    details = _json_safe(details)
    return Result(
        job_id=job.pk,
        attempt=attempt,
        revision_id=job.revision_id,
        shape_id=job.shape_id,
        device_type_id=job.device_type_id,
        toolchain_id=job.toolchain_id,
        status=status,
        stage_reached=_text(raw.get("stage_reached") or "", 10),
        rel_err=metrics.get("rel_err"),
        max_abs_err=metrics.get("max_abs_err"),
        mismatch_ratio=metrics.get("mismatch_ratio"),
        compile_s=timings.get("compile_s"),
        wall_s=timings.get("wall_s"),
        kernel_ms=timings.get("kernel_ms"),
        reference_ms=timings.get("reference_ms"),
        tflops=timings.get("tflops"),
        gbps=timings.get("gbps"),
        error_signature=signature,
        # Stored once per text with the batch (``texts_store``); the gate
        # compares the source's id to say "the generated code did not change".
        source=Blob.of(source if isinstance(source, str) else None),
        error=Blob.of(message),
        fingerprint=_text(fingerprint.get("hash") or "", 64),
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
    "wall_s",
    "kernel_ms",
    "reference_ms",
    "tflops",
    "gbps",
    "error_signature",
    "source",
    "error",
    "fingerprint",
    "details",
    "created_at",
]
CELL_KEY = ["shape", "device_type", "toolchain"]


# Failures a rerun confirms before they turn a green cell red: not
# infra_error (the runner's, never the kernel's) nor unsupported (the
# operator's own check, the same everywhere).
CONFIRMED_BEFORE_COUNTING = frozenset(
    {
        Status.COMPILE_ERROR,
        Status.MISMATCH,
        Status.UNSTABLE,
        Status.RUNTIME_ERROR,
        Status.TIMEOUT,
    }
)


def _confirmations(results: list[Result], jobs: dict) -> tuple[list, dict]:
    """Which results must wait for a rerun and which end one.

    A failure on a cell that passes on the same revision is held: the cell
    keeps its pass and a rerun is planned (``planning.confirmations_plan``).
    The rerun's result decides: a failure again counts as the cell's
    answer; a pass makes the cell ``unstable`` (right on some runs, wrong on
    others), pointing at the failure. Returns the held results and, for each
    rerun that passed, the failure it contradicts (result id -> failure)."""
    confirming = {r.pk: jobs[r.job_id].confirms_id for r in results}
    contradicted = {
        r.pk: confirming[r.pk]
        for r in results
        if r.status == Status.PASS and confirming[r.pk]
    }
    failures = [
        r
        for r in results
        if r.status in CONFIRMED_BEFORE_COUNTING and not confirming[r.pk]
    ]
    if not failures:
        return [], contradicted
    green = {
        (s, d, t): revision
        for s, d, t, revision in Cell.objects.filter(
            shape__pk__any={r.shape_id for r in failures}, status=Status.PASS
        ).values_list("shape_id", "device_type_id", "toolchain_id", "revision_id")
    }
    held = [
        r
        for r in failures
        if green.get((r.shape_id, r.device_type_id, r.toolchain_id)) == r.revision_id
    ]
    return held, contradicted


def _cells_upsert(results: list[Result], now, contradicted: dict | None = None) -> None:
    """Point each cell at its newest result, one statement per kind. An
    infra_error is the runner's trouble, not the kernel's: it fills an empty
    cell but never hides an answer already there. ``contradicted``: passes
    that contradict a failure (see ``_confirmations``): their cells become
    unstable and point at the failure."""
    contradicted = contradicted or {}
    failures = dict(
        Result.objects.filter(pk__in=set(contradicted.values())).values_list(
            "pk", "error_signature"
        )
        if contradicted
        else ()
    )
    latest = {}
    for result in results:
        latest[result.shape_id, result.device_type_id, result.toolchain_id] = result
    # In key order: two ingests writing the same cells lock them in the same
    # order, so one waits for the other instead of deadlocking.
    newest = [latest[key] for key in sorted(latest)]
    answers = [r for r in newest if r.status != Status.INFRA_ERROR]
    infra = [r for r in newest if r.status == Status.INFRA_ERROR]
    for rows, update in ((answers, True), (infra, False)):
        columns = {
            "shape": [r.shape_id for r in rows],
            "device_type": [r.device_type_id for r in rows],
            "toolchain": [r.toolchain_id for r in rows],
            "revision": [r.revision_id for r in rows],
            "result": [contradicted.get(r.pk, r.pk) for r in rows],
            "status": [
                Status.UNSTABLE if r.pk in contradicted else r.status for r in rows
            ],
            "error_signature": [
                failures.get(contradicted.get(r.pk), r.error_signature) for r in rows
            ],
            "kernel_ms": [None if r.pk in contradicted else r.kernel_ms for r in rows],
            "reference_ms": [
                None if r.pk in contradicted else r.reference_ms for r in rows
            ],
            "updated_at": [now] * len(rows),
        }
        bulk.columns_insert(
            Cell,
            columns,
            unique=CELL_KEY,
            update=[f for f in columns if f not in CELL_KEY] if update else None,
        )


def _check(
    envelope, runners: dict, max_age_s: float
) -> tuple[Runner, dict, dict] | Outcome:
    """Identity, signature and shape checks that need no lock: what the
    envelope says, or the Outcome refusing it."""
    try:
        runner = envelope_runner(envelope, runners)
        payload = payload_verify(envelope, runner, kind="result", max_age_s=max_age_s)
    except PermissionDenied as exc:
        return Outcome("refused", reason=str(exc), code=403)
    except ValidationError as exc:
        return Outcome("refused", reason="; ".join(exc.messages), code=400)
    return runner, payload, payload["result"]


def _checks(envelopes: list, runners: dict, max_age_s: float) -> list:
    """``_check`` of every envelope, in order. Ed25519 verification releases
    the GIL and is most of a batch's time, so a large batch is verified in a
    few contiguous slices side by side (a future per envelope cost more to
    hand out than a verification)."""

    def check_all(part: list) -> list:
        return [_check(envelope, runners, max_age_s) for envelope in part]

    if len(envelopes) < VERIFY_PARALLEL_FROM:
        return check_all(envelopes)
    size = -(-len(envelopes) // VERIFY_THREADS)
    parts = [envelopes[i : i + size] for i in range(0, len(envelopes), size)]
    with ThreadPoolExecutor(len(parts)) as pool:
        return [verdict for part in pool.map(check_all, parts) for verdict in part]


def _store(accepted: list[tuple[Result, Runner, dict]], jobs: dict) -> None:
    """Write the accepted results, their receipts, their jobs' new states
    and their cells; plan the reruns that confirm a green cell's failure."""
    now = timezone.now()
    results = [result for result, _, _ in accepted]
    for result in results:
        result.created_at = now
    texts_store(results)
    bulk.rows_insert(Result, results, fields=RESULT_FIELDS)
    bulk.columns_insert(
        Receipt,
        {
            "result": [result.pk for result in results],
            "runner": [runner.pk for _, runner, _ in accepted],
            "nonce": [envelope["nonce"] for _, _, envelope in accepted],
            "signature": [envelope["signature"] for _, _, envelope in accepted],
            "issued_at": [envelope["issued_at"][:40] for _, _, envelope in accepted],
            "received_at": [now] * len(accepted),
        },
    )
    # One UPDATE per outcome: bulk_update's CASE per row cost more than the
    # rest of the batch.
    for state, ids in (
        (JobState.DONE, {r.job_id for r in results if r.status != Status.INFRA_ERROR}),
        (
            JobState.FAILED,
            {r.job_id for r in results if r.status == Status.INFRA_ERROR},
        ),
    ):
        if ids:
            ValidationJob.objects.filter(pk__any=ids).update(
                state=state, finished_at=now
            )
    held, contradicted = _confirmations(results, jobs)
    waiting = {r.pk for r in held}
    _cells_upsert([r for r in results if r.pk not in waiting], now, contradicted)
    if held:
        confirmations_plan(failures=[(r, jobs[r.job_id].runner_id) for r in held])
    # The gate marks the open proposals they touch, and re-evaluates them
    # in the background once these are committed.
    results_stored.send(sender=Result, results=results)


# An archived evidence file is replayed whatever its age: each result in it
# is still single-use, by its job attempt and its nonce.
ARCHIVED = math.inf


def results_ingest(
    *, envelopes: list, max_age_s: float = RESULT_MAX_AGE_S
) -> list[Outcome]:
    """Store signed results, one Outcome per envelope in order. Each is
    checked alone (a bad one does not block the rest); the accepted ones are
    written together with their cells in one transaction. A live upload is
    refused past ``max_age_s``; ``ARCHIVED`` takes signed evidence of any
    age."""
    if not isinstance(envelopes, list):
        raise ValidationError("expected a list of result envelopes")
    names = {
        e.get("signer")
        for e in envelopes
        if isinstance(e, dict) and isinstance(e.get("signer"), str)
    }
    runners = {r.name: r for r in Runner.objects.filter(name__in=names)}
    outcomes = _checks(envelopes, runners, max_age_s)
    checked = {i: v for i, v in enumerate(outcomes) if not isinstance(v, Outcome)}

    with transaction.atomic():
        # nonce -> (signature, runner id, result) of each envelope stored.
        spent = {
            receipt.nonce: (receipt.signature, receipt.runner_id, receipt.result)
            for receipt in Receipt.objects.filter(
                nonce__any={envelopes[i]["nonce"] for i in checked}
            )
            .select_related("result")
            .only(
                "nonce", "signature", "runner_id", "result__job_id", "result__attempt"
            )
        }
        # Rows, not model instances: building thousands of instances cost
        # more than the query. Locked in id order, so two workers locking
        # overlapping batches queue behind each other instead of deadlocking.
        jobs = {
            row[0]: SimpleNamespace(**dict(zip(JOB_ROW, row, strict=True)))
            # Only the jobs are locked, not the shapes and operators joined.
            for row in ValidationJob.objects.select_for_update(of=("self",))
            .filter(pk__any={p["job"] for _, p, _ in checked.values()})
            .order_by("pk")
            .values_list(*JOB_ROW.values())
        }
        stored = {
            (r.job_id, r.attempt): r
            for r in Result.objects.filter(job__pk__any=jobs.keys()).only(
                "id", "job_id", "attempt"
            )
        }
        accepted = []
        for i, (runner, payload, raw) in checked.items():
            envelope, job = envelopes[i], jobs.get(payload["job"])
            key = (payload["job"], payload["attempt"])
            if envelope["nonce"] in spent:
                signature, signer_id, result = spent[envelope["nonce"]]
                # The very envelope stored before (an upload retried after
                # its reply was lost) is already stored; another envelope
                # with a spent nonce is a replay.
                if (signature, signer_id) == (envelope["signature"], runner.pk):
                    outcomes[i] = Outcome("duplicate", result=result)
                else:
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
            elif job.state == JobState.LOST:
                # Its infra_error result holds the attempt: this one is late,
                # not a copy of what is stored.
                outcomes[i] = Outcome(
                    "refused",
                    reason=f"job {job.pk} was given up (lost) before this result "
                    "came: plan the cell again",
                    code=409,
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
                    # The job's own runner signed it for the running attempt:
                    # sent again it would be refused again. The attempt ends
                    # failed with the reason (the cell can be planned again),
                    # and the job no longer waits, so the runner's outbox
                    # stops sending it.
                    reason = "; ".join(exc.messages)
                    result = _refused_result(job, payload["attempt"], reason)
                    outcomes[i] = Outcome(
                        "refused", reason=reason, code=400, result=result
                    )
                else:
                    outcomes[i] = Outcome("stored", result=result)
                stored[key] = result
                spent[envelope["nonce"]] = (envelope["signature"], runner.pk, result)
                accepted.append((result, runner, envelope))
        if accepted:
            _store(accepted, jobs)
        # Inside the transaction: a batch rolled back and tried again
        # message by message is heard of once.
        results_checked.send(sender=Result, outcomes=outcomes)
    _outcomes_log(outcomes, checked, jobs)
    return outcomes


def _outcomes_log(outcomes: list[Outcome], checked: dict, jobs: dict) -> None:
    """A line a result stored (or stored before), with the job, sweep and
    runner it belongs to as fields (``extra``): in JSON logs, a job's id
    finds its planning, its run on the runner and its storage here. The
    control task logs refusals (matrix.fleet.tasks)."""
    for i, (runner, payload, _) in checked.items():
        outcome, job = outcomes[i], jobs.get(payload["job"])
        if outcome.status == "refused":
            continue
        log.info(
            "result %s for job %s %s",
            outcome.result.pk,
            payload["job"],
            outcome.status,
            extra={
                "job_id": payload["job"],
                "attempt": payload["attempt"],
                "sweep_id": job.sweep_id if job else None,
                "runner": runner.name,
                "result_id": outcome.result.pk,
            },
        )


def result_ingest(*, envelope) -> tuple[Result, bool]:
    """Store one signed result; (result, created). A second copy of the same
    job attempt returns the stored one; a refusal raises with the reason."""
    (outcome,) = results_ingest(envelopes=[envelope])
    if outcome.status == "refused":
        exc = {403: PermissionDenied, 409: Conflict}.get(outcome.code, ValidationError)
        raise exc(outcome.reason)
    return outcome.result, outcome.status == "stored"
