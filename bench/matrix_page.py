"""Matrix page server time at 10,000 and 1,000,000 stored results.

Fills a dedicated PostgreSQL database (DATABASE_URL, else
postgres://postgres@127.0.0.1:5432/tilematrix_bench, created when missing)
with a catalogue of 50 device types × 2,000 shape rows, then loads results
with COPY and points one Cell per (shape, device type, toolchain) at its
newest result. At each size it times, with Django's test Client in this
process:

- ``matrix``: the real home page (reads Cell; its table cached per data
  version, so this is the steady state of repeated views),
- ``matrix-nocache``: the same page with its caches off, every request
  reading the catalogue, aggregating Cell and rendering the table: what
  the first view after each stored result costs, since a result changes
  the data version (during a sweep, most views),
- ``matrix+open``: the home page with one operator (400 shape rows)
  expanded: never cached as a page, its catalogue reads cached as always,
- ``naive``: the same page whose per-cell status comes from a latest-result-
  per-cell GROUP BY over Result, the baseline that Cell exists to avoid.

Requests come from a user with the viewer role, signed in, with sessions
in a Redis cache as a deployment has them (TILEMATRIX_SESSION_CACHE_URL,
default redis://127.0.0.1:6379/13; set it empty for database sessions).
Prints a table and writes bench/out/matrix_page.json.

    .venv/bin/python bench/matrix_page.py [--requests 200] [--sizes 10000 1000000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/tilematrix_bench"
DEFAULT_SESSION_CACHE = "redis://127.0.0.1:6379/13"
OPERATORS = {
    "gemm": ["M", "N", "K"],
    "rmsnorm": ["M", "N"],
    "softmax": ["M", "N"],
    "row_sum": ["M", "N"],
    "elementwise_add": ["M", "N"],
}
BACKENDS = ["cuda", "hip", "c", "metal", "npu"]
DTYPES = ["float16", "bfloat16", "float32"]
# Shares of cell outcomes, roughly what a young kernel library shows.
STATUS_MIX = [
    ("pass", 55),
    ("built", 8),
    ("lowered", 7),
    ("compile_error", 12),
    ("mismatch", 6),
    ("runtime_error", 3),
    ("timeout", 2),
    ("unsupported", 7),
]


def ensure_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    # Production settings: no debug query log slowing every request down.
    os.environ.setdefault("DJANGO_DEBUG", "0")
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-" + "k3y!" * 16)
    os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
    os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "0")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
    os.environ.setdefault("TILEMATRIX_SESSION_CACHE_URL", DEFAULT_SESSION_CACHE)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def viewer_login(client) -> None:
    """Sign ``client`` in as a user with the viewer role: with DEBUG off
    nobody without a role reads the matrix."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    user, _ = get_user_model().objects.get_or_create(username="bench-viewer")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)


def table(model) -> str:
    return model._meta.db_table


