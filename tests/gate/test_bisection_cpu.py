"""Bisection across three real TileLang releases on the CPU ``c`` backend:
0.1.13 and 0.1.14 cannot compile the library's float32 softmax (no lowering
for ``tl.infinity``), 0.1.15 validates it. The first good release is 0.1.15.

The production path throughout: a runner registered with one interpreter
per release, each step planned by the sweep planner, signed by the server,
executed by ``runners.host.jobs_execute`` in the sandboxed harness with the
release's interpreter, signed by the runner and stored by
``results_ingest``, whose ``results_stored`` receiver plans the next step.
Only the broker hop is replaced by a direct call."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from matrix.bisection.services import bisection_start
from matrix.fleet import services
from matrix.models import (
    AuditEvent,
    Bisection,
    DeviceType,
    Operator,
    Shape,
    Toolchain,
    ValidationJob,
)
from matrix.services import operator_sync_library
from runners import host
from tests.gate.conftest import cpu_host

REPO = Path(__file__).resolve().parents[2]
TOOLCHAINS = REPO / "var" / "toolchains"


def interpreter(version: str) -> str:
    python = TOOLCHAINS / f"tilelang-{version}" / "bin" / "python"
    if not python.exists():
        pytest.fail(
            f"no TileLang {version} toolchain: run scripts/make-toolchain-venv "
            f"{version} {python.parent.parent} (make toolchains)"
        )
    # Absolute but not resolved: the venv's python is a symlink to the base one.
    return os.path.abspath(python)


def cpu_runner(tmp_path, monkeypatch, versions: list[str]) -> host.HostConfig:
    """A CPU runner hosting ``versions`` (0.1.15 is this venv's), registered,
    approved and online; its results go straight to ingest."""
    monkeypatch.setenv("TILEMATRIX_SERVER_KEY_FILE", str(tmp_path / "server.key"))
    monkeypatch.setenv(host.HARNESS_ENV, host.DEFAULT_HARNESS)
    interpreters = [
        sys.executable if v == "0.1.15" else interpreter(v) for v in versions
    ]
    config = cpu_host(tmp_path, name="cpu-bisect", interpreters=interpreters)

    def deliver(envelopes):
        # Ingest in place, its receivers included (the bisection's next step
        # is planned here); the test's transaction never commits, so nothing
        # is published to a broker.
        outcomes = services.results_ingest(envelopes=envelopes)
        assert [o.status for o in outcomes] == ["stored"] * len(envelopes), outcomes

    monkeypatch.setattr(host, "results_send", deliver)
    return config


def execute(config, jobs) -> list[str]:
    """Run jobs as the runner's worker would run the planner's messages;
    the TileLang versions they ran on."""
    jobs = list(
        jobs.select_related("revision__operator", "shape", "device_type", "toolchain")
    )
    for _, chunk in services.job_chunks(jobs):
        host.jobs_execute(
            envelope=services.jobs_envelope(chunk), config=config, timeout_s=180
        )
    return [job.toolchain.tilelang_version for job in jobs]


def bisect_to_the_end(config, bisection) -> list[str]:
    """Run each step's job until the bisection concludes; the releases the
    jobs ran on, in order."""
    ran = []
    for _ in range(10):
        bisection.refresh_from_db()
        if not bisection.is_running:
            return ran
        waiting = ValidationJob.objects.open().filter(
            bisection_steps__bisection=bisection
        )
        assert waiting.count() == 1, "a running bisection waits on one job"
        ran += execute(config, waiting)
    raise AssertionError(f"still running after 10 steps: {bisection.conclusion}")


@pytest.fixture
def softmax_cell(db, server_http):
    """The served float32 softmax cell; the runner's claims are answered by
    this test's server in process (``server_http``)."""
    operator_sync_library()
    return Shape.objects.create(
        operator=Operator.objects.get(name="softmax"),
        dims={"M": 64, "N": 256},
        dtype="float32",
        served=True,
        weight=1.0,
    )


def releases() -> dict[str, Toolchain]:
    return {t.tilelang_version: t for t in Toolchain.objects.all()}


def test_it_names_0115_the_first_good_release_reusing_the_ab_results(
    tmp_path, monkeypatch, softmax_cell, admin_user
):
    config = cpu_runner(tmp_path, monkeypatch, ["0.1.13", "0.1.14", "0.1.15"])
    cpu = DeviceType.objects.get(backend="c")
    tc = releases()
    # The upgrade's A/B ran first: both ends have their results.
    ab = services.sweep_plan(
        cells=[(softmax_cell, cpu, tc["0.1.13"]), (softmax_cell, cpu, tc["0.1.15"])]
    )
    assert sorted(execute(config, ab.jobs.all())) == ["0.1.13", "0.1.15"]

    bisection = bisection_start(
        shape=softmax_cell,
        device_type=cpu,
        last_good=tc["0.1.15"],
        first_bad=tc["0.1.13"],
        by=admin_user,
    )
    assert [r["version"] for r in bisection.ladder] == ["0.1.13", "0.1.14", "0.1.15"]
    # Only the release between needs a job: the ends' results are reused.
    assert bisect_to_the_end(config, bisection) == ["0.1.14"]
    assert {
        version: ValidationJob.objects.filter(toolchain=tc[version]).count()
        for version in tc
    } == {"0.1.13": 1, "0.1.14": 1, "0.1.15": 1}

    bisection.refresh_from_db()
    assert bisection.state == Bisection.State.FOUND
    assert bisection.direction == Bisection.Direction.FIX
    assert bisection.release == tc["0.1.15"]
    steps = list(bisection.steps.order_by("number"))
    assert [
        (s.toolchain.tilelang_version, s.status, s.verdict, s.reused) for s in steps
    ] == [
        ("0.1.13", "compile_error", "bad", True),
        ("0.1.15", "pass", "good", True),
        ("0.1.14", "compile_error", "bad", False),
    ]
    assert bisection.conclusion.startswith(
        f"First good release: TileLang 0.1.15 ({tc['0.1.15'].name}). "
        f"{softmax_cell} on {cpu} gives pass"
    )
    assert "compile_error" in bisection.conclusion
    assert "the last bad release" in bisection.conclusion
    assert "1 by a job, 2 by results already stored" in bisection.conclusion
    assert bisection.repro["job"] == {
        "operator": "softmax",
        "shape": {"M": 64, "N": 256},
        "dtype": "float32",
        "target": {"kind": "c"},
        "stage": "validate",
        "seed": 0,
    }
    first, second = bisection.repro["commands"]
    assert first.startswith(
        f"python -m runners.harness job.json --interpreter {sys.executable}"
    )
    assert first.endswith("# TileLang 0.1.15: pass (on runner cpu-bisect)")
    assert interpreter("0.1.14") in second and "compile_error" in second
    assert AuditEvent.objects.filter(
        verb="bisection.conclude", object_id=str(bisection.pk)
    ).exists()

    # Bisect pressed again: every rung has its answer stored, so it concludes
    # at once and plans nothing.
    again = bisection_start(
        shape=softmax_cell,
        device_type=cpu,
        last_good=tc["0.1.15"],
        first_bad=tc["0.1.13"],
    )
    assert again.pk != bisection.pk
    assert again.state == Bisection.State.FOUND
    assert again.release == tc["0.1.15"]
    assert ValidationJob.objects.count() == 3
    assert all(step.reused for step in again.steps.all())


def test_it_bisects_from_nothing_and_says_which_runner_needs_0114(
    tmp_path, monkeypatch, softmax_cell
):
    # The runner hosts the two ends only: 0.1.14 is a published release no
    # runner reported, so it has no toolchain row at all.
    config = cpu_runner(tmp_path, monkeypatch, ["0.1.13", "0.1.15"])
    cpu = DeviceType.objects.get(backend="c")
    tc = releases()
    assert "0.1.14" not in tc
    bisection = bisection_start(
        shape=softmax_cell,
        device_type=cpu,
        last_good=tc["0.1.15"],
        first_bad=tc["0.1.13"],
    )
    # No result anywhere: the ends are tested first, oldest first.
    assert bisect_to_the_end(config, bisection) == ["0.1.13", "0.1.15"]
    bisection.refresh_from_db()
    assert bisection.state == Bisection.State.NARROWED
    assert bisection.release is None
    assert bisection.conclusion.startswith(
        f"The change lies after TileLang 0.1.13 ({tc['0.1.13'].name}), which "
        "gives compile_error (job "
    )
    assert ". Not tested: TileLang 0.1.14. 2 rungs answered" in bisection.conclusion
    assert bisection.needs == [
        f"TileLang 0.1.14 is not hosted by any online runner with {cpu}: runner "
        "cpu-bisect would need it. Build it with `scripts/make-toolchain-venv "
        "0.1.14 /opt/toolchains/tilelang-0.1.14` (`make toolchains` puts it in "
        "var/toolchains/tilelang-0.1.14) and register that host with "
        "`--python /opt/toolchains/tilelang-0.1.14/bin/python`."
    ]
    # The range's two ends, ready to run by hand.
    assert [c.rsplit("# ", 1)[1] for c in bisection.repro["commands"]] == [
        "TileLang 0.1.15: pass (on runner cpu-bisect)",
        "TileLang 0.1.13: compile_error (on runner cpu-bisect)",
    ]
