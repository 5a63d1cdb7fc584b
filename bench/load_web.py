"""The web side of bench/load.py: gunicorn started as docs/deploy.md runs it,
a client signed in through the login form, timed rows and 50 connections of
wrk over a page mix."""

from __future__ import annotations

import gzip
import http.client
import http.cookies
import json
import random
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Long enough that a slow page is measured, not cut at gunicorn's 30 s.
GUNICORN_TIMEOUT_S = 600
# What every client of the bench accepts; a header names "identity" for a
# row timed uncompressed.
ACCEPT_ENCODING = "gzip, deflate"


def gunicorn_command() -> list[str]:
    """The production command of docs/deploy.md, as written there."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    found = re.search(r"^(gunicorn matrix\.wsgi[^#\n]*)", text, re.MULTILINE)
    if found is None:
        raise SystemExit("docs/deploy.md has no `gunicorn matrix.wsgi` command")
    return shlex.split(found.group(1))


# --- the web server and its client -------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gunicorn:
    def __init__(self, env):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        command = gunicorn_command()
        bind = [i for i, a in enumerate(command) if a in ("-b", "--bind")]
        for i in reversed(bind):
            del command[i : i + 2]
        command[0] = str(Path(sys.executable).parent / "gunicorn")
        command += [
            "--bind", f"127.0.0.1:{self.port}",
            "--timeout", str(GUNICORN_TIMEOUT_S),
            "--log-level", "warning",
        ]  # fmt: skip
        self.command = command
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=dict(env), stdout=self.log, stderr=self.log
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                connection = http.client.HTTPConnection(
                    "127.0.0.1", self.port, timeout=5
                )
                connection.request("GET", "/login/")
                connection.getresponse().read()
                return
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.3)
        raise SystemExit(f"gunicorn did not start:\n{self.log_tail()}")

    def drain(self, client, timeout_s: float = 300) -> float:
        """Wait until the workers answer a light page quickly again: requests
        a load left queued (a slow page's) are still being served after the
        load generator closed its connections. Seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            t0 = time.perf_counter()
            for _ in range(3):
                client.get("/login/")
            if time.perf_counter() - t0 < 1.0:
                break
        return round(time.monotonic() - started, 1)

    def worker_rss_mb(self) -> list[float]:
        """RSS of each worker (the master's children), largest first."""
        sizes = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid != self.process.pid:
                    continue
                status = (entry / "status").read_text()
            except (OSError, ValueError, IndexError):
                continue
            found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
            if found:
                sizes.append(round(int(found.group(1)) / 1024, 1))
        return sorted(sizes, reverse=True)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def log_tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-3000:]


