"""A small gate world: two toolchains, a CPU and a CUDA device type, served
softmax and gemm shapes, a reviewer group of three, and a proposer.

Results are written the way ingest leaves them (job, result, cell) so the
gate reads exactly what it reads in production."""

from __future__ import annotations

import hashlib
from itertools import count

import pytest
from django.contrib.auth.models import Group, Permission
from django.utils import timezone

from matrix.fleet.models import Runner, RunnerToolchain
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
from matrix.services import toolchain_register

_seeds = count(1)


@pytest.fixture
def control_worker(django_capture_on_commit_callbacks):
    """What the control worker does once a transaction commits, done in
    place: ``control_worker(fn, ...)`` calls ``fn`` and then runs the tasks
    it enqueued on commit (the gate's background re-evaluation among them),
    as the worker would run them."""
    from matrix.celery import app

    app.conf.task_always_eager = True

    def run(fn, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return fn(*args, **kwargs)

    yield run
    app.conf.task_always_eager = False


@pytest.fixture
def people(db, owner, reviewer, django_user_model):
    """The proposer (with the propose permission, and a reviewer too, so
    only the self-approval rule stops them) and three more reviewers."""
    group, _ = Group.objects.get_or_create(name="reviewer")  # a role since migrate
    reviewers = [reviewer] + [
        django_user_model.objects.create_user(f"reviewer{i}", password="pw-123456")
        for i in (2, 3)
    ]
    group.user_set.add(owner, *reviewers)
    owner.user_permissions.add(Permission.objects.get(codename="propose_upgrade"))
    return django_user_model.objects.get(pk=owner.pk), reviewers


@pytest.fixture
def world(people):
    cpu = DeviceType.objects.create(vendor="x86-64", model="CPU", backend="c")
    h200 = DeviceType.objects.create(
        vendor="NVIDIA", model="H200", arch="sm_90a", backend="cuda"
    )
    operators = {}
    for name, dims in (("softmax", ["M", "N"]), ("gemm", ["M", "N", "K"])):
        op = Operator.objects.create(name=name, dims=dims)
        revision = KernelRevision.objects.create(
            operator=op,
            source_sha256=hashlib.sha256(name.encode()).hexdigest(),
            origin="library",
            review_state="approved",
        )
        make_current(revision, Backend.values)
        operators[name] = op
    shapes = {
        "softmax": Shape.objects.create(
            operator=operators["softmax"],
            dims={"M": 64, "N": 256},
            dtype="float32",
            served=True,
            weight=2.0,
        ),
        "gemm": Shape.objects.create(
            operator=operators["gemm"],
            dims={"M": 64, "N": 64, "K": 64},
            dtype="float32",
            served=True,
            weight=1.0,
        ),
        "unserved": Shape.objects.create(
            operator=operators["softmax"],
            dims={"M": 7, "N": 33},
            dtype="float32",
            served=False,
        ),
    }
    old = toolchain_register(
        name="tilelang-0.1.13", components={"tilelang": "0.1.13"}, current=True
    )
    new = toolchain_register(name="tilelang-0.1.15", components={"tilelang": "0.1.15"})
    owner, reviewers = people
    return World(
        cpu=cpu,
        h200=h200,
        shapes=shapes,
        old=old,
        new=new,
        owner=owner,
        reviewers=reviewers,
    )


class World:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def record(
        self,
        shape,
        device_type,
        toolchain,
        status,
        kernel_ms=1.0,
        samples=None,
        reference_ms=1.0,
        code=None,
    ):
        """One finished job's result and the cell it updates. A pass is timed
        against the PyTorch reference, as the harness times it; by default
        the two take as long."""
        return record_result(
            shape=self.shapes[shape] if isinstance(shape, str) else shape,
            device_type=device_type,
            toolchain=toolchain,
            status=status,
            kernel_ms=kernel_ms,
            samples=samples,
            reference_ms=reference_ms,
            code=code,
        )

    def green(self, toolchain, device_types=None, kernel_ms=1.0, samples=None):
        """Every served cell passes on ``toolchain``."""
        for dt in device_types or [self.cpu]:
            for shape in ("softmax", "gemm"):
                self.record(shape, dt, toolchain, Status.PASS, kernel_ms, samples)


def record_result(
    *,
    shape,
    device_type,
    toolchain,
    status,
    kernel_ms,
    samples,
    reference_ms=1.0,
    code=None,
):
    """``samples``: the kernel's timing samples; ``code``: its generated
    source, stored once per text as ingest stores it."""
    revision = shape.operator.current_revision(device_type.backend)
    job = ValidationJob.objects.create(
        revision=revision,
        shape=shape,
        device_type=device_type,
        toolchain=toolchain,
        state=ValidationJob.State.DONE,
        seed=next(_seeds),
    )
    passed = status == Status.PASS
    result = Result.objects.create(
        job=job,
        attempt=1,
        revision=revision,
        shape=shape,
        device_type=device_type,
        toolchain=toolchain,
        status=status,
        kernel_ms=kernel_ms if passed else None,
        reference_ms=reference_ms if passed else None,
        error=Blob.stored("" if passed else f"{status} in the kernel"),
        source=Blob.stored(code),
        fingerprint=toolchain.fingerprint,
        details={"kernel_ms_samples": samples} if samples else {},
    )
    Cell.objects.update_or_create(
        shape=shape,
        device_type=device_type,
        toolchain=toolchain,
        defaults={
            "revision": revision,
            "result": result,
            "status": status,
            "kernel_ms": result.kernel_ms,
            "reference_ms": result.reference_ms,
            "updated_at": timezone.now(),
        },
    )
    return result


def online_runner(name, *, device_types, toolchains, nvcc=False):
    """A runner that is online now, with these devices and toolchains: the
    planner routes their cells to it, so their jobs' results can arrive."""
    runner = Runner.objects.create(
        name=name,
        public_key=hashlib.sha256(name.encode()).hexdigest(),  # one key a runner
        state=Runner.State.ONLINE,
        health=Runner.Health.ACTIVE,  # approved: a new runner starts pending
        last_heartbeat=timezone.now(),
        inventory={"nvcc": nvcc},
    )
    runner.device_types.set(device_types)
    for toolchain in toolchains:
        RunnerToolchain.objects.create(
            runner=runner, toolchain=toolchain, interpreter="/usr/bin/python3"
        )
    return runner


def cpu_host(tmp_path, *, name: str, interpreters: list[str]):
    """A CPU runner hosting one toolchain per interpreter: registered with
    what each one probes, approved, online (so the planner routes ``c``
    validate jobs to it), its key on disk. Its HostConfig runs jobs in the
    sandboxed harness; where results go is the caller's to patch."""
    from datetime import timedelta

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from matrix.fleet import keys, services
    from runners import host, protocol, signing

    key = Ed25519PrivateKey.generate()
    registered = services.runner_register(
        token=services.token_create(expires=timedelta(hours=1)),
        name=name,
        public_key=signing.public_key_hex(key),
        inventory={
            "devices": [host.cpu_device()],
            "toolchains": [host.toolchain_probe(i) for i in interpreters],
            "nvcc": False,
            "host": {"hostname": f"{name}-test"},
        },
    )
    services.runner_approve(name=name)
    services.runner_heartbeat(
        envelope=protocol.heartbeat_envelope(
            runner_name=registered.name, sequence=1, state="online", key=key
        )
    )
    directory = tmp_path / "runner"
    signing.key_write(directory / "runner.key", key)
    hosted = {
        rt.toolchain.fingerprint: {
            "interpreter": rt.interpreter,
            "name": rt.toolchain.name,
            "id": rt.toolchain_id,
        }
        for rt in RunnerToolchain.objects.filter(runner=registered).select_related(
            "toolchain"
        )
    }
    return host.HostConfig(
        directory=directory,
        name=registered.name,
        server="http://testserver",
        server_public_key=keys.server_public_key(),
        queues=registered.queues(),
        toolchains=hosted,
    )
