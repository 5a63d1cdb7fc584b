"""Two runner hosts on their own network hosts (network namespaces joined to
this one by veth pairs, made here): both register over the virtual network,
share a sweep, and one is cut off mid-sweep; its jobs move to the other and
nothing is lost.

The control side (web server, control worker, a Redis of its own listening
on the virtual network) runs in this namespace, with a SQLite database: the
runner hosts reach only the broker and the web server (they claim jobs over
HTTP and hold no database credentials), and the shared PostgreSQL stays on
localhost.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess

import pytest

from .cluster import Cluster, free_port, wait_for

SUBNET = "10.213"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def remove_leftover_namespaces() -> None:
    """A run killed before its ``finally`` (SIGKILL, a timeout) leaves its
    namespaces and links behind, still holding SUBNET: remove the ones no
    process is using."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in listed.stdout.splitlines():
        name = line.split(" ", 1)[0]
        if not re.fullmatch(r"tm[ab]\d{1,5}", name):
            continue
        users = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True
        )
        if not users.stdout.strip():
            subprocess.run(["ip", "link", "del", f"{name}h"], capture_output=True)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def network():
    """Namespaces hostA and hostB, at SUBNET.1.2 and SUBNET.2.2; this host
    is SUBNET.1.1 and SUBNET.2.1 to them."""
    remove_leftover_namespaces()
    tag = str(os.getpid())[-5:]
    hosts = {}
    try:
        for i, name in enumerate(("a", "b"), start=1):
            ns, here, there = f"tm{name}{tag}", f"tm{name}{tag}h", f"tm{name}{tag}n"
            sh("ip", "netns", "add", ns)
            hosts[name] = {"ns": ns, "link": here, "gateway": f"{SUBNET}.{i}.1"}
            sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
            sh("ip", "link", "set", there, "netns", ns)
            sh("ip", "addr", "add", f"{SUBNET}.{i}.1/24", "dev", here)
            sh("ip", "link", "set", here, "up")
            sh(
                "ip",
                "netns",
                "exec",
                ns,
                "ip",
                "addr",
                "add",
                f"{SUBNET}.{i}.2/24",
                "dev",
                there,
            )
            sh("ip", "netns", "exec", ns, "ip", "link", "set", there, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield hosts
    finally:
        for host in hosts.values():
            subprocess.run(["ip", "link", "del", host["link"]], capture_output=True)
            subprocess.run(["ip", "netns", "del", host["ns"]], capture_output=True)


@pytest.fixture
def broker(tmp_path, network):
    """A Redis of this test's own, listening where both hosts can reach it,
    with a password as a broker on a network has: (port, password)."""
    port, password = free_port(), secrets.token_hex(16)
    gateways = [h["gateway"] for h in network.values()]
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            *gateways,
            "--requirepass",
            password,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
    )
    ping = ["redis-cli", "-p", str(port), "--no-auth-warning", "-a", password, "ping"]
    try:
        wait_for(
            lambda: (
                subprocess.run(ping, capture_output=True, text=True).stdout.strip()
                == "PONG"
            ),
            timeout=20,
            what="the test's redis",
        )
        yield port, password
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture
def cluster(tmp_path, network, broker):
    cluster = Cluster(
        broker=f"redis://:{broker[1]}@127.0.0.1:{broker[0]}/0",
        database="sqlite",
        web_host="0.0.0.0",
    )
    cluster.env["DJANGO_ALLOWED_HOSTS"] = ",".join(
        ["127.0.0.1", "localhost", *(h["gateway"] for h in network.values())]
    )
    try:
        cluster.start_web()
        cluster.start_control()
        yield cluster
    finally:
        cluster.close()


def test_a_host_cut_off_mid_sweep_hands_its_jobs_to_the_other(cluster, network, broker):
    for name, host in network.items():
        prefix = ("ip", "netns", "exec", host["ns"])
        out = cluster.register(
            f"host-{name}",
            server=f"http://{host['gateway']}:{cluster.port}",
            prefix=prefix,
        )
        assert f"registered runner host-{name}" in out
        cluster.start_runner(
            f"host-{name}",
            prefix=prefix,
            CELERY_BROKER_URL=f"redis://:{broker[1]}@{host['gateway']}:{broker[0]}/0",
            TILEMATRIX_EDGE_HARNESS_DELAY_S="0.2",
        )
    for name in network:
        cluster.wait(
            lambda n=name: cluster.runner_state(f"host-{n}") == "online",
            timeout=90,
            what=f"host-{name} online",
        )
    sweep = cluster.plan(
        "[(s, d, Toolchain.objects.get()) for s in "
        "Shape.objects.filter(source_profile='cpu-smoke') for d in DeviceType.objects.all()]"
    )
    runner_ids = dict(cluster.sql("SELECT name, id FROM runners_runner"))

    def ran_on_a():
        return sum(
            r == runner_ids["host-a"]
            for _, s, _, r in cluster.jobs(sweep)
            if s == "running"
        )

    cluster.wait(ran_on_a, timeout=120, what="host-a running a job")
    sh("ip", "link", "set", network["a"]["link"], "down")
    cluster.wait_finished(sweep, timeout=240)

    jobs = cluster.jobs(sweep)
    assert {state for _, state, _, _ in jobs} == {"done"}, jobs
    assert set(cluster.results_per_job(sweep).values()) == {1}
    moved = [j for j in jobs if j[2] > 1]
    assert moved and {runner for _, _, _, runner in moved} == {runner_ids["host-b"]}
    assert cluster.runner_state("host-a") == "offline"
