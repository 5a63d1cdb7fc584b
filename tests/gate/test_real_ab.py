"""The real A/B on this machine: TileLang 0.1.13 (its own venv) as baseline,
0.1.15 (this venv) as candidate, target ``c``.

Everything runs the production path: a runner registered with both
toolchains, the proposal planning jobs through the sweep planner, each job
signed by the server, executed by ``runners.host.job_execute`` in the
sandboxed harness with that toolchain's interpreter, its result signed by the
runner and stored by ``runners.services.result_ingest``. Only the broker hop
between runner and control worker is replaced by a direct call."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from matrix.gate.models import UpgradeProposal
from matrix.gate.services import (
    policy_evaluate,
    proposal_approve,
    proposal_diff,
    proposal_open,
    proposals_reevaluate_for_results,
)
from matrix.models import (
    DeviceType,
    Operator,
    Result,
    Shape,
    Toolchain,
    ValidationJob,
)
from matrix.services import operator_sync_library
from runners import host, services, signing
from runners.models import RunnerToolchain

REPO = Path(__file__).resolve().parents[2]
TOOLCHAIN_0113 = Path(
    os.environ.get("TM_TOOLCHAIN_0113", REPO / "var" / "toolchains" / "tilelang-0.1.13")
)
# A handful of served CPU cells: softmax is the known difference.
SERVED = [
    ("softmax", {"M": 64, "N": 256}),
    ("softmax", {"M": 7, "N": 33}),
    ("elementwise_add", {"M": 64, "N": 256}),
]
REPEATS = 3


@pytest.fixture
def runner(db, tmp_path, monkeypatch):
    python_0113 = TOOLCHAIN_0113 / "bin" / "python"
    assert python_0113.exists(), (
        f"no TileLang 0.1.13 toolchain: run scripts/make-toolchain-venv 0.1.13 "
        f"{TOOLCHAIN_0113} (make toolchains)"
    )
    monkeypatch.setenv("TILEMATRIX_SERVER_KEY_FILE", str(tmp_path / "server.key"))
    monkeypatch.setenv(host.HARNESS_ENV, "runners.harness.sandbox:run_job")
    # Absolute but not resolved: the venv's python is a symlink to the base one.
    interpreters = [os.path.abspath(python_0113), sys.executable]
    key = Ed25519PrivateKey.generate()
    registered = services.runner_register(
        token=services.token_create(expires=timedelta(hours=1)),
        name="cpu-ab",
        public_key=signing.public_key_hex(key),
        inventory={
            "devices": [host.cpu_device()],
            "toolchains": [host.toolchain_probe(i) for i in interpreters],
            "nvcc": False,
            "host": {"hostname": "ab-test"},
        },
    )
    # Online, so the planner routes validate jobs for `c` to it.
    services.runner_heartbeat(
        envelope=services.heartbeat_envelope(
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
    config = host.HostConfig(
        directory=directory,
        name=registered.name,
        server="http://testserver",
        server_public_key=signing.server_public_key(),
        queues=registered.queues(),
        toolchains=hosted,
    )

    def deliver(envelope):
        result, _ = services.result_ingest(envelope=envelope)
        # What the control worker's ingest hook does once a result is stored.
        proposals_reevaluate_for_results(results=[result])

    monkeypatch.setattr(host, "result_send", deliver)
    return config


def execute_open_jobs(config, sweeps) -> int:
    jobs = list(
        ValidationJob.objects.open()
        .filter(sweep__in=sweeps)
        .select_related("revision__operator", "shape", "device_type", "toolchain")
    )
    for job in jobs:
        host.job_execute(
            envelope=services.job_envelope(job), config=config, timeout_s=180
        )
    return len(jobs)


def test_softmax_gates_the_upgrade_both_ways(runner, people):
    owner, (first, second, _) = people
    operator_sync_library()
    cpu = DeviceType.objects.get(backend="c")
    for name, dims in SERVED:
        Shape.objects.create(
            operator=Operator.objects.get(name=name),
            dims=dims,
            dtype="float32",
            served=True,
            weight=1.0,
        )
    hosted = Toolchain.objects.filter(
        pk__in=[t["id"] for t in runner.toolchains.values()]
    )
    old, new = (hosted.get(tilelang_version=v) for v in ("0.1.13", "0.1.15"))

    started = time.monotonic()
    forward = proposal_open(baseline=old, candidate=new, device_types=[cpu], by=owner)
    assert forward.state == UpgradeProposal.State.COLLECTING
    assert execute_open_jobs(runner, forward.sweeps.all()) == 2 * len(SERVED)
    # Cells green on both sides are timed twice more, so the perf ratio
    # carries a noise band measured on this machine, not assumed.
    green = [
        (r.shape_id, r.device_type_id, t.pk)
        for r in proposal_diff(proposal=forward).rows
        if r.change == "still_green"
        for t in (old, new)
    ]
    for _ in range(REPEATS - 1):
        execute_open_jobs(runner, [services.sweep_plan(cells=green, created_by=owner)])
    elapsed = time.monotonic() - started
    forward.refresh_from_db()

    rows = {(r.operator, r.dims_key): r for r in proposal_diff(proposal=forward).rows}
    jobs = ValidationJob.objects.filter(toolchain__in=[old, new]).count()
    print(f"\nA/B of {jobs} jobs took {elapsed:.1f}s")
    for toolchain in (old, new):
        samples = Result.objects.filter(
            toolchain=toolchain, shape__operator__name="elementwise_add"
        ).values_list("kernel_ms", flat=True)
        print(f"  elementwise_add kernel_ms on {toolchain}: {sorted(samples)}")
    for row in rows.values():
        print(
            f"  {row.label}: {row.baseline_status} -> {row.candidate_status} "
            f"({row.change_label}) ratio={row.ratio} band={row.band}"
        )
    softmax = [r for (op, _), r in rows.items() if op == "softmax"]
    assert [(r.baseline_status, r.candidate_status) for r in softmax] == [
        ("compile_error", "pass")
    ] * 2
    assert all(r.change == "red_to_green" for r in softmax)
    assert rows["elementwise_add", "M=64,N=256"].candidate_status == "pass"

    assert forward.state == UpgradeProposal.State.READY, forward.blocking_reasons
    proposal_approve(proposal=forward, by=first, comment="softmax now compiles on c")
    proposal_approve(proposal=forward, by=second, comment="agreed")
    forward.refresh_from_db()
    assert forward.state == UpgradeProposal.State.APPROVED

    # The reverse needs no new jobs: both toolchains' results are fresh.
    reverse = proposal_open(baseline=new, candidate=old, device_types=[cpu], by=owner)
    assert not reverse.sweeps.exists()
    assert reverse.state == UpgradeProposal.State.BLOCKED
    reasons = policy_evaluate(proposal=reverse)
    print("reverse blocked by:", *reasons, sep="\n  ")
    regressions = [r for r in reasons if "went from pass to" in r]
    assert regressions == [
        f"served cell softmax[M=64,N=256] float32 on {cpu} went from pass to "
        "compile_error",
        f"served cell softmax[M=7,N=33] float32 on {cpu} went from pass to "
        "compile_error",
    ], reasons
