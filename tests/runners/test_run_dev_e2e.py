"""`make run`'s processes (scripts/run-dev): the web server, the control
worker and the local runner run side by side; one that dies is named and
started again, and the others go on; Ctrl-C stops them all."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from .cluster import REPO, Cluster
from .test_worker_e2e import smoke_cells


@pytest.fixture
def demo():
    cluster = Cluster()
    log = cluster.root / "run-dev.log"
    handle = log.open("ab")
    proc = subprocess.Popen(
        [str(REPO / "scripts" / "run-dev")],
        cwd=REPO,
        env={**cluster.env, "PORT": str(cluster.port)},
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    cluster.procs["run-dev"], cluster.logs["run-dev"] = proc, log
    try:
        yield cluster
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        cluster.close()


def pids(cluster, name: str) -> list[int]:
    """The pids run-dev started ``name`` under, in order."""
    found = re.findall(
        rf"^{name}\s*\| started \(pid (\d+)\)", cluster.log("run-dev"), re.M
    )
    return [int(pid) for pid in found]


def group(pgid: int) -> set[int]:
    """The processes of a process group, from /proc."""
    members = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    members.add(int(entry))
            except ProcessLookupError:
                pass
    return members


def running(pid: int) -> bool:
    """Alive and not a zombie (one only its parent's wait would clear)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_dead_process_is_named_and_started_again_and_ctrl_c_stops_all(demo):
    demo.wait(
        lambda: "TileMatrix: http://127.0.0.1:" in demo.log("run-dev"),
        timeout=120,
        what="run-dev ready",
    )
    demo.wait(
        lambda: demo.runner_state("local-cpu") == "online",
        timeout=90,
        what="the local runner online",
    )
    (control,) = pids(demo, "control")
    # Its beat and pool: children in its process group.
    demo.wait(
        lambda: len(group(control)) > 1, timeout=30, what="the control worker's pool"
    )
    left = group(control) - {control}
    # The main process alone, as an OOM kill takes it: its children live on.
    os.kill(control, signal.SIGKILL)
    demo.wait(
        lambda: (
            "control died after" in demo.log("run-dev")
            and len(pids(demo, "control")) == 2
        ),
        timeout=30,
        what="the control worker started again",
    )
    said = demo.log("run-dev")
    assert "(killed by SIGKILL); its last lines:" in said
    # Nothing of the dead worker outlives it: no second beat beside the new one.
    assert left and not [pid for pid in left if running(pid)], group(control)
    assert "starting control again in 1 s" in said
    # The restarted control worker stores the runner's work.
    sweep = demo.plan(smoke_cells("backend='c'", limit=2))
    demo.wait(lambda: demo.finished(sweep), timeout=120, what="the sweep")
    assert {state for _, state, _, _ in demo.jobs(sweep)} == {"done"}
    started = [pids(demo, n)[-1] for n in ("web", "control", "runner")]
    assert all(alive(pid) for pid in started)

    run_dev = demo.procs["run-dev"]
    run_dev.send_signal(signal.SIGINT)
    assert run_dev.wait(timeout=30) == 0
    assert not [pid for pid in started if alive(pid)], demo.log("run-dev")[-3000:]
