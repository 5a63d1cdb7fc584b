"""Bisection in a deployment of real processes: the web server, the control
worker and a CPU runner worker (`python -m runners work`) hosting TileLang
0.1.13, 0.1.14 and 0.1.15, with the real sandboxed harness. Each step's job
goes through the broker to the runner; its result comes back through
ingest in the control worker, whose receiver plans the next step."""

from __future__ import annotations

import os
import sys

import pytest

from tests.gate.test_bisection_cpu import interpreter

from .cluster import RUNNER_ENV, Cluster

START = """
from matrix.bisection.services import bisection_start
from matrix.models import DeviceType, Operator, Shape, Toolchain
softmax = Operator.objects.get(name="softmax")
shape, _ = Shape.objects.get_or_create(
    operator=softmax, dims_key="M=64,N=256", dtype="float32",
    defaults={"dims": {"M": 64, "N": 256}, "served": True, "weight": 1.0},
)
hosted = Toolchain.objects.filter(runners__name="cpu-bisect")
bisection = bisection_start(
    shape=shape,
    device_type=DeviceType.objects.get(backend="c"),
    last_good=hosted.get(tilelang_version="0.1.15"),
    first_bad=hosted.get(tilelang_version="0.1.13"),
)
print(bisection.pk)
"""


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster()
    try:
        cluster.start_web()
        cluster.start_control()
        yield cluster
    finally:
        cluster.close()


def test_a_runner_worker_runs_each_step_and_the_first_good_release_is_named(
    cluster,
):
    token = cluster.manage("runner", "token", "create", "--expires", "10m")
    pythons = [
        interpreter("0.1.13"),
        interpreter("0.1.14"),
        os.path.abspath(sys.executable),
    ]
    cluster.manage(
        "runner",
        "register",
        "--server",
        cluster.server,
        "--token",
        token.stdout.strip().splitlines()[-1],
        "--name",
        "cpu-bisect",
        "--key-dir",
        str(cluster.key_dir("cpu-bisect")),
        *(arg for python in pythons for arg in ("--python", python)),
        env=RUNNER_ENV,
    )
    cluster.manage("runner", "approve", "cpu-bisect")
    cluster.start_runner("cpu-bisect", TILEMATRIX_HARNESS="runners.harness.sandbox")
    cluster.wait(
        lambda: cluster.runner_state("cpu-bisect") == "online",
        timeout=90,
        what="cpu-bisect online",
    )

    started = cluster.manage("shell", "-c", START).stdout.strip().splitlines()[-1]
    bisection = int(started)
    cluster.wait(
        lambda: (
            cluster.sql(
                "SELECT state FROM matrix_bisection WHERE id = ?", (bisection,)
            )[0][0]
            != "running"
        ),
        timeout=300,
        what=f"bisection {bisection} to end",
    )
    ((state, conclusion, release),) = cluster.sql(
        "SELECT b.state, b.conclusion, t.tilelang_version FROM matrix_bisection b "
        "LEFT JOIN matrix_toolchain t ON t.id = b.release_id WHERE b.id = ?",
        (bisection,),
    )
    assert (state, release) == ("found", "0.1.15"), conclusion
    assert conclusion.startswith("First good release: TileLang 0.1.15 ")
    steps = cluster.sql(
        "SELECT t.tilelang_version, s.status, s.reused, j.state FROM "
        "matrix_bisectionstep s JOIN matrix_toolchain t ON t.id = s.toolchain_id "
        "JOIN matrix_validationjob j ON j.id = s.job_id "
        "WHERE s.bisection_id = ? ORDER BY s.number",
        (bisection,),
    )
    # Nothing was stored before: the ends first, then the release between,
    # each run by the runner worker.
    assert [(v, status, bool(reused), job) for v, status, reused, job in steps] == [
        ("0.1.13", "compile_error", False, "done"),
        ("0.1.15", "pass", False, "done"),
        ("0.1.14", "compile_error", False, "done"),
    ]
