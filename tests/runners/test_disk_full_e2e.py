"""A runner host whose disk fills, end to end: the documented deployment
(gunicorn behind nginx, deploy/nginx/tilematrix.conf; the runner registers,
claims and asks for its outbox through the proxy), a control worker, and a
runner worker whose key directory (outbox, kernel cache) is a real 4 MB
tmpfs. Full, the runner takes no job: its messages go back to the queue,
its jobs stay queued, none fails. Once the space is given back it resumes by
itself, without a restart, and runs them."""

from __future__ import annotations

import pytest

from .cluster import Cluster
from .small_disk import fill, small_disk
from .test_worker_e2e import online, smoke_cells


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster()
    try:
        cluster.start_web(proxied=True)
        cluster.start_control()
        yield cluster
    finally:
        cluster.close()


def test_a_runner_short_of_disk_waits_and_resumes_once_there_is_room(cluster):
    with small_disk(cluster.key_dir("cpu-full"), 4) as key_dir:
        cluster.register("cpu-full")
        cluster.start_runner(
            "cpu-full",
            TILEMATRIX_EDGE_HARNESS_DELAY_S="0.05",
            TILEMATRIX_RUNNER_DISK_FREE_MB="1",
        )
        online(cluster, "cpu-full")
        filler = fill(key_dir, leave_bytes=256 * 1024)
        sweep = cluster.plan(smoke_cells("backend='c'", limit=3))
        cluster.wait(
            lambda: "is short of disk" in cluster.log("runner:cpu-full"),
            timeout=60,
            what="the runner to give a message back for want of disk",
        )
        # Two heartbeats later (2 s each): still nothing run, nothing failed.
        cluster.wait(
            lambda: cluster.log("runner:cpu-full").count("still waits for room") >= 2,
            timeout=30,
            what="two heartbeats that find no room",
        )
        assert {state for _, state, _, _ in cluster.jobs(sweep)} == {"queued"}

        filler.unlink()
        cluster.wait_finished(sweep, timeout=120)
        jobs = cluster.jobs(sweep)
        assert {state for _, state, _, _ in jobs} == {"done"}, jobs
        assert cluster.procs["runner:cpu-full"].poll() is None  # never restarted
        assert "runner cpu-full is active again" in cluster.log("runner:cpu-full")
        # Its results went through its outbox on the small disk.
        assert cluster.results_per_job(sweep) == {job: 1 for job, *_ in jobs}
        cluster.kill("runner:cpu-full")
