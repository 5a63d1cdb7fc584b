"""A deployment in subprocesses (gunicorn behind nginx, control worker with
beat, runner workers) against the configured database and broker kinds:
what a lab admin and a user do, and what must survive a crash."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
import zlib

import pytest

from .cluster import RUNNER_ENV, Cluster, wait_for

CPU_SMOKE = "Shape.objects.filter(source_profile='cpu-smoke')"


def smoke_cells(device_filter: str, limit: int | None = None) -> str:
    shapes = CPU_SMOKE + (f"[:{limit}]" if limit else "")
    return (
        f"[(s, d, Toolchain.objects.get()) for s in {shapes} "
        f"for d in DeviceType.objects.filter({device_filter})]"
    )


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster()
    try:
        # As docs/deploy.md deploys it: gunicorn behind nginx. Runners
        # register, claim, recover and ask for their outbox through it.
        cluster.start_web(proxied=True)
        cluster.start_control()
        yield cluster
    finally:
        cluster.close()


def online(cluster, runner):
    cluster.wait(
        lambda: cluster.runner_state(runner) == "online",
        timeout=90,
        what=f"{runner} online",
    )


@pytest.fixture
def stop_runners(cluster):
    """Runners a test starts are stopped after it, pass or fail: the next
    test must not find them consuming its queues."""
    before = set(cluster.procs)
    yield
    for name in set(cluster.procs) - before - {"web", "control"}:
        cluster.kill(name)


def test_register_sweep_and_real_results(cluster, stop_runners):
    out = cluster.register("cpu-real")
    assert "registered runner cpu-real" in out
    assert (cluster.key_dir("cpu-real") / "runner.key").stat().st_mode & 0o777 == 0o600
    cluster.start_runner("cpu-real", TILEMATRIX_HARNESS="runners.harness.sandbox")
    online(cluster, "cpu-real")
    sweep = cluster.plan(smoke_cells("backend__in=['c', 'cuda']", limit=2))
    cluster.wait_finished(sweep, timeout=300)
    rows = cluster.sql(
        "SELECT d.backend, j.stage, r.status, e.text FROM matrix_result r "
        "LEFT JOIN matrix_blob e ON e.id = r.error_id "
        "JOIN matrix_validationjob j ON j.id = r.job_id "
        "JOIN matrix_devicetype d ON d.id = r.device_type_id WHERE j.sweep_id = ?",
        (sweep,),
    )
    assert len(rows) == 4
    outcomes = {(b, stage, status) for b, stage, status, _ in rows}
    # cuda cells are built where this host has nvcc, lowered where it has not.
    assert outcomes in (
        {("c", "validate", "pass"), ("cuda", "lower", "lowered")},
        {("c", "validate", "pass"), ("cuda", "build", "built")},
    ), rows
    cells = cluster.sql(
        "SELECT COUNT(*) FROM matrix_cell WHERE status IN ('pass', 'lowered', 'built')"
    )
    assert cells[0][0] == 4
    # The runner worker ran with a database URL that cannot connect: it
    # claimed, recovered and read its queues over HTTP only.
    assert cluster.procs["runner:cpu-real"].poll() is None
    assert "OperationalError" not in cluster.log("runner:cpu-real")
    queues = cluster.manage(
        "runner",
        "queues",
        "--key-dir",
        str(cluster.key_dir("cpu-real")),
        env=RUNNER_ENV,
    )
    assert queues.stdout.startswith("runner.cpu-real,")


@pytest.fixture(scope="module")
def cpu_b(cluster):
    """A CPU runner with the edge harness, shared by the tests below."""
    cluster.register("cpu-b")
    cluster.start_runner("cpu-b", TILEMATRIX_EDGE_HARNESS_DELAY_S="0.3")
    online(cluster, "cpu-b")
    return "cpu-b"


def test_kill_9_of_the_worker_mid_sweep_loses_no_job(cluster, cpu_b):
    sweep = cluster.plan(smoke_cells("pk__gt=0"))
    total = len(cluster.jobs(sweep))
    assert total >= 20
    wait_for(
        lambda: sum(s == "done" for _, s, _, _ in cluster.jobs(sweep)) >= 5,
        timeout=120,
        what="five jobs done",
    )
    cluster.kill("runner:cpu-b")
    assert not cluster.finished(sweep)
    cluster.start_runner("cpu-b", TILEMATRIX_EDGE_HARNESS_DELAY_S="0.05")
    cluster.wait_finished(sweep)
    jobs = cluster.jobs(sweep)
    assert {state for _, state, _, _ in jobs} == {"done"}, jobs
    assert set(cluster.results_per_job(sweep).values()) == {1}


def test_a_malformed_message_is_dropped_and_the_worker_carries_on(cluster, cpu_b):
    from celery import Celery

    # The sender's own connection: a Celery app takes CELERY_BROKER_URL from
    # the environment over anything it is given, and that is the suite's.
    # Not the process's current app: shared tasks resolve through it, and a
    # later test's eager tasks in this process went to a broker instead.
    sender = Celery(set_as_current=False)
    with cluster.connection() as conn:
        queue = conn.SimpleQueue("runner.cpu-b")
        queue.put("not a task at all", serializer="json")
        queue.close()
        producer = conn.Producer()
        sender.send_task(
            "runners.execute_job",
            args=[{"payload": "garbage"}],
            queue="runner.cpu-b",
            producer=producer,
        )
        sender.send_task(
            "runners.no_such_task", args=[], queue="runner.cpu-b", producer=producer
        )
        # A zlib bomb for the control worker: 300 MB of zeros in about 300 KB.
        bomb = zlib.compress(b"[" + b"0," * (150 * 2**20) + b"0]", 9)
        producer.publish(
            bomb,
            routing_key="control",
            exchange="",
            content_type="application/json",
            content_encoding="utf-8",
            headers={
                "task": "runners.ingest_result",
                "id": "bomb",
                "compression": "application/x-gzip",
            },
        )
    sweep = cluster.plan(smoke_cells("backend='c'", limit=1))
    cluster.wait_finished(sweep, timeout=120)
    # The runner queue and the validation queue are consumed side by side:
    # the good job may finish before the bad messages are read.
    cluster.wait(
        lambda: (
            "dropped job message" in cluster.log("runner:cpu-b")
            and "no_such_task" in cluster.log("runner:cpu-b")
        ),
        timeout=30,
        what="the bad messages dropped",
    )
    assert cluster.procs["runner:cpu-b"].poll() is None
    # The bomb was refused before it was inflated: the control worker stored
    # the good result, stayed small, and said so in one short line.
    cluster.wait(
        lambda: "over 16777216 bytes: refused" in cluster.log("control"),
        timeout=30,
        what="the bomb refused",
    )
    control = cluster.procs["control"]
    assert control.poll() is None
    assert peak_rss_mb(control.pid) < 500
    assert max(map(len, cluster.log("control").splitlines())) < 10_000


def test_results_are_stored_after_the_database_cut_the_workers_connections(
    cluster, cpu_b
):
    """The control worker keeps its database connection from task to task,
    checked before each as before each request: one the database ended (a
    restart, a failover) is opened again before a task uses it, so no
    heartbeat or result fails and waits for a retry."""
    if not cluster.pg_admin:
        pytest.skip("cutting connections needs PostgreSQL (DATABASE_URL)")
    first = cluster.plan(smoke_cells("backend='c'", limit=1))
    cluster.wait_finished(first, timeout=120)
    before = len(cluster.log("control"))
    cut = cluster.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    assert cut, "no connection to cut"
    sweep = cluster.plan(smoke_cells("backend='c'", limit=2))
    cluster.wait_finished(sweep, timeout=120)
    assert set(cluster.results_per_job(sweep).values()) == {1}
    after = cluster.log("control")[before:]
    assert "OperationalError" not in after and "retried" not in after, after


def test_a_revoked_runner_stops_and_leaves_its_work_to_the_others(
    cluster, cpu_b, stop_runners
):
    cluster.manage("runner", "revoke", "cpu-b")
    cluster.wait(
        lambda: "refused heartbeat from 'cpu-b'" in cluster.log("control"),
        timeout=60,
        what="a refused heartbeat",
    )
    assert cluster.runner_state("cpu-b") == "offline"
    rows = cluster.sql("SELECT revoked_at FROM runners_runner WHERE name = 'cpu-b'")
    assert rows[0][0] is not None

    # Its worker still reads the queues it shares with other runners: the
    # first job message it takes is refused, goes back, and the worker stops.
    sweep = cluster.plan(smoke_cells("backend='c'", limit=1))
    cluster.wait(
        lambda: cluster.procs["runner:cpu-b"].poll() is not None,
        timeout=120,
        what="the revoked runner's worker to stop",
    )
    assert "runner cpu-b is refused" in cluster.log("runner:cpu-b")
    assert not cluster.finished(sweep)
    # Another runner on the same queue runs that very job.
    cluster.register("cpu-c")
    cluster.start_runner("cpu-c", TILEMATRIX_EDGE_HARNESS_DELAY_S="0.05")
    cluster.wait_finished(sweep, timeout=180)
    assert {state for _, state, _, _ in cluster.jobs(sweep)} == {"done"}
    # Started again, the revoked runner says why it cannot work, at once.
    again = cluster.manage(
        "runner",
        "work",
        "--key-dir",
        str(cluster.key_dir("cpu-b")),
        env=RUNNER_ENV,
        check=False,
        timeout=60,
    )
    assert again.returncode != 0
    assert "revoked" in again.stderr


def test_a_runner_in_maintenance_leaves_its_work_to_the_others_then_resumes(
    cluster, stop_runners
):
    """Its worker, left running beside another runner on the same queue,
    gives back the messages it takes and stops reading its queues: the
    other runner runs those very jobs (dropped, they would wait until
    maintenance ends). Once maintenance ends it reads them again, without a
    restart."""
    # One message at a time per worker (prefetch 1): while cpu-n's slow
    # harness runs one, the sweep's other message can only go to cpu-m.
    for name, delay_s in (("cpu-m", "0.05"), ("cpu-n", "1.0")):
        cluster.register(name)
        cluster.start_runner(name, TILEMATRIX_EDGE_HARNESS_DELAY_S=delay_s)
        online(cluster, name)
    said = cluster.manage("runner", "maintenance", "cpu-m", "on").stdout
    assert "runner cpu-m in maintenance" in said
    sweep = cluster.plan(smoke_cells("backend='c'"))
    cluster.wait(
        lambda: "runner cpu-m is in maintenance" in cluster.log("runner:cpu-m"),
        timeout=120,
        what="the runner in maintenance to give a message back",
    )
    cluster.wait_finished(sweep, timeout=180)
    (cpu_n,) = cluster.sql("SELECT id FROM runners_runner WHERE name = 'cpu-n'")[0]
    assert {(state, runner) for _, state, _, runner in cluster.jobs(sweep)} == {
        ("done", cpu_n)
    }
    assert cluster.procs["runner:cpu-m"].poll() is None
    assert "dropped job message" not in cluster.log("runner:cpu-m")

    cluster.kill("runner:cpu-n")
    said = cluster.manage("runner", "maintenance", "cpu-m", "off").stdout
    assert "runner cpu-m active" in said
    cluster.wait(
        lambda: "runner cpu-m is active again" in cluster.log("runner:cpu-m"),
        timeout=60,
        what="the worker to read its queues again",
    )
    sweep = cluster.plan(smoke_cells("backend='c'", limit=1))
    cluster.wait_finished(sweep, timeout=180)
    (cpu_m,) = cluster.sql("SELECT id FROM runners_runner WHERE name = 'cpu-m'")[0]
    assert {(state, runner) for _, state, _, runner in cluster.jobs(sweep)} == {
        ("done", cpu_m)
    }


def ingest_under_way(cluster) -> bool:
    """Whether the control worker's log shows an ingest received and not
    yet finished."""
    log = cluster.log("control")
    received = len(re.findall(r"result message \S+ received", log))
    ingested = sum(map(int, re.findall(r"ingested (\d+) result messages", log)))
    return received > ingested


def signal_all(pids, signum) -> None:
    """``signum`` to each of ``pids`` still alive: a pool child can exit
    (its task count reached) between being listed and being signalled."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def ingest_held(cluster) -> None:
    """Stop the control worker's pool (and beat) until its main process has
    handed it an ingest: that message is then in the worker's hands only,
    received and not stored. Tried again while heartbeats take the pool's
    places first."""
    for _ in range(20):
        stopped = cluster.children("control")
        signal_all(stopped, signal.SIGSTOP)
        try:
            return wait_for(
                lambda: ingest_under_way(cluster), timeout=4, what="an ingest"
            )
        except AssertionError:
            signal_all(stopped, signal.SIGCONT)
            time.sleep(1)
    raise AssertionError("the control worker was never caught ingesting")


