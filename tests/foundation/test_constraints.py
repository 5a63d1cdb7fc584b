"""Uniqueness and allowed values are database constraints: raw writes that
bypass Python validation are refused by SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from matrix.models import (
    AuditEvent,
    Cell,
    CurrentRevision,
    DeviceType,
    KernelRevision,
    Operator,
    Result,
    Shape,
    Toolchain,
    ValidationJob,
)
from matrix.services import shape_import, toolchain_register

pytestmark = pytest.mark.django_db
SHA = "a" * 64


@pytest.fixture
def gemm():
    return Operator.objects.create(name="gemm", dims=["M", "N", "K"])


@pytest.fixture
def cell_parts(gemm):
    revision = KernelRevision.objects.create(
        operator=gemm,
        source_sha256=SHA,
        origin="library",
        review_state="approved",
        is_current=True,
    )
    shape = Shape.objects.create(
        operator=gemm, dims={"M": 1, "N": 2, "K": 3}, dtype="float16"
    )
    device = DeviceType.objects.create(
        vendor="NVIDIA", model="H200", arch="sm_90a", backend="cuda"
    )
    toolchain = Toolchain.objects.create(
        name="tl", tilelang_version="0.1.15", fingerprint="b" * 64
    )
    return revision, shape, device, toolchain


def refused(**kwargs):
    return pytest.raises(IntegrityError, **kwargs)


def test_an_unknown_backend_is_refused_by_the_database():
    with refused(), transaction.atomic():
        DeviceType.objects.create(vendor="X", model="Y", backend="opencl")


def test_a_device_type_is_recorded_once():
    DeviceType.objects.create(
        vendor="AMD", model="MI300X", arch="gfx942", backend="hip"
    )
    with refused(), transaction.atomic():
        DeviceType.objects.create(
            vendor="AMD", model="MI300X", arch="gfx942", backend="hip"
        )


def test_an_unknown_dtype_is_refused_by_the_database(gemm):
    with refused(), transaction.atomic():
        Shape.objects.create(
            operator=gemm, dims={"M": 1, "N": 1, "K": 1}, dtype="float8"
        )


def test_the_same_shape_and_dtype_is_stored_once(gemm):
    Shape.objects.create(operator=gemm, dims={"M": 1, "N": 2, "K": 3}, dtype="float16")
    with refused(), transaction.atomic():
        Shape.objects.create(
            operator=gemm, dims={"M": 1, "N": 2, "K": 3}, dtype="float16"
        )


def test_an_operator_has_one_current_revision_per_backend(gemm):
    first, second = (
        KernelRevision.objects.create(
            operator=gemm,
            source_sha256=n * 64,
            origin="library",
            review_state="approved",
        )
        for n in "12"
    )
    CurrentRevision.objects.create(operator=gemm, backend="c", revision=first)
    CurrentRevision.objects.create(operator=gemm, backend="cuda", revision=second)
    with refused(), transaction.atomic():
        CurrentRevision.objects.create(operator=gemm, backend="c", revision=second)
    with refused(), transaction.atomic():
        CurrentRevision.objects.create(operator=gemm, backend="tpu", revision=second)


def test_a_revision_hash_must_be_a_sha256(gemm):
    with refused(), transaction.atomic():
        KernelRevision.objects.create(
            operator=gemm,
            source_sha256="not-a-hash",
            origin="library",
            review_state="approved",
        )


def test_a_toolchain_fingerprint_is_unique_and_a_duplicate_says_whose_it_is():
    toolchain_register(name="tl-0.1.15", components={"tilelang": "0.1.15"})
    with pytest.raises(ValidationError, match="already registered as 'tl-0.1.15'"):
        toolchain_register(name="other", components={"tilelang": "0.1.15"})
    assert Toolchain.objects.count() == 1
    with refused(), transaction.atomic():
        Toolchain.objects.create(
            name="raw",
            tilelang_version="x",
            fingerprint=Toolchain.objects.get().fingerprint,
        )


def test_a_result_is_stored_once_per_job_attempt_and_status_is_on_the_ladder(
    cell_parts,
):
    revision, shape, device, toolchain = cell_parts
    job = ValidationJob.objects.create(
        revision=revision, shape=shape, device_type=device, toolchain=toolchain
    )
    common = dict(
        job=job,
        attempt=1,
        revision=revision,
        shape=shape,
        device_type=device,
        toolchain=toolchain,
    )
    Result.objects.create(status="pass", **common)
    with refused(), transaction.atomic():
        Result.objects.create(status="pass", **common)
    with refused(), transaction.atomic():
        Result.objects.create(status="probably_fine", **{**common, "attempt": 2})


def test_a_job_state_outside_the_lifecycle_is_refused(cell_parts):
    revision, shape, device, toolchain = cell_parts
    with refused(), transaction.atomic():
        ValidationJob.objects.create(
            revision=revision,
            shape=shape,
            device_type=device,
            toolchain=toolchain,
            state="paused",
        )


def passed(cell_parts) -> Result:
    """A passing result of a new job on the cell."""
    revision, shape, device, toolchain = cell_parts
    cell = dict(revision=revision, shape=shape, device_type=device, toolchain=toolchain)
    job = ValidationJob.objects.create(**cell)
    return Result.objects.create(job=job, attempt=1, status="pass", **cell)


def test_one_cell_per_shape_device_and_toolchain(cell_parts):
    revision, shape, device, toolchain = cell_parts
    result = passed(cell_parts)
    parts = dict(
        shape=shape,
        device_type=device,
        toolchain=toolchain,
        revision=revision,
        result=result,
        status="pass",
        updated_at=timezone.now(),
    )
    Cell.objects.create(**parts)
    with refused(), transaction.atomic():
        Cell.objects.create(**parts)


def test_shape_dims_must_match_the_operator_and_nothing_is_half_written(gemm):
    rows = [
        ("gemm", {"M": 1, "N": 2, "K": 3}, "float16", 1.0),
        ("gemm", {"M": 1, "N": 2}, "float16", 1.0),
    ]
    with pytest.raises(ValidationError, match=r"row 2 \(gemm\).*missing \['K'\]"):
        shape_import(rows=rows, source_profile="p")
    assert Shape.objects.count() == 0


def test_an_unknown_dtype_in_an_import_is_a_clear_error(gemm):
    with pytest.raises(ValidationError, match="unknown dtype 'float8'"):
        shape_import(
            rows=[("gemm", {"M": 1, "N": 1, "K": 1}, "float8", 1.0)], source_profile="p"
        )


def test_the_audit_log_is_append_only(gemm):
    event = AuditEvent.record(verb="test.event", obj=gemm, after={"x": 1})
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        event.delete()
    with pytest.raises(PermissionError):
        AuditEvent.objects.all().update(verb="rewritten")
    with pytest.raises(PermissionError):
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.get().verb == "test.event"


def test_a_result_envelope_nonce_is_stored_once(cell_parts):
    """The last line against a replayed envelope, should ingest's own
    check be bypassed: a second receipt with a spent nonce is refused."""
    from matrix.fleet.models import Receipt, Runner

    runner = Runner.objects.create(name="h200-a", public_key="c" * 64)
    receipt = dict(runner=runner, nonce="n" * 64, signature="s" * 88, issued_at="x")
    Receipt.objects.create(result=passed(cell_parts), **receipt)
    with refused(), transaction.atomic():
        Receipt.objects.create(result=passed(cell_parts), **receipt)