def reset() -> None:
    from django.db import connection

    from matrix.models import Cell, DeviceType, Operator, Result, Toolchain

    with connection.cursor() as cur:
        names = ", ".join(
            table(m) for m in (Cell, Result, Operator, DeviceType, Toolchain)
        )
        cur.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def catalogue(device_types: int, shapes_per_operator: int) -> dict:
    """Device types, operators with a current and an old revision, served and
    unserved shapes, a current and an old toolchain."""
    from matrix.models import (
        DeviceType,
        KernelRevision,
        Operator,
        Shape,
        Toolchain,
        dims_key,
    )

    rng = random.Random(7)
    DeviceType.objects.bulk_create(
        DeviceType(
            vendor=f"Vendor{i % 7}",
            model=f"Model-{i:02d}",
            arch=f"arch{i}",
            backend=BACKENDS[i % len(BACKENDS)],
        )
        for i in range(device_types)
    )
    revisions = {}
    for name, dims in OPERATORS.items():
        op = Operator.objects.create(name=name, dims=dims)
        old = KernelRevision.objects.create(
            operator=op,
            source_sha256=hashlib.sha256(f"{name}-old".encode()).hexdigest(),
            origin="library",
            review_state="approved",
        )
        current = KernelRevision.objects.create(
            operator=op,
            source_sha256=hashlib.sha256(name.encode()).hexdigest(),
            origin="library",
            review_state="approved",
            is_current=True,
        )
        revisions[op.pk] = (current.pk, old.pk)
        shapes = []
        for i in range(shapes_per_operator):
            values = {d: 2 ** (4 + (i * (j + 3)) % 9) + i for j, d in enumerate(dims)}
            served = i % 4 == 0
            shapes.append(
                Shape(
                    operator=op,
                    dims=values,
                    dims_key=dims_key(values),
                    dtype=DTYPES[i % 3],
                    served=served,
                    weight=rng.uniform(1, 100) if served else 0.0,
                )
            )
        Shape.objects.bulk_create(shapes)
    now = datetime.now(UTC)
    Toolchain.objects.bulk_create(
        [
            Toolchain(
                name="tl-0.1.13",
                tilelang_version="0.1.13",
                fingerprint="a" * 64,
                created_at=now,
            ),
            Toolchain(
                name="tl-0.1.15",
                tilelang_version="0.1.15",
                fingerprint="b" * 64,
                is_current=True,
                created_at=now,
            ),
        ]
    )
    return {
        "shapes": list(Shape.objects.values_list("id", "operator_id")),
        "device_types": list(DeviceType.objects.values_list("id", flat=True)),
        "toolchain": Toolchain.objects.get(is_current=True).pk,
        "revisions": revisions,
    }


def fill(cat: dict, results: int, cells: int) -> dict:
    """COPY ``results`` jobs and results spread round-robin over ``cells``
    cells (so every cell's newest result is among the last ``cells`` rows),
    then one Cell per cell pointing at it."""
    from django.db import connection

    from matrix.models import Cell, Result, ValidationJob

    reset_results()
    pairs = [(s, op, d) for s, op in cat["shapes"] for d in cat["device_types"]]
    if cells > len(pairs):
        raise SystemExit(f"{cells} cells asked, the catalogue has {len(pairs)}")
    rng = random.Random(11)
    pairs = rng.sample(pairs, cells)
    statuses = [s for s, w in STATUS_MIX for _ in range(w)]
    tc = cat["toolchain"]
    start = datetime.now(UTC) - timedelta(days=365)
    step = timedelta(days=365) / results
    job_cols = (
        "id, revision_id, shape_id, device_type_id, toolchain_id, stage, state, "
        "attempt, seed, queue, created_at, finished_at"
    )
    result_cols = (
        "id, job_id, attempt, revision_id, shape_id, device_type_id, toolchain_id, "
        "status, stage_reached, kernel_ms, reference_ms, rel_err, error_signature, "
        "error_message, fingerprint, details, created_at"
    )
    latest = {}
    t0 = time.perf_counter()
    raw = connection.connection
    with raw.cursor() as cur:
        with cur.copy(f"COPY {table(ValidationJob)} ({job_cols}) FROM STDIN") as copy:
            for i in range(results):
                shape, op, dt = pairs[i % cells]
                # The last pass over the cells uses current revisions; a tenth
                # of cells keep an old one, so the page shows stale cells.
                current, old = cat["revisions"][op]
                rev = old if i < results - cells or (i % 10 == 0) else current
                when = start + step * i
                copy.write_row(
                    (
                        i + 1,
                        rev,
                        shape,
                        dt,
                        tc,
                        "validate",
                        "done",
                        1,
                        0,
                        "",
                        when,
                        when,
                    )
                )
        with cur.copy(f"COPY {table(Result)} ({result_cols}) FROM STDIN") as copy:
            for i in range(results):
                shape, op, dt = pairs[i % cells]
                current, old = cat["revisions"][op]
                rev = old if i < results - cells or (i % 10 == 0) else current
                status = statuses[(i * 7919) % len(statuses)]
                failing = status in ("compile_error", "mismatch", "runtime_error")
                sig = f"sig{(i * 31) % 40:02d}" if failing else ""
                when = start + step * i
                kms = 0.01 + (i % 97) / 100
                copy.write_row(
                    (
                        i + 1,
                        i + 1,
                        1,
                        rev,
                        shape,
                        dt,
                        tc,
                        status,
                        "validate",
                        kms,
                        kms * 1.3,
                        1e-4,
                        sig,
                        f"error {sig} in pass LowerTile" if sig else "",
                        "b" * 64,
                        "{}",
                        when,
                    )
                )
                latest[shape, dt] = (i + 1, rev, status, sig, kms, when)
        with cur.copy(
            f"COPY {table(Cell)} (shape_id, device_type_id, toolchain_id, revision_id, "
            "result_id, status, error_signature, kernel_ms, reference_ms, updated_at) "
            "FROM STDIN"
        ) as copy:
            for (shape, dt), (rid, rev, status, sig, kms, when) in latest.items():
                copy.write_row(
                    (shape, dt, tc, rev, rid, status, sig, kms, kms * 1.3, when)
                )
        for model in (ValidationJob, Result, Cell):
            cur.execute(
                f"SELECT setval(pg_get_serial_sequence('{table(model)}', 'id'), "
                f"(SELECT coalesce(max(id), 1) FROM {table(model)}))"
            )
    raw.commit()
    # Settle the database before timing: without this, autovacuum and the
    # checkpointer work through the fresh million rows while pages are timed.
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
        cur.execute("CHECKPOINT")
    return {"load_s": round(time.perf_counter() - t0, 1), "cells": len(latest)}


