"""What a /metrics scrape costs on a large database: p50 and p95 of N
scrapes through Django's test client, and the queries of one.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/h_bench_seed_1m \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/5 \\
        .venv/bin/python bench/metrics_scrape.py --scrapes 50

Point DATABASE_URL at a database bench/load_seed.py seeded (it reads, never
writes). Prints the table and writes bench/out/metrics_scrape.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--out", default=str(OUT / "metrics_scrape.json"))
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    setup_test_environment()
    settings.TILEMATRIX_METRICS_TOKEN = token = "bench"
    with connection.cursor() as cursor:
        sizes = {}
        for name, table in (
            ("results", "matrix_result"),
            ("receipts", "runners_receipt"),
            ("jobs", "matrix_validationjob"),
        ):
            cursor.execute(f"SELECT count(*) FROM {table}")
            sizes[name] = cursor.fetchone()[0]
    client = Client()

    def scrape():
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 200, response.status_code
        return response

    scrape()  # the first builds the registry's imports and connections
    times = []
    for _ in range(args.scrapes):
        started = time.perf_counter()
        scrape()
        times.append((time.perf_counter() - started) * 1000)
    with CaptureQueriesContext(connection) as queries:
        body = scrape().content.decode()
    times.sort()
    report = {
        **sizes,
        "database": connection.vendor,
        "scrapes": len(times),
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
        "queries": len(queries),
        "slowest_query_ms": round(
            max(float(q["time"]) for q in queries.captured_queries) * 1000, 1
        ),
        "parts_failed": [
            line
            for line in body.splitlines()
            if line.startswith("tilematrix_scrape_part_ok") and line.endswith(" 0.0")
        ],
    }
    print(f"{'results':>10} {'scrapes':>8} {'p50 ms':>8} {'p95 ms':>8} {'queries':>8}")
    print(
        f"{report['results']:>10,} {report['scrapes']:>8} {report['p50_ms']:>8} "
        f"{report['p95_ms']:>8} {report['queries']:>8}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
