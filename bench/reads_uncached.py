"""What each read costs when nothing is cached: p50 and p95 of generated
addresses per kind of read, every cache emptied before each request.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/h_bench_seed_1m \\
        .venv/bin/python bench/reads_uncached.py --requests 20

Under a fleet's steady ingest, an address read less often than its version
moves is computed in full on every read (docs/deploy.md, "reads during
steady ingest"): this is that cost, one read at a time, without the web
server, the network or other load (the application loaded as a web
worker loads it, matrix.wsgi), so that a change to a read's code can be
compared alone. The addresses are bench/load_steady.py's (filters, page
numbers, cells of every toolchain, models), drawn from ``--seed``: the same
seed gives the same addresses on the same database.

Point DATABASE_URL at a database bench/load_seed.py seeded (it reads; it
adds a superuser to sign in with if there is none). Prints the table and
writes bench/out/reads_uncached.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import load_steady

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
# Every kind of read the steady bench makes, but the deep cursor pages:
# their addresses come from walking the chains first.
KINDS = tuple(k for k in load_steady.KINDS if not k.endswith("_deep"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="per kind")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seed", type=int, default=3, help="the addresses'")
    parser.add_argument("--out", default=str(OUT / "reads_uncached.json"))
    args = parser.parse_args()
    # Production's settings: no debug toolbar, no query log.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-" + "k3Jx9Qp2Lz7Wm4Rt8Vb1Nc6" * 3)
    os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver")
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.cache import caches
    from django.test import Client

    # As a gunicorn worker loads it: views imported, templates compiled and
    # the loaded application frozen out of the garbage collector's sight.
    import matrix.wsgi  # noqa: F401

    users = get_user_model()
    user = users.objects.filter(is_superuser=True).first()
    if user is None:
        user = users.objects.create_superuser("bench-reader", "bench@example.com", None)
    client = Client()
    space = load_steady.UrlSpace(client, random.Random(args.seed))
    rows = {}
    print(f"{'read, cache emptied':20} {'p50 ms':>8} {'p95 ms':>8}  statuses")
    for kind in args.kinds.split(","):
        times, statuses = [], {}
        for _ in range(args.requests):
            url = space.url(kind)
            for alias in caches:
                caches[alias].clear()
            client.force_login(user)  # the session went with the cache
            started = time.perf_counter()
            response = client.get(url, secure=True)
            times.append((time.perf_counter() - started) * 1000)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        times.sort()
        rows[kind] = {
            "requests": len(times),
            "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(times[round(0.95 * (len(times) - 1))], 1),
            "statuses": statuses,
        }
        print(
            f"{kind:20} {rows[kind]['p50_ms']:8.1f} {rows[kind]['p95_ms']:8.1f}  "
            f"{statuses}",
            flush=True,
        )
    OUT.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "load_average": os.getloadavg(),
                "seed": args.seed,
                "reads": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
