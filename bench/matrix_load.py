"""The matrix page under load: wrk with 50 connections against gunicorn on
loopback, over the database bench/matrix_page.py filled (run that first).

Requests carry the session of a user with the viewer role; sessions are
read from a Redis cache as in a deployment (TILEMATRIX_SESSION_CACHE_URL,
default redis://127.0.0.1:6379/13; set it empty for database sessions).
gunicorn runs as docs/deploy.md advises for this host: sync workers, one
more than the cores. Prints p50/p95/p99, requests per second and errors,
and writes bench/out/matrix_load.json. Target: p95 ≤ 300 ms, no errors.

    .venv/bin/python bench/matrix_load.py [--anonymous] [--connections 50]
        [--duration 20] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/tilematrix_bench"
DEFAULT_SESSION_CACHE = "redis://127.0.0.1:6379/13"
# wrk prints no p95 by itself; its Lua hook can.
REPORT_LUA = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"p50_ms": %.2f, "p95_ms": %.2f, "p99_ms": %.2f, "max_ms": %.2f, '
    .. '"requests": %d, "duration_s": %.2f, "connect_errors": %d, "read_errors": %d, '
    .. '"write_errors": %d, "timeouts": %d, "non_2xx_3xx": %d}\\n',
    latency:percentile(50) / 1000, latency:percentile(95) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, summary.requests,
    summary.duration / 1e6, e.connect, e.read, e.write, e.timeout, e.status))
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, cookie: str, timeout_s: float = 30) -> bytes:
    """The page's body once the server answers it."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return response.read()
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"gunicorn did not answer {url} within {timeout_s} s")


def viewer_session_cookie(url: str) -> str:
    """A session of the benchmark's viewer, stored in the database the
    server reads."""
    sys.path.insert(0, str(ROOT / "bench"))
    import matrix_page

    matrix_page.setup_django(url)
    from django.conf import settings
    from django.test import Client

    client = Client()
    matrix_page.viewer_login(client)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--duration", type=int, default=20, help="seconds")
    parser.add_argument(
        "--workers",
        type=int,
        default=(os.cpu_count() or 1) + 1,
        help="gunicorn sync workers (default: cores + 1)",
    )
    parser.add_argument("--path", default="/")
    parser.add_argument(
        "--anonymous",
        action="store_true",
        help="no session: the server allows anonymous reads "
        "(TILEMATRIX_ANONYMOUS_READ, the embedded default's convenience)",
    )
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "out" / "matrix_load.json")
    )
    args = parser.parse_args()

    os.environ.setdefault("TILEMATRIX_SESSION_CACHE_URL", DEFAULT_SESSION_CACHE)
    load_at_start = os.getloadavg()
    cookie = ""
    if not args.anonymous:
        cookie = viewer_session_cookie(os.environ.get("DATABASE_URL") or DEFAULT_URL)
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": os.environ.get("DATABASE_URL") or DEFAULT_URL,
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": os.environ.get(
            "DJANGO_SECRET_KEY", "bench-" + "k3y!" * 16
        ),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SECURE_SSL_REDIRECT": "0",
        "TILEMATRIX_ANONYMOUS_READ": "1" if args.anonymous else "0",
    }
    gunicorn = [
        str(Path(sys.executable).parent / "gunicorn"),
        "matrix.wsgi:application",
        "--bind", f"127.0.0.1:{port}",
        "--workers", str(args.workers),
        "--backlog", "2048",
        "--log-level", "warning",
    ]  # fmt: skip
    server = subprocess.Popen(gunicorn, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}{args.path}"
    try:
        body = wait_ready(url, cookie)
        # Timing an error page or an empty matrix would prove nothing.
        if b'id="matrix"' not in body or b"tbody" not in body:
            raise SystemExit(
                f"{url} does not serve a filled matrix; run matrix_page.py"
            )
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
            script.write(REPORT_LUA)
            script.flush()
            run = subprocess.run(
                [
                    "wrk",
                    f"-t{args.threads}",
                    f"-c{args.connections}",
                    f"-d{args.duration}s",
                    "--timeout",
                    "10s",
                    *(["-H", f"Cookie: {cookie}"] if cookie else []),
                    "-s",
                    script.name,
                    url,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    result["requests_per_s"] = round(result["requests"] / result["duration_s"], 1)
    errors = sum(
        result[k]
        for k in (
            "connect_errors",
            "read_errors",
            "write_errors",
            "timeouts",
            "non_2xx_3xx",
        )
    )
    report = {
        "url_path": args.path,
        "signed_in": not args.anonymous,
        "connections": args.connections,
        "gunicorn_workers": args.workers,
        "session_cache": os.environ.get("TILEMATRIX_SESSION_CACHE_URL") or None,
        "page_bytes": len(body),
        "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        **result,
        "errors": errors,
        "meets_target": result["p95_ms"] <= 300 and errors == 0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(run.stdout)
    print(
        f"{args.connections} connections, {args.workers} workers: p50 {result['p50_ms']} ms, "
        f"p95 {result['p95_ms']} ms, p99 {result['p99_ms']} ms, "
        f"{report['requests_per_s']} req/s, {errors} errors; load average "
        f"{load_at_start[0]:.1f} at start, {report['load_average_at_end'][0]:.1f} "
        "at end"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
