"""Slow clients against the documented deployment: gunicorn (docs/deploy.md's
command, 3 sync workers) behind nginx (deploy/nginx/tilematrix.conf), both
real processes. A slow-loris run, many more sockets than gunicorn has
workers, each trickling its headers a byte a second, must leave normal
requests as fast as they were; the same run aimed at gunicorn itself must
block it, which is what the proxy is for."""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import threading
import time
from urllib.parse import urlsplit

import pytest

from ..runners.cluster import Cluster
from .proxy import nginx_binary

pytestmark = pytest.mark.skipif(
    nginx_binary() is None, reason="nginx is not installed (apt-get install nginx)"
)

ATTACK_SOCKETS = 50
GUNICORN_WORKERS = 3
# Normal requests: a probe an orchestrator or a runner makes, and a page.
NORMAL_PATHS = ("/api/v1/health", "/login/")
# Under attack, long enough to span nginx's 10 s header timeout, so the
# attack's reconnections are measured too.
ATTACK_WINDOW_S = 12
BASELINE_WINDOW_S = 5
# About 13 requests a second: inside the proxy's 20 a second per address.
PACE_S = 0.15
# On a shared 2-core machine one scheduler hiccup doubles a p95 of a few
# milliseconds; what the proxy prevents is requests waiting for gunicorn's
# 30 s worker timeout. Below this, p95s are compared as this much.
P95_FLOOR_S = 0.02


class SlowLoris:
    """``count`` sockets that each send a request line and then one header
    byte a second, never ending the headers; a socket the server closes is
    opened again, as a real attack does."""

    def __init__(self, url: str, count: int):
        parts = urlsplit(url)
        self.address = (parts.hostname, parts.port)
        self.count = count
        self.sockets: list[socket.socket] = []
        self.reopened = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=5)
        sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        return sock

    def _run(self) -> None:
        while not self.stopping.is_set():
            for i, sock in enumerate(self.sockets):
                try:
                    sock.sendall(b"a")
                except OSError:
                    sock.close()
                    try:
                        self.sockets[i] = self._open()
                        self.reopened += 1
                    except OSError:
                        pass
            self.stopping.wait(1.0)

    def __enter__(self) -> SlowLoris:
        self.sockets = [self._open() for _ in range(self.count)]
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
        for sock in self.sockets:
            sock.close()


def request_s(url: str, path: str, timeout: float = 30) -> float:
    """Seconds to get a whole answer to GET ``path``, on a new connection."""
    parts = urlsplit(url)
    started = time.perf_counter()
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        answer.read()
    finally:
        connection.close()
    assert answer.status == 200, (path, answer.status)
    return time.perf_counter() - started


def p95_of_normal_requests(url: str, window_s: float) -> tuple[float, int]:
    """p95 seconds of NORMAL_PATHS asked in turn, one every PACE_S, for
    ``window_s``; and how many were asked."""
    timings = []
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        for path in NORMAL_PATHS:
            timings.append(request_s(url, path))
        time.sleep(PACE_S)
    return statistics.quantiles(timings, n=20)[-1], len(timings)


@pytest.fixture(scope="module")
def deployment():
    cluster = Cluster()
    try:
        cluster.start_web(proxied=True)
        yield cluster
    finally:
        cluster.close()


# Rounds of (baseline, attack, baseline) until one meets the bound. A busy
# test worker beside this one can slow any one window by tens of
# milliseconds; the failure the proxy prevents (requests waiting on blocked
# gunicorn workers, seconds each) shows in every round.
ROUNDS = 3


def attack_round(url: str) -> dict:
    """The p95s of normal requests before, during and after a slow-loris run."""
    before, asked = p95_of_normal_requests(url, BASELINE_WINDOW_S)
    with SlowLoris(url, ATTACK_SOCKETS) as attack:
        time.sleep(1.5)  # every attacking socket has sent bytes
        attacked, asked_attacked = p95_of_normal_requests(url, ATTACK_WINDOW_S)
        reopened = attack.reopened
    # The baseline is measured on both sides of the attack: the slower of
    # the two is what this machine gives without an attack that minute.
    after, asked_after = p95_of_normal_requests(url, BASELINE_WINDOW_S)
    return {
        "baseline_p95_ms": [round(before * 1000, 1), round(after * 1000, 1)],
        "attacked_p95_ms": round(attacked * 1000, 1),
        "requests": [asked, asked_attacked, asked_after],
        "attack_sockets": ATTACK_SOCKETS,
        "attack_sockets_closed_by_nginx_and_reopened": reopened,
        "within_bound": attacked <= 2 * max(before, after, P95_FLOOR_S),
    }


def test_a_slow_loris_run_leaves_normal_requests_through_the_proxy_as_fast(
    deployment,
):
    url = deployment.server
    for path in NORMAL_PATHS:  # warm: each worker has loaded its pages
        for _ in range(2 * GUNICORN_WORKERS):
            request_s(url, path)
    rounds = []
    while len(rounds) < ROUNDS and not (rounds and rounds[-1]["within_bound"]):
        rounds.append(attack_round(url))
    figures = json.dumps(rounds)
    print(figures)
    assert rounds[-1]["within_bound"], figures
    # nginx closed the trickling connections at its header timeout.
    assert all(
        r["attack_sockets_closed_by_nginx_and_reopened"] >= ATTACK_SOCKETS
        for r in rounds
    ), figures


def post(url: str, path: str, body: bytes) -> tuple[int, dict]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request(
            "POST", path, body=body, headers={"Content-Type": "application/json"}
        )
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def test_the_largest_upload_the_api_takes_passes_the_proxy_a_larger_one_not(
    deployment,
):
    """The API's own 413 (2.5 MB, naming its limit) is what a results
    upload just over it gets; nginx refuses only what is larger still, in
    the same JSON form."""
    from django.conf import settings

    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    status, said = post(deployment.server, "/api/v1/results", b" " * (limit + 1))
    assert (status, said["limit_bytes"]) == (413, limit), said
    status, said = post(deployment.server, "/api/v1/results", b" " * 4 * 2**20)
    assert status == 413
    assert "over 3 MB" in said["detail"]


def test_the_same_run_against_gunicorn_itself_blocks_it(deployment):
    """Without the proxy the attack works: six sockets (two per sync
    worker) hold every worker, and a normal request waits past 3 s (until
    gunicorn's 30 s worker timeout, were it let). The proxy is what stops
    it, not something about this machine or this attack."""
    url = deployment.gunicorn
    request_s(url, "/api/v1/health")
    with SlowLoris(url, 2 * GUNICORN_WORKERS):
        time.sleep(1.5)
        with pytest.raises(TimeoutError):
            request_s(url, "/api/v1/health", timeout=3)
    # Once the attack ends, the workers serve again (well inside their
    # timeout: none was killed).
    assert request_s(url, "/api/v1/health", timeout=10) < 10
