"""Fixtures for the page tests: the demo catalogue with results in every
state the matrix can show, and a routable runner for the CPU column."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from matrix.models import (
    Backend,
    Blob,
    Cell,
    DeviceType,
    KernelRevision,
    Operator,
    Result,
    Shape,
    Status,
    ValidationJob,
)
from matrix.revisions import make_current
from matrix.services import DEMO_DEVICE_TYPES, toolchain_register

SIGNATURE = "sig-shared-compile"
KERNEL_SOURCE = "__global__ void k_main(float* A) { /* generated */ }"


def record(
    shape,
    device_type,
    toolchain,
    status,
    *,
    revision=None,
    when=None,
    error_message="",
    kernel_source="",
    **fields,
):
    """A job, its result and the cell pointing at it, as ingest leaves them:
    the texts stored once each (``Blob``)."""
    revision = revision or shape.operator.current_revision(device_type.backend)
    job = ValidationJob.objects.create(
        revision=revision,
        shape=shape,
        device_type=device_type,
        toolchain=toolchain,
        state=ValidationJob.State.DONE,
    )
    result = Result.objects.create(
        job=job,
        attempt=1,
        revision=revision,
        shape=shape,
        device_type=device_type,
        toolchain=toolchain,
        status=status,
        error=Blob.stored(error_message),
        source=Blob.stored(kernel_source),
        **fields,
    )
    if when is not None:
        Result.objects.filter(pk=result.pk).update(created_at=when)
        result.created_at = when
    Cell.objects.update_or_create(
        shape=shape,
        device_type=device_type,
        toolchain=toolchain,
        defaults={
            "revision": revision,
            "result": result,
            "status": status,
            "error_signature": result.error_signature,
            "kernel_ms": result.kernel_ms,
            "reference_ms": result.reference_ms,
            "updated_at": result.created_at,
        },
    )
    return result


OPERATORS = {
    "gemm": (
        ["M", "N", "K"],
        [{"M": 4096, "N": 6144, "K": 4096}, {"M": 1, "N": 6144, "K": 4096}],
    ),
    "rmsnorm": (["M", "N"], [{"M": 4096, "N": 4096}, {"M": 1, "N": 4096}]),
    "softmax": (["M", "N"], [{"M": 512, "N": 32000}, {"M": 7, "N": 33}]),
}


@pytest.fixture
def ui_catalog(db):
    """A small catalogue built directly, so these tests do not depend on the
    kernel library's registry: four device types, three operators with a
    current revision, served shapes in two dtypes and one unserved shape."""
    for spec in DEMO_DEVICE_TYPES:
        DeviceType.objects.create(**spec)
    weight = 100.0
    for name, (dims, shapes) in OPERATORS.items():
        op = Operator.objects.create(name=name, dims=dims)
        revision = KernelRevision.objects.create(
            operator=op,
            source_sha256=hashlib.sha256(name.encode()).hexdigest(),
            origin=KernelRevision.Origin.LIBRARY,
            review_state=KernelRevision.Review.APPROVED,
        )
        make_current(revision, Backend.values)
        for dims_ in shapes:
            for dtype in ("float16", "bfloat16"):
                weight -= 3
                Shape.objects.create(
                    operator=op,
                    dims=dims_,
                    dtype=dtype,
                    served=True,
                    weight=weight,
                    source_profile="llama-3-8b",
                )
        Shape.objects.create(operator=op, dims=shapes[-1], dtype="float32")
    return Operator.objects.all()


@pytest.fixture
def toolchains(ui_catalog):
    old = toolchain_register(name="tl-0.1.13", components={"tilelang": "0.1.13"})
    current = toolchain_register(
        name="tl-0.1.15", components={"tilelang": "0.1.15"}, current=True
    )
    return old, current


@pytest.fixture
def device_types(ui_catalog):
    return {d.backend: d for d in DeviceType.objects.all()}


@pytest.fixture
def results(toolchains, device_types):
    """Pass, evidence, failures sharing a signature, a stale revision, and
    history across two toolchains for one cell."""
    old, current = toolchains
    served = list(Shape.objects.served().by_weight().select_related("operator")[:4])
    top, second, third, fourth = served
    cpu, cuda, hip = device_types["c"], device_types["cuda"], device_types["hip"]
    now = timezone.now()
    details = {
        "tolerance": {
            "rel_err": 1e-2,
            "atol": 1e-2,
            "rtol": 1e-2,
            "max_mismatch_ratio": 0.0,
            "reason": "float16 accumulates in float32",
        },
        "fingerprint_components": {"tilelang": "0.1.15", "torch": "2.13.0"},
    }
    for i, (tc, ms) in enumerate([(old, 0.5), (current, 0.42), (current, 0.40)]):
        record(
            top,
            cpu,
            tc,
            Status.PASS,
            kernel_ms=ms,
            reference_ms=0.9,
            rel_err=1e-4 * (i + 1),
            fingerprint="f" * 64,
            details=details,
            kernel_source=KERNEL_SOURCE,
            when=now - timedelta(hours=3 - i),
        )
    record(top, cuda, current, Status.BUILT)
    message = "error: tile shape does not divide M at /toolchain/tilelang/lower.py"
    for shape in (second, third):
        record(
            shape,
            cuda,
            current,
            Status.COMPILE_ERROR,
            error_signature=SIGNATURE,
            error_message=message,
        )
    stale_revision = KernelRevision.objects.create(
        operator=fourth.operator,
        source_sha256=hashlib.sha256(b"old").hexdigest(),
        origin=KernelRevision.Origin.LIBRARY,
        review_state=KernelRevision.Review.APPROVED,
    )
    record(fourth, hip, current, Status.PASS, revision=stale_revision, kernel_ms=1.0)
    return {"top": top, "second": second, "third": third, "fourth": fourth}


@pytest.fixture
def cpu_runner(device_types, toolchains):
    from matrix.fleet.models import Runner, RunnerToolchain

    runner = Runner.objects.create(
        name="cpu-host",
        public_key="ab" * 32,
        state=Runner.State.ONLINE,
        health=Runner.Health.ACTIVE,
        last_heartbeat=timezone.now(),
    )
    runner.device_types.set([device_types["c"]])
    RunnerToolchain.objects.create(
        runner=runner, toolchain=toolchains[1], interpreter="/usr/bin/python3"
    )
    return runner


@pytest.fixture
def viewer(django_user_model):
    """A reader with the viewer role, as most users of these pages are."""
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user("viewer", password="viewer-pass-123")
    user.groups.add(Group.objects.get(name="viewer"))
    return user


@pytest.fixture
def sweeper(django_user_model):
    """A reviewer: the role that may run sweeps."""
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user("sweeper", password="sweeper-pass-123")
    user.groups.add(Group.objects.get(name="reviewer"))
    return user