def test_a_control_worker_killed_mid_ingest_loses_no_result(cluster, stop_runners):
    """The message it was ingesting is gone with it (the embedded broker) or
    held until Redis's visibility timeout (900 s): the runner sends again
    what the server has not stored two heartbeats after it was sent."""
    cluster.register("cpu-i")
    cluster.start_runner("cpu-i", TILEMATRIX_EDGE_HARNESS_DELAY_S="0.5")
    online(cluster, "cpu-i")
    sweep = cluster.plan(smoke_cells("pk__gt=0"))

    def done() -> int:
        return sum(state == "done" for _, state, _, _ in cluster.jobs(sweep))

    # Heartbeats come from the worker's timer, not its pool: they go on, and
    # say so, while the pool runs jobs.
    cluster.wait(
        lambda: cluster.runner_state("cpu-i") == "busy",
        timeout=60,
        what="the runner busy with the sweep",
    )
    cluster.wait(lambda: done() >= 2, timeout=120, what="two results stored")
    ingest_held(cluster)
    cluster.kill("control")
    assert not cluster.finished(sweep)
    cluster.start_control()
    restarted = time.monotonic()
    cluster.wait_finished(sweep, timeout=120)
    took = time.monotonic() - restarted
    jobs = cluster.jobs(sweep)
    assert {(state, attempt) for _, state, attempt, _ in jobs} == {("done", 1)}, jobs
    assert set(cluster.results_per_job(sweep).values()) == {1}
    assert "runner cpu-i sent again" in cluster.log("runner:cpu-i")
    assert cluster.procs["runner:cpu-i"].poll() is None
    cluster.wait(
        lambda: cluster.runner_state("cpu-i") == "online",
        timeout=30,
        what="the runner online again, its work done",
    )
    # What was left to run and a few heartbeats, not a broker's visibility
    # timeout.
    assert took < 60, took


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory (VmHWM), in MB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")