def reset_results() -> None:
    from django.db import connection

    from matrix.models import Cell, Result, ValidationJob

    with connection.cursor() as cur:
        cur.execute(
            f"TRUNCATE {table(Cell)}, {table(Result)}, {table(ValidationJob)} "
            "RESTART IDENTITY CASCADE"
        )


def naive_groups(filters, device_types):
    """(operator, revision, device type, status, count) from the newest
    Result of each cell, found by GROUP BY over every stored result."""
    from django.db import connection

    from matrix.models import KernelRevision, Result

    ids = [d.id for d in device_types]
    with connection.cursor() as cur:
        cur.execute(
            f"""
            SELECT kr.operator_id, r.revision_id, r.device_type_id, r.status,
                count(*)
            FROM {table(Result)} r
            JOIN {table(KernelRevision)} kr ON kr.id = r.revision_id
            JOIN (
                SELECT shape_id, device_type_id, max(created_at) AS newest
                FROM {table(Result)}
                WHERE toolchain_id = %s AND device_type_id = ANY(%s)
                GROUP BY shape_id, device_type_id
            ) latest ON latest.shape_id = r.shape_id
                AND latest.device_type_id = r.device_type_id
                AND latest.newest = r.created_at
            WHERE r.toolchain_id = %s
            GROUP BY 1, 2, 3, 4
            """,
            [filters.toolchain.pk, ids, filters.toolchain.pk],
        )
        return cur.fetchall()


def naive_matrix_page(request):
    """The home page with its cell statuses read the naive way."""
    from django.shortcuts import render

    from matrix import queries
    from matrix.views.matrix import ROWS, catalogue_read, matrix_context

    catalogue = catalogue_read(request.GET)
    filters = queries.MatrixFilters.from_params(request.GET, catalogue.toolchains)
    device_types = queries.device_type_list(filters, catalogue.device_types)
    groups = naive_groups(filters, device_types)
    context = matrix_context(filters, catalogue, [], ROWS, groups)
    return render(request, "matrix/matrix.html", context)


urlpatterns: list = []


def install_baseline_url() -> None:
    from django.urls import clear_url_caches, path

    from matrix import urls

    global urlpatterns
    urlpatterns = [path("naive/", naive_matrix_page), *urls.urlpatterns]
    from django.conf import settings

    settings.ROOT_URLCONF = __name__
    clear_url_caches()