class Client:
    """Requests with the session cookie of a user signed in by the form."""

    def __init__(self, port: int):
        self.port = port
        self.cookies: dict[str, str] = {}

    def cookie_header(self) -> str:
        return "; ".join(f"{k}={v}" for k, v in self.cookies.items())

    def request(self, method: str, path: str, body=None, headers=None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=700)
        # As browsers and HTTP libraries (requests, curl --compressed) ask;
        # a gzipped body is unpacked here, inside the time measured.
        sent = {
            "Cookie": self.cookie_header(),
            "Accept-Encoding": ACCEPT_ENCODING,
            **(headers or {}),
        }
        started = time.perf_counter()
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        # The status line and headers are in: the server's part is done, what
        # follows is the body's transfer and unpacking.
        self.first_byte_s = time.perf_counter() - started
        content = response.read()
        if response.getheader("Content-Encoding") == "gzip":
            content = gzip.decompress(content)
        for header in response.headers.get_all("Set-Cookie") or []:
            jar = http.cookies.SimpleCookie()
            jar.load(header)
            for name, morsel in jar.items():
                self.cookies[name] = morsel.value
        connection.close()
        found = {k.lower(): v for k, v in response.getheaders()}
        return response.status, content, found

    def get(self, path: str, headers=None):
        return self.request("GET", path, headers=headers)

    def login(self, username: str, password: str) -> None:
        status, content, _ = self.get("/login/")
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', content)
        if status != 200 or token is None:
            raise SystemExit(f"the login page answered {status} without a form")
        body = urllib.parse.urlencode(
            {
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": token.group(1).decode(),
            }
        )
        status, content, headers = self.request(
            "POST",
            "/login/",
            body=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        if status != 302 or "sessionid" not in self.cookies:
            raise SystemExit(f"signing in failed: {status} {content[:300]!r}")


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


WARM_REQUESTS = 6


def time_row(client, path, requests, budget_s, *, before=None, headers=None) -> dict:
    """Warm up, then time up to ``requests`` requests (at least 3) within
    ``budget_s``; ``before`` runs untimed ahead of each. Warming takes up
    to WARM_REQUESTS requests (within a quarter of the budget), so that each
    of the three workers has served the page once: a worker's first request
    of a page (its imports, templates and catalogue) is not what a user
    meets twice."""
    warm_until = time.monotonic() + budget_s / 4
    for _ in range(WARM_REQUESTS):
        status, content, found = client.get(path, headers=headers)
        if status not in (200, 304):
            raise SystemExit(f"{path}: HTTP {status}\n{content[:2000]!r}")
        if time.monotonic() > warm_until:
            break
    samples, first_bytes, statuses = [], [], {}
    deadline = time.monotonic() + budget_s
    while len(samples) < requests and (len(samples) < 3 or time.monotonic() < deadline):
        if before is not None:
            before()
        t0 = time.perf_counter()
        status, content, found = client.get(path, headers=headers)
        samples.append((time.perf_counter() - t0) * 1000)
        first_bytes.append(client.first_byte_s * 1000)
        statuses[status] = statuses.get(status, 0) + 1
    return {
        "path": path,
        "requests": len(samples),
        "p50_ms": round(statistics.median(samples), 1),
        "p95_ms": round(percentile(samples, 0.95), 1),
        "max_ms": round(max(samples), 1),
        "first_byte_p95_ms": round(percentile(first_bytes, 0.95), 1),
        "statuses": statuses,
        "bytes": len(content),
        "wire_bytes": int(found.get("content-length", len(content))),
        "etag": found.get("etag"),
    }


# --- 50 connections ------------------------------------------------------------

WRK_SCRIPT = """
local paths = {PATHS}
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", paths[(n * 7919) %% #paths + 1])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"p50_ms": %%.1f, "p95_ms": %%.1f, "p99_ms": %%.1f, "max_ms": %%.1f, '
    .. '"requests": %%d, "duration_s": %%.2f, "connect_errors": %%d, '
    .. '"read_errors": %%d, "write_errors": %%d, "timeouts": %%d, '
    .. '"non_2xx_3xx": %%d}\\n',
    latency:percentile(50) / 1000, latency:percentile(95) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, summary.requests,
    summary.duration / 1e6, e.connect, e.read, e.write, e.timeout, e.status))
end
"""


def mixed_load(client, paths, fixture, mix, connections, seconds, port) -> dict:
    """wrk with ``connections`` connections over the page mix, while a
    message of 5 to 25 results arrives every two seconds (a sweep's pace on
    one runner)."""
    rng = random.Random(3)
    weighted = []
    for key, share in mix:
        for _ in range(share):
            path = paths[key]
            if key == "cell":
                path = rng.choice([paths["cell"], *fixture.cell_paths])
            weighted.append(path)
    rng.shuffle(weighted)
    # Each page once first, as a server that has been up meets them: the
    # load measures serving, not a cold start.
    for path in dict.fromkeys(weighted):
        client.get(path)
    stop = threading.Event()
    arrived = [0]

    def sweep():
        from django.db import connections as db

        from matrix.fleet import services

        messages = fixture.messages(
            max(25, seconds * 8), device_type=fixture.outside, toolchain=fixture.current
        )
        for message in messages:
            if stop.wait(2.0):
                break
            services.results_ingest(envelopes=message)
            arrived[0] += len(message)
        db.close_all()

    feeder = threading.Thread(target=sweep)
    feeder.start()
    try:
        result = wrk(client, weighted, connections, seconds, port)
    finally:
        stop.set()
        feeder.join()
    result["connections"] = connections
    result["results_arrived"] = arrived[0]
    result["mix"] = dict(mix)
    return result


def wrk(client, paths: list[str], connections: int, seconds: int, port: int) -> dict:
    """wrk over ``paths`` in turn, signed in as ``client``: latencies,
    requests a second and errors of every kind."""
    lua = WRK_SCRIPT.replace(
        "{PATHS}", "{" + ", ".join(json.dumps(p) for p in paths) + "}"
    )
    lua = lua.replace("%%", "%")
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(lua)
        script.flush()
        run = subprocess.run(
            [
                "wrk",
                "-t2",
                f"-c{connections}",
                f"-d{seconds}s",
                "--timeout",
                "10s",
                "-H",
                f"Cookie: {client.cookie_header()}",
                "-H",
                f"Accept-Encoding: {ACCEPT_ENCODING}",
                "-s",
                script.name,
                f"http://127.0.0.1:{port}",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            check=True,
        )
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    result["errors"] = sum(
        result[k]
        for k in (
            "connect_errors",
            "read_errors",
            "write_errors",
            "timeouts",
            "non_2xx_3xx",
        )
    )
    result["requests_per_s"] = round(result["requests"] / result["duration_s"], 1)
    return result


# Enough connections to keep every worker and the database busy, few
# enough that wrk itself costs little.
COST_CONNECTIONS = 8


def page_costs(client, paths, fixture, keys, seconds, port, cpus) -> dict:
    """Each page of the mix alone under wrk at saturation, no result
    arriving: requests a second, and what one request costs of the machine
    (its cores over that rate: the web worker, PostgreSQL, Redis and wrk on
    the same cores). What the mix's rate can reach follows from them."""
    out = {}
    for key in keys:
        targets = [paths[key]]
        if key == "cell":
            targets += fixture.cell_paths
        for path in targets:
            client.get(path)
        result = wrk(client, targets, COST_CONNECTIONS, seconds, port)
        rate = result["requests_per_s"]
        out[key] = {
            "requests_per_s": rate,
            "machine_ms_per_request": round(cpus * 1000 / rate, 2) if rate else None,
            "p95_ms": result["p95_ms"],
            "errors": result["errors"],
        }
    return out
