"""Ingest: signed results checked (signature, runner identity, assignment,
replay) and stored once per job attempt, with their receipts, job states
and cells, in one transaction."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from matrix.models import Cell, JobState, Result, Status, ValidationJob
from runners import bulk
from runners.models import Receipt, Runner
from runners.services.envelopes import (
    RESULT_MAX_AGE_S,
    envelope_runner,
    payload_verify,
)
from runners.services.errors import Conflict

ERROR_MESSAGE_CAP = 8 * 1024
VERIFY_PARALLEL_FROM = 64
VERIFY_THREADS = 4


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
    runner = envelope_runner(envelope, runners)
    payload = payload_verify(
        envelope, runner, kind="result", max_age_s=RESULT_MAX_AGE_S
    )
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