def time_page(client, url: str, requests: int) -> dict:
    from django.db import connection

    for _ in range(3):  # warm caches and the connection
        response = client.get(url)
        if response.status_code != 200:
            raise SystemExit(
                f"{url}: HTTP {response.status_code}\n{response.content[:2000]}"
            )
    # Counted by a wrapper: the request_started signal empties the debug log.
    executed = []
    with connection.execute_wrapper(
        lambda execute, sql, params, many, context: (
            executed.append(sql),
            execute(sql, params, many, context),
        )[1]
    ):
        response = client.get(url)
    samples = []
    for _ in range(requests):
        t0 = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p95_ms": round(samples[int(0.95 * (len(samples) - 1))], 2),
        "max_ms": round(samples[-1], 2),
        "queries": len(executed),
        "bytes": len(response.content),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--naive-requests",
        type=int,
        default=20,
        help="the baseline takes seconds per request at 1M results",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--device-types", type=int, default=50)
    parser.add_argument("--shapes-per-operator", type=int, default=400)
    parser.add_argument(
        "--cells",
        type=int,
        default=10_000,
        help="cells holding results (the same at every size, so only history grows)",
    )
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "out" / "matrix_page.json")
    )
    args = parser.parse_args()

    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    if not url.startswith("postgres"):
        raise SystemExit("this benchmark needs PostgreSQL (COPY): set DATABASE_URL")
    if "bench" not in url.rsplit("/", 1)[1]:
        # The run empties the catalogue tables first.
        raise SystemExit("refusing a database whose name lacks 'bench': it is emptied")
    ensure_database(url)
    setup_django(url)
    install_baseline_url()
    from django.test import Client, override_settings

    reset()
    cat = catalogue(args.device_types, args.shapes_per_operator)
    client = Client()
    viewer_login(client)
    runs = []
    for size in args.sizes:
        loaded = fill(cat, size, min(args.cells, size))
        row = {"results": size, **loaded, "load_average": os.getloadavg()}
        for label, path, n, cache_s in (
            ("matrix", "/", args.requests, 300),
            ("matrix-nocache", "/", args.requests, 0),
            ("matrix+open", "/?open=gemm", args.requests, 300),
            ("naive", "/naive/", args.naive_requests, 0),
        ):
            with override_settings(TILEMATRIX_MATRIX_CACHE_S=cache_s):
                row[label] = time_page(client, path, n)
        runs.append(row)
        print(
            f"loaded {size:,} results in {loaded['load_s']} s; load average "
            f"{row['load_average'][0]:.1f} when timing began",
            file=sys.stderr,
        )

    base = runs[0]["matrix"]["p95_ms"]
    base_nocache = runs[0]["matrix-nocache"]["p95_ms"]
    report = {
        "catalogue": {
            "device_types": args.device_types,
            "shape_rows": args.shapes_per_operator * len(OPERATORS),
            "cells": args.cells,
        },
        "requests": args.requests,
        "runs": runs,
        "p95_ratio_largest_vs_smallest": round(runs[-1]["matrix"]["p95_ms"] / base, 2),
        "p95_ratio_nocache_largest_vs_smallest": round(
            runs[-1]["matrix-nocache"]["p95_ms"] / base_nocache, 2
        ),
        "load_average_at_end": os.getloadavg(),
        "database": url.rsplit("@", 1)[-1],
        "session_cache": os.environ.get("TILEMATRIX_SESSION_CACHE_URL") or None,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    print(
        f"{'results':>10} {'page':<12} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} "
        f"{'queries':>7} {'KiB':>6}"
    )
    for row in runs:
        for label in ("matrix", "matrix-nocache", "matrix+open", "naive"):
            r = row[label]
            print(
                f"{row['results']:>10,} {label:<12} {r['p50_ms']:>8} {r['p95_ms']:>8} "
                f"{r['max_ms']:>8} {r['queries']:>7} {r['bytes'] // 1024:>6}"
            )
    print(
        f"matrix p95 ratio, largest / smallest: {report['p95_ratio_largest_vs_smallest']}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
