"""Runner fixtures: keys, a CPU runner's inventory, registered runners, and
signing helpers that play the runner's side of the protocol."""

from __future__ import annotations

from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from matrix.fleet import keys, services
from matrix.fleet.services.coherence import PASS_METRICS
from matrix.models import DeviceType, Shape
from runners import protocol, signing
from runners.harness.result import SUCCESS_FOR_STAGE

CPU_COMPONENTS = {
    "tilelang": "0.1.15",
    "apache_tvm_ffi": "0.1.0",
    "torch": "2.13.0+cpu",
    "python": "CPython 3.11.9",
    "platform": "Linux-x86_64",
}


@pytest.fixture(autouse=True)
def server_key_file(tmp_path, monkeypatch):
    """A server key per test, so no test signs with the repository's."""
    monkeypatch.setenv("TILEMATRIX_SERVER_KEY_FILE", str(tmp_path / "server.key"))


def cpu_inventory(**toolchain) -> dict:
    return {
        "devices": [
            {
                "vendor": "x86-64",
                "model": "CPU",
                "arch": "",
                "backend": "c",
                "memory_gb": None,
            }
        ],
        "toolchains": [
            {
                "name": "tilelang-0.1.15-cpu",
                "interpreter": "/usr/bin/python3",
                "components": CPU_COMPONENTS,
                "fingerprint": "a" * 64,
                **toolchain,
            }
        ],
        "nvcc": False,
        "host": {"hostname": "cpu-box"},
    }


def cpu_toolchain():
    """The CPU runners' toolchain: recorded by the first approved one, or
    here where none is."""
    from matrix.fleet.services.registration import TOOLCHAIN_KEYS
    from matrix.services import toolchain_register

    components = {k: CPU_COMPONENTS.get(k) for k in TOOLCHAIN_KEYS}
    return toolchain_register(name="tilelang-0.1.15-cpu", components=components)


def resigned(envelope: dict, key, **changes) -> dict:
    """``envelope`` with ``changes`` (a payload, a nonce...), signed again by
    ``key``: what a runner's key holder could send."""
    body = {k: v for k, v in envelope.items() if k != "signature"} | changes
    return body | {"signature": key.sign(signing.canonical(body)).hex()}


class RunnerHand:
    """A registered runner and its private key: signs what a runner sends."""

    def __init__(self, runner, key):
        self.runner, self.key = runner, key
        self.sequence = 0

    @property
    def name(self) -> str:
        return self.runner.name

    def heartbeat(self, state="online", sequence=None) -> dict:
        self.sequence = sequence if sequence is not None else self.sequence + 1
        return protocol.heartbeat_envelope(
            runner_name=self.name, sequence=self.sequence, state=state, key=self.key
        )

    def request(self, kind, **fields) -> dict:
        return protocol.request_envelope(
            kind=kind, runner_name=self.name, key=self.key, **fields
        )

    def result(self, job, status=None, **fields) -> dict:
        """A result for ``job``: by default its stage's success (a validate
        job's pass, with metrics well within tolerance)."""
        status = status or SUCCESS_FOR_STAGE[job.stage]
        passed = status == "pass"
        result = {
            "status": status,
            "stage_reached": job.stage,
            "metrics": dict.fromkeys(PASS_METRICS, 0.0 if passed else None),
            "timings": {"compile_s": 0.5, "kernel_ms": None, "reference_ms": None},
            "error": None,
            "fingerprint": {"hash": "a" * 64, "components": CPU_COMPONENTS},
            **fields,
        }
        return protocol.result_envelope(
            job={"job": job.pk, "attempt": job.attempt},
            result=result,
            runner_name=self.name,
            key=self.key,
        )


@pytest.fixture
def register(catalog):
    """Register a runner by name, approved unless told otherwise; returns a
    RunnerHand."""

    def register(name="cpu-1", inventory=None, online=True, approved=True):
        key = Ed25519PrivateKey.generate()
        token = services.token_create(expires=timedelta(hours=1))
        runner = services.runner_register(
            token=token,
            name=name,
            public_key=signing.public_key_hex(key),
            inventory=inventory or cpu_inventory(),
        )
        if approved:
            runner = services.runner_approve(name=name)
        hand = RunnerHand(runner, key)
        if online:
            services.runner_heartbeat(envelope=hand.heartbeat())
            runner.refresh_from_db()
        return hand

    return register


@pytest.fixture
def cpu_runner(register):
    return register()


@pytest.fixture
def cpu_cells(catalog):
    """The float32 cpu-smoke shapes on the CPU device type, with the CPU
    toolchain: the cells a CPU runner validates for real."""

    def cells():

        cpu = DeviceType.objects.get(backend="c")
        toolchain = cpu_toolchain()
        shapes = Shape.objects.filter(source_profile="cpu-smoke").order_by("pk")
        return [(s, cpu, toolchain) for s in shapes]

    return cells


@pytest.fixture
def running_job(cpu_runner, cpu_cells):
    """One job planned and claimed by the CPU runner."""
    sweep = services.sweep_plan(cells=cpu_cells()[:1])
    job = sweep.jobs.get()
    assert services.job_claim(
        job_id=job.pk, attempt=job.attempt, runner=cpu_runner.runner
    )
    job.refresh_from_db()
    return job


@pytest.fixture
def host_dir_of(tmp_path, monkeypatch, server_http):
    """A runner's key directory, as `runner register` leaves it, with the
    harness replaced by its edge double; its requests to the server
    (http://testserver) are answered in process."""
    import sys

    from runners import host

    def host_dir_of(hand: RunnerHand):
        directory = tmp_path / "runner"
        signing.key_write(directory / "runner.key", hand.key)
        # As registration answers it: claimed, recorded once approved.
        (toolchain,) = hand.runner.claimed_toolchains()
        config = host.HostConfig(
            directory=directory,
            name=hand.name,
            server="http://testserver",
            server_public_key=keys.server_public_key(),
            queues=hand.runner.queues(),
            toolchains={
                toolchain.fingerprint: {
                    "interpreter": sys.executable,
                    "name": toolchain.name,
                    "id": toolchain.pk,
                }
            },
        )
        config.save()
        monkeypatch.setenv(host.RUNNER_DIR_ENV, str(directory))
        monkeypatch.setenv(host.HARNESS_ENV, "tests.runners.edge_harness")
        return config

    return host_dir_of


@pytest.fixture
def host_dir(cpu_runner, host_dir_of):
    """The CPU runner's key directory (see host_dir_of)."""
    return host_dir_of(cpu_runner)


@pytest.fixture
def eager_celery():
    """Tasks sent from a task run in place, so one test sees the whole
    chain without a broker."""
    from matrix.celery import app
    from runners import jobs  # noqa: F401 (the runner's task, by name, in place)

    app.conf.task_always_eager = True
    yield app
    app.conf.task_always_eager = False
