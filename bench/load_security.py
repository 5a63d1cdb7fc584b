"""Load with the security layer on: 50 signed-in users for 2 minutes on
loopback against gunicorn (DEBUG off, role middleware, CSRF, CSP, axes)
while sweeps run through the whole deployment (PostgreSQL, Redis, control
worker, a registered runner signing its results).

Users are viewers reading the matrix, gaps, errors, cells and submissions
pages, and kernel authors submitting kernels through the CSRF-checked form.
Counts as an error: any 5xx, 4xx, timeout or refused connection. Counts as
lost: a submission the server accepted that is not stored, or a planned job
without exactly one result once the sweeps finish.

The runner uses the harness's edge double (tests/runners/edge_harness.py,
no TileLang compile) unless --harness real: on a shared 2-core host, real
compiles would measure the compiler instead of the web.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/0 \\
    .venv/bin/python bench/load_security.py [--users 50] [--duration 120]

Prints a table and writes bench/out/load_security.json.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import random
import statistics
import string
import sys
import threading
import time
import urllib.parse
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.runners.cluster import PY, Cluster, wait_for  # noqa: E402

AUTHOR_SHARE = 0.2
READ_PATHS = ("/", "/gaps/", "/errors/", "/submissions/", "/runners/")
KERNEL = """import tilelang.cpu.language as T


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def load_add_{tag}(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            for j in T.serial(N):
                C[i, j] = A[i, j] + B[i, j]

    return load_add_{tag}
"""
USERS_SCRIPT = """
import json
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.sessions.backends.db import SessionStore

viewer = Group.objects.get(name="viewer")
author = Group.objects.get(name="kernel author")
sessions = []
for i in range({users}):
    user = get_user_model().objects.create_user(f"load{{i}}")
    user.groups.add(viewer)
    if i < {authors}:
        user.groups.add(author)
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "matrix.accounts.auth.RoleModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    sessions.append(store.session_key)
cpu = DeviceType.objects.get(backend="c").pk
cells = [(shape, cpu) for shape in Shape.objects.values_list("id", flat=True)[:50]]
print("USERS " + json.dumps({{"sessions": sessions, "cells": cells}}))
"""


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.error_samples: list[str] = []
        self.submitted: list[str] = []

    def record(self, action: str, seconds: float, error: str | None) -> None:
        with self.lock:
            self.latency[action].append(seconds)
            if error:
                self.errors[action] += 1
                if len(self.error_samples) < 10:
                    self.error_samples.append(f"{action}: {error}")


def user_loop(
    port: int, session: str, author: bool, cells, stats: Stats, stop: float, seed: int
):
    rng = random.Random(seed)
    csrf = "".join(rng.choices(string.ascii_letters + string.digits, k=32))
    cookie = f"sessionid={session}; csrftoken={csrf}"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while time.monotonic() < stop:
        if author and rng.random() < 0.15:
            action, method = "submit", "POST"
            tag = hashlib.sha256(f"{seed}-{time.monotonic_ns()}".encode()).hexdigest()
            source = KERNEL.format(tag=tag[:16])
            body = urllib.parse.urlencode(
                {"operator": "elementwise_add", "source": source}
            )
            path = "/submissions/new/"
            headers = {
                "Cookie": cookie,
                "X-CSRFToken": csrf,
                "Content-Type": "application/x-www-form-urlencoded",
            }
        else:
            method, body = "GET", None
            if cells and rng.random() < 0.25:
                shape, device_type = rng.choice(cells)
                action, path = "cell", f"/cells/{shape}/{device_type}/"
            else:
                path = rng.choice(READ_PATHS)
                action = path.strip("/") or "matrix"
            headers = {"Cookie": cookie}
        start = time.perf_counter()
        error = None
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            location = response.getheader("Location") or ""
            if method == "POST":
                # Stored: redirected to the submission's own page.
                ok = response.status == 302 and location.startswith("/submissions/")
            else:
                ok = response.status == 200
            if not ok:
                error = f"{method} {path}: {response.status} {location}".rstrip()
            elif method == "POST":
                with stats.lock:
                    stats.submitted.append(hashlib.sha256(source.encode()).hexdigest())
        except (OSError, http.client.HTTPException) as exc:
            error = f"{method} {path}: {exc.__class__.__name__}: {exc}"
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        stats.record(action, time.perf_counter() - start, error)
    connection.close()


def sweep_loop(cluster: Cluster, stop: float, sweeps: list[int]) -> None:
    """One sweep after another until the load stops: always one running."""
    while time.monotonic() < stop:
        sweep = cluster.sweep("--device-type", "c")
        sweeps.append(sweep)
        print(f"sweep {sweep}: {len(cluster.jobs(sweep))} jobs", file=sys.stderr)
        cluster.wait_finished(sweep, timeout=300)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=3, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker")
    parser.add_argument("--harness", choices=("edge", "real"), default="edge")
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "out" / "load_security.json")
    )
    args = parser.parse_args()

    cluster = Cluster(harness=args.harness)
    # Sessions are signed and bound to the secret key: the shell that makes
    # them and the server that reads them share it.
    cluster.env["DJANGO_SECRET_KEY"] = "load-" + "s3cr3t!" * 8
    stats = Stats()
    sweeps: list[int] = []
    try:
        authors = max(1, int(args.users * AUTHOR_SHARE))
        out = cluster.manage(
            "shell",
            "-c",
            "from matrix.models import DeviceType, Shape\n"
            + USERS_SCRIPT.format(users=args.users, authors=authors),
        ).stdout
        setup = json.loads(out.split("USERS ", 1)[1])
        cluster.start_control()
        port = cluster.port  # where `runner register` finds the server
        web_env = {
            "DJANGO_DEBUG": "0",
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DJANGO_SECURE_SSL_REDIRECT": "0",
        }
        cluster.start(
            "gunicorn",
            [
                str(Path(PY).parent / "gunicorn"),
                "matrix.wsgi:application",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(args.workers),
                "--threads",
                str(args.threads),
                "--backlog",
                "2048",
                "--log-level",
                "warning",
            ],  # fmt: skip
            env=web_env,
        )
        wait_for(lambda: _answers(port), timeout=60, what="gunicorn", every=0.5)
        cluster.register("load-cpu")
        cluster.start_runner("load-cpu", TILEMATRIX_EDGE_HARNESS_DELAY_S="0.05")
        stop = time.monotonic() + args.duration
        sweeper = threading.Thread(target=sweep_loop, args=(cluster, stop, sweeps))
        sweeper.start()
        users = [
            threading.Thread(
                target=user_loop,
                args=(
                    port,
                    session,
                    i < authors,
                    setup["cells"],
                    stats,
                    stop,
                    i,
                ),
            )
            for i, session in enumerate(setup["sessions"])
        ]
        started = time.monotonic()
        for thread in users:
            thread.start()
        for thread in users:
            thread.join()
        elapsed = time.monotonic() - started
        sweeper.join()
        report = _report(cluster, stats, sweeps, args, elapsed)
    except BaseException:
        for name in ("gunicorn", "control"):
            if name in cluster.logs:
                print(f"--- {name}\n{cluster.log(name)[-3000:]}", file=sys.stderr)
        raise
    finally:
        cluster.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    _print_table(report)
    print(f"wrote {args.out}")
    if report["errors"] or report["lost_submissions"] or report["lost_jobs"]:
        sys.exit(1)


def _answers(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        connection.request("GET", "/api/v1/health")
        return connection.getresponse().status in (200, 503)
    except OSError:
        return False


def _report(cluster, stats: Stats, sweeps, args, elapsed: float) -> dict:
    stored = {
        row[0]
        for row in cluster.sql(
            "SELECT source_sha256 FROM matrix_kernelrevision WHERE origin = 'submitted'"
        )
    }
    lost_submissions = [h for h in stats.submitted if h not in stored]
    results_per_job: dict[int, int] = {}
    for sweep in sweeps:
        results_per_job.update(cluster.results_per_job(sweep))
    lost_jobs = [job for job, n in results_per_job.items() if n != 1]
    actions = {}
    for action, values in sorted(stats.latency.items()):
        actions[action] = {
            "requests": len(values),
            "errors": stats.errors.get(action, 0),
            "p50_ms": round(statistics.median(values) * 1e3, 1),
            "p95_ms": round(percentile(values, 0.95) * 1e3, 1),
            "max_ms": round(max(values) * 1e3, 1),
        }
    requests = sum(a["requests"] for a in actions.values())
    return {
        "users": args.users,
        "duration_s": round(elapsed, 1),
        "gunicorn": {"workers": args.workers, "threads": args.threads},
        "harness": args.harness,
        "database": cluster.env.get("DATABASE_URL", "sqlite").split("@")[-1],
        "broker": cluster.broker_url().split("@")[-1],
        "requests": requests,
        "requests_per_s": round(requests / elapsed, 1),
        "errors": sum(stats.errors.values()),
        "error_samples": stats.error_samples,
        "submissions_accepted": len(stats.submitted),
        "lost_submissions": len(lost_submissions),
        "sweeps": len(sweeps),
        "jobs": len(results_per_job),
        "lost_jobs": len(lost_jobs),
        "actions": actions,
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
    }


def _print_table(report: dict) -> None:
    print(f"{'action':<14}{'requests':>10}{'errors':>8}{'p50 ms':>9}{'p95 ms':>9}")
    for action, row in report["actions"].items():
        print(
            f"{action:<14}{row['requests']:>10}{row['errors']:>8}"
            f"{row['p50_ms']:>9}{row['p95_ms']:>9}"
        )
    print(
        f"{report['users']} users, {report['duration_s']} s: "
        f"{report['requests']} requests ({report['requests_per_s']}/s), "
        f"{report['errors']} errors; {report['submissions_accepted']} submissions, "
        f"{report['lost_submissions']} lost; {report['sweeps']} sweeps, "
        f"{report['jobs']} jobs, {report['lost_jobs']} without exactly one result"
    )
    print(json.dumps({k: v for k, v in report.items() if k != "actions"}))


if __name__ == "__main__":
    main()
