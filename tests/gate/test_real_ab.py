"""The real A/B on this machine: TileLang 0.1.13 (its own venv) as baseline,
0.1.15 (this venv) as candidate, target ``c``.

Everything runs the production path: a runner registered with both
toolchains, the proposal planning jobs through the sweep planner, jobs signed
by the server in messages, executed by ``runners.host.jobs_execute`` in the
sandboxed harness with each toolchain's interpreter, results signed by the
runner and stored by ``matrix.fleet.services.results_ingest``. Only the broker
hops are replaced by direct calls, and the runner's HTTP requests (claims)
are answered in process."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from matrix.fleet import services
from matrix.gate.manifest import manifest_for
from matrix.gate.services import (
    exception_grant,
    exception_sign_off,
    policy_evaluate,
    policy_save,
    proposal_approve,
    proposal_diff,
    proposal_open,
)
from matrix.models import (
    DeviceType,
    Operator,
    Result,
    Shape,
    Toolchain,
    ValidationJob,
)
from matrix.models.gate import UpgradeProposal
from matrix.services import operator_sync_library
from runners import host
from tests.gate.conftest import cpu_host

REPO = Path(__file__).resolve().parents[2]
TOOLCHAIN_0113 = Path(
    os.environ.get("TM_TOOLCHAIN_0113", REPO / "var" / "toolchains" / "tilelang-0.1.13")
)
# A handful of served CPU cells: softmax is the known difference (it does
# not compile on c with 0.1.13); elementwise_add passes on both, slower
# than PyTorch on this CPU.
SERVED = [
    ("softmax", {"M": 64, "N": 256}),
    ("softmax", {"M": 7, "N": 33}),
    ("elementwise_add", {"M": 64, "N": 256}),
]
REPEATS = 3


@pytest.fixture
def runner(db, tmp_path, monkeypatch, server_http, control_worker):
    python_0113 = TOOLCHAIN_0113 / "bin" / "python"
    assert python_0113.exists(), (
        f"no TileLang 0.1.13 toolchain: run scripts/make-toolchain-venv 0.1.13 "
        f"{TOOLCHAIN_0113} (make toolchains)"
    )
    monkeypatch.setenv("TILEMATRIX_SERVER_KEY_FILE", str(tmp_path / "server.key"))
    monkeypatch.setenv(host.HARNESS_ENV, host.DEFAULT_HARNESS)
    # Absolute but not resolved: the venv's python is a symlink to the base one.
    interpreters = [os.path.abspath(python_0113), sys.executable]
    config = cpu_host(tmp_path, name="cpu-ab", interpreters=interpreters)

    def deliver(envelopes):
        # Ingest marks the proposals these results touch; once it commits,
        # the control worker re-evaluates them.
        outcomes = control_worker(services.results_ingest, envelopes=envelopes)
        assert [o.status for o in outcomes] == ["stored"] * len(envelopes), outcomes

    monkeypatch.setattr(host, "results_send", deliver)
    return config


def execute_open_jobs(config, sweeps) -> int:
    """Deliver the sweeps' jobs as the broker would: one signed message per
    chunk of a queue, each run as one harness batch."""
    jobs = list(
        ValidationJob.objects.open()
        .filter(sweep__in=sweeps)
        .select_related("revision__operator", "shape", "device_type", "toolchain")
    )
    for _, chunk in services.job_chunks(jobs):
        host.jobs_execute(
            envelope=services.jobs_envelope(chunk), config=config, timeout_s=180
        )
    return len(jobs)


def test_softmax_gates_the_upgrade_both_ways(runner, people, admin_user):
    owner, (first, second, owner_of_c) = people
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
            f"({row.change_label}) ratio={row.ratio} band={row.band} "
            f"speed={row.speed} speed_band={row.speed_band}"
        )
    softmax = [r for (op, _), r in rows.items() if op == "softmax"]
    assert [(r.baseline_status, r.candidate_status) for r in softmax] == [
        ("compile_error", "pass")
    ] * 2
    assert all(r.change == "red_to_green" for r in softmax)
    assert rows["elementwise_add", "M=64,N=256"].candidate_status == "pass"

    # Kernel timings of the c column on this shared 2-core host swing by up
    # to 2x between runs: no production signal. The policy's answer is an
    # exception for the c backend's performance, signed by its owner; it
    # leaves every correctness rule standing.
    policy_save(by=admin_user, backend_owners={"c": [owner_of_c.username]})
    waive_cpu_timings(forward, granted_by=first, signed_by=owner_of_c)
    forward.refresh_from_db()
    assert forward.state == UpgradeProposal.State.READY, forward.blocking_reasons
    proposal_approve(proposal=forward, by=first, comment="softmax now compiles on c")
    proposal_approve(proposal=forward, by=second, comment="agreed")
    forward.refresh_from_db()
    assert forward.state == UpgradeProposal.State.APPROVED
    manifest = manifest_for(toolchain=new)
    entries = {
        (e["operator"], e["shape_rule"]["dims"]["M"]): e for e in manifest["entries"]
    }
    # Right and fast: elementwise_add passes on c, but its kernel takes about
    # ten times torch's `a + b` on this CPU, so production keeps the
    # reference and says how much slower; every entry names its speed.
    add = entries["elementwise_add", 64]
    assert add["choice"] == "reference"
    assert re.fullmatch(
        rf"pass on {re.escape(new.name)}, but 0\.\d+× of the reference",
        add["reason"],
    ), add["reason"]
    softmax_sha = (
        Operator.objects.get(name="softmax").current_revision("c").source_sha256
    )
    for m in (64, 7):
        assert entries["softmax", m]["kernel_sha256"] == softmax_sha
        assert entries["softmax", m]["reason"].endswith("× of the reference")
    production_dispatch_on_this_host(manifest, cpu, expect="reference")
    # An admin who serves whatever is correct on this CPU column says so in
    # the policy; the approved manifest follows.
    policy_save(by=admin_user, speed_budget=1000.0)
    manifest = manifest_for(toolchain=new)
    assert {
        (e["operator"], e["choice"])
        for e in manifest["entries"]
        if e["operator"] != "softmax" or e["shape_rule"]["dims"]["M"] == 64
    } == {("elementwise_add", "tilelang"), ("softmax", "tilelang")}
    production_dispatch_on_this_host(manifest, cpu, expect="tilelang")

    # The reverse needs no new jobs: both toolchains' results are fresh.
    reverse = proposal_open(baseline=new, candidate=old, device_types=[cpu], by=owner)
    assert not reverse.sweeps.exists()
    waive_cpu_timings(reverse, granted_by=first, signed_by=owner_of_c)
    reverse.refresh_from_db()
    assert reverse.state == UpgradeProposal.State.BLOCKED
    reasons = policy_evaluate(proposal=reverse)
    print("reverse blocked by:", *reasons, sep="\n  ")
    assert reasons == [
        f"served cell softmax[M=64,N=256] float32 on {cpu} went from pass to "
        "compile_error",
        f"served cell softmax[M=7,N=33] float32 on {cpu} went from pass to "
        "compile_error",
        "needs 2 approvals from the reviewer group, has 0",
    ]
    with pytest.raises(ValidationError, match="cannot approve while blocked"):
        proposal_approve(proposal=reverse, by=first, comment="roll back")


def production_dispatch_on_this_host(manifest, cpu, *, expect: str):
    """What production on this host does with the approved manifest: its own
    toolchain's fingerprint and the library's revision select what the
    manifest chose for the validated elementwise_add shape (``expect``), and
    the TileLang kernel's output is the sum; a shape nobody validated takes
    the reference."""
    import tilelang
    import torch

    from runners.dispatch import (
        Dispatcher,
        host_toolchain_fingerprint,
        library_revisions,
    )
    from runners.kernels import OPERATORS

    dispatcher = Dispatcher(
        manifest,
        device_type=str(cpu),
        toolchain_fingerprint=host_toolchain_fingerprint(),
        kernel_revisions=library_revisions("elementwise_add"),
    )
    validated = {"M": 64, "N": 256}
    target = {"kind": "c"}
    kernel = tilelang.compile(
        OPERATORS["elementwise_add"].program(validated, "float32", target),
        target=target,
    )
    ran = []

    def with_tilelang(a, b):
        ran.append("tilelang")
        out = torch.full_like(a, float("nan"))
        kernel(a, b, out)
        return out

    def with_reference(a, b):
        ran.append("reference")
        return a + b

    generator = torch.Generator().manual_seed(7)
    a, b = (torch.randn(64, 256, generator=generator) for _ in range(2))
    out = dispatcher.call(
        "elementwise_add",
        validated,
        "float32",
        tilelang=with_tilelang,
        reference=with_reference,
        args=(a, b),
    )
    torch.testing.assert_close(out, a + b)
    unvalidated = torch.randn(32, 256)
    dispatcher.call(
        "elementwise_add",
        {"M": 32, "N": 256},
        "float32",
        tilelang=with_tilelang,
        reference=with_reference,
        args=(unvalidated, unvalidated),
    )
    assert ran == [expect, "reference"]


def waive_cpu_timings(proposal, *, granted_by, signed_by):
    exception = exception_grant(
        proposal=proposal,
        backend="c",
        reason="CPU timings on a shared CI host are noise, not a regression",
        by=granted_by,
    )
    exception_sign_off(exception=exception, by=signed_by)
