"""Gaps page, its CSV and GET /api/v1/gaps on a catalogue of the size issue
21 measured at 1M results: 15 device types, 2,672 shapes of which 616 are
served, about 31,000 cells on the current toolchain (every served cell of
the catalogue has one, three in ten of them passing) and as many on each of
two older toolchains, with history behind them, an open sweep of 2,000 jobs
and one online runner (the CPU column, nvcc too).

Fills a PostgreSQL database with COPY (DATABASE_URL, else
postgres://postgres@127.0.0.1:5432/tilematrix_bench_gaps; a database whose
name lacks 'bench' is refused unless --empty-ok: the run empties it), then
times with Django's test Client in this process, signed in as a reviewer
(so the page plans Run missing and shows its preview):

- ``gaps``: the page's first page (100 rows), viewed again at the same
  data version (counts and rows from the cache),
- ``gaps-last``: its last page,
- ``gaps-new``: the first page at a new data version each request, as
  after a stored result: its counts and rows read from the database,
- ``gaps-cold``: the first page with the job durations' cache emptied
  before each request,
- ``api``: GET /api/v1/gaps?limit=100, and ``api-next``: its next page by
  cursor,
- ``csv``: the whole list as CSV (every gap, streamed).

Prints a table and writes bench/out/gaps_page.json.

    .venv/bin/python bench/gaps_page.py [--requests 100] [--results 200000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from matrix_page import (  # noqa: E402
    ROOT,
    ensure_database,
    setup_django,
    table,
    time_page,
)

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/tilematrix_bench_gaps"
OPERATORS = {
    "gemm": ["M", "N", "K"],
    "rmsnorm": ["M", "N"],
    "softmax": ["M", "N"],
    "row_sum": ["M", "N"],
    "elementwise_add": ["M", "N"],
    "attention_fwd": ["B", "H", "S", "D"],
    "layernorm": ["M", "N"],
    "silu_mul": ["M", "N"],
}
BACKENDS = ["cuda", "cuda", "cuda", "hip", "hip", "c", "metal", "npu"]
DTYPES = ["float16", "bfloat16", "float32"]
STATUS_MIX = [
    ("pass", 30),
    ("lowered", 25),
    ("built", 5),
    ("compile_error", 15),
    ("mismatch", 5),
    ("unsupported", 10),
    ("timeout", 2),
]


def reset() -> None:
    from django.db import connection

    from matrix.fleet.models import Runner
    from matrix.models import Cell, DeviceType, Operator, Result, Sweep, Toolchain

    names = ", ".join(
        table(m) for m in (Cell, Result, Operator, DeviceType, Toolchain, Sweep, Runner)
    )
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def catalogue(device_types: int, shapes: int, served: int) -> dict:
    from matrix.models import (
        Backend,
        DeviceType,
        KernelRevision,
        Operator,
        Shape,
        Toolchain,
        dims_key,
    )
    from matrix.revisions import make_current

    rng = random.Random(7)
    DeviceType.objects.bulk_create(
        DeviceType(
            vendor=f"Vendor{i % 5}",
            model=f"Model-{i:02d}",
            arch=f"arch{i}",
            backend=BACKENDS[i % len(BACKENDS)],
        )
        for i in range(device_types)
    )
    revisions, rows = {}, []
    per_operator = shapes // len(OPERATORS)
    for name, dims in OPERATORS.items():
        op = Operator.objects.create(name=name, dims=dims)
        old, current = (
            KernelRevision.objects.create(
                operator=op,
                source_sha256=hashlib.sha256(f"{name}-{v}".encode()).hexdigest(),
                origin="library",
                review_state="approved",
            )
            for v in ("old", "new")
        )
        make_current(current, Backend.values)
        revisions[op.pk] = (current.pk, old.pk)
        for i in range(per_operator):
            values = {d: 2 ** (4 + (i * (j + 3)) % 9) + i for j, d in enumerate(dims)}
            rows.append(
                Shape(
                    operator=op,
                    dims=values,
                    dims_key=dims_key(values),
                    dtype=DTYPES[i % 3],
                )
            )
    Shape.objects.bulk_create(rows)
    served_ids = rng.sample(list(Shape.objects.values_list("id", flat=True)), served)
    served_shapes = list(Shape.objects.filter(pk__in=served_ids))
    for shape in served_shapes:
        shape.served, shape.weight = True, rng.uniform(0.01, 100)
    Shape.objects.bulk_update(served_shapes, ["served", "weight"])
    now = datetime.now(UTC)
    Toolchain.objects.bulk_create(
        Toolchain(
            name=f"tl-0.1.{v}",
            tilelang_version=f"0.1.{v}",
            fingerprint=f"{v:x}" * 64 if v < 16 else "f" * 64,
            is_current=v == 15,
            created_at=now,
        )
        for v in (11, 13, 15)
    )
    return {
        "shapes": list(Shape.objects.values_list("id", "operator_id", "served")),
        "device_types": list(DeviceType.objects.values_list("id", "backend")),
        "toolchains": list(
            Toolchain.objects.order_by("pk").values_list("id", flat=True)
        ),
        "current": Toolchain.objects.get(is_current=True).pk,
        "revisions": revisions,
    }


def fill(cat: dict, results: int, cells_per_toolchain: int) -> dict:
    """Cells on every toolchain (every served one of the catalogue first),
    results behind them (``results`` in all), and one Cell per cell at its
    newest result; then an open sweep of 2,000 jobs and an online runner."""
    from django.db import connection

    from matrix.models import Blob, Cell, Result, Sweep, ValidationJob

    rng = random.Random(11)
    served = [(s, op) for s, op, is_served in cat["shapes"] if is_served]
    others = [(s, op) for s, op, is_served in cat["shapes"] if not is_served]
    pairs = []
    for tc in cat["toolchains"]:
        chosen = [(s, op, d, tc) for s, op in served for d, _ in cat["device_types"]]
        rest = [(s, op, d, tc) for s, op in others for d, _ in cat["device_types"]]
        chosen += rng.sample(rest, max(0, cells_per_toolchain - len(chosen)))
        pairs += chosen
    statuses = [s for s, w in STATUS_MIX for _ in range(w)]
    start = datetime.now(UTC) - timedelta(days=200)
    step = timedelta(days=200) / results
    job_cols = (
        "id, revision_id, shape_id, device_type_id, toolchain_id, stage, state, "
        "attempt, seed, queue, created_at, started_at, finished_at"
    )
    result_cols = (
        "id, job_id, attempt, revision_id, shape_id, device_type_id, toolchain_id, "
        "status, stage_reached, compile_s, wall_s, kernel_ms, reference_ms, "
        "error_signature, source_id, error_id, fingerprint, details, created_at"
    )
    # Every result's generated source is one text, stored once, as are the
    # 40 errors' messages.
    source = Blob.stored("x" * 5000)
    errors = {f"sig{n:02d}": Blob.stored(f"error sig{n:02d}") for n in range(40)}
    latest = {}
    t0 = time.perf_counter()
    raw = connection.connection
    with raw.cursor() as cur:
        # History first (older revisions, on cells drawn at random), then
        # each cell's newest result, a tenth of them on an older revision.
        history = results - len(pairs)
        if history < 0:
            raise SystemExit(f"--results must be at least the {len(pairs)} cells")
        rows = []
        for i in range(results):
            if i < history:
                shape, op, dt, tc = pairs[(i * 7919) % len(pairs)]
            else:
                shape, op, dt, tc = pairs[i - history]
            current, old = cat["revisions"][op]
            rev = old if i < history or i % 10 == 0 else current
            status = statuses[(i * 7919) % len(statuses)]
            stage = "validate" if status in ("pass", "mismatch") else "lower"
            rows.append((i + 1, rev, shape, dt, tc, stage, status, start + step * i))
        with cur.copy(f"COPY {table(ValidationJob)} ({job_cols}) FROM STDIN") as copy:
            for pk, rev, shape, dt, tc, stage, _, when in rows:
                copy.write_row(
                    (pk, rev, shape, dt, tc, stage, "done", 1, 0, "", when, when, when)
                )
        with cur.copy(f"COPY {table(Result)} ({result_cols}) FROM STDIN") as copy:
            for pk, rev, shape, dt, tc, stage, status, when in rows:
                sig = (
                    f"sig{pk % 40:02d}"
                    if status in ("compile_error", "mismatch")
                    else ""
                )
                seconds = 2.0 + pk % 7 if stage == "lower" else 8.0 + pk % 11
                copy.write_row(
                    (
                        pk, pk, 1, rev, shape, dt, tc, status, stage, seconds,
                        seconds, 0.1, 0.13, sig, source.pk,
                        errors[sig].pk if sig else None, "b" * 64, "{}", when,
                    )
                )  # fmt: skip
                latest[shape, dt, tc] = (pk, rev, status, sig, when)
        with cur.copy(
            f"COPY {table(Cell)} (shape_id, device_type_id, toolchain_id, revision_id, "
            "result_id, status, error_signature, kernel_ms, reference_ms, updated_at) "
            "FROM STDIN"
        ) as copy:
            for (shape, dt, tc), (pk, rev, status, sig, when) in latest.items():
                copy.write_row((shape, dt, tc, rev, pk, status, sig, 0.1, 0.13, when))
        for model in (ValidationJob, Result):
            cur.execute(
                f"SELECT setval(pg_get_serial_sequence('{table(model)}', 'id'), "
                f"(SELECT coalesce(max(id), 1) FROM {table(model)}))"
            )
    raw.commit()
    # An open sweep on the current toolchain: 2,000 queued jobs for served
    # cells never run there.
    sweep = Sweep.objects.create(total=2000)
    have = {(s, d) for s, d, tc in latest if tc == cat["current"]}
    todo = [
        (s, op, d)
        for s, op in others
        for d, _ in cat["device_types"]
        if (s, d) not in have
    ][:2000]
    ValidationJob.objects.bulk_create(
        ValidationJob(
            revision_id=cat["revisions"][op][0],
            shape_id=s,
            device_type_id=d,
            toolchain_id=cat["current"],
            sweep=sweep,
            queue="compile.tc0",
        )
        for s, op, d in todo
    )
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
        cur.execute("CHECKPOINT")
    return {
        "load_s": round(time.perf_counter() - t0, 1),
        "cells": len(latest),
        "current_cells": len(have),
    }


def runner_online(cat: dict) -> None:
    from django.utils import timezone

    from matrix.fleet.models import Runner, RunnerToolchain

    runner = Runner.objects.create(
        name="bench-cpu",
        public_key="cd" * 32,
        state=Runner.State.ONLINE,
        last_heartbeat=timezone.now(),
        inventory={"nvcc": True},
    )
    runner.device_types.set([d for d, backend in cat["device_types"] if backend == "c"])
    RunnerToolchain.objects.create(
        runner=runner, toolchain_id=cat["current"], interpreter="/usr/bin/python3"
    )


def reviewer_login(client) -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    user, _ = get_user_model().objects.get_or_create(username="bench-reviewer")
    user.groups.add(Group.objects.get(name="reviewer"))
    client.force_login(user)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--results", type=int, default=200_000)
    parser.add_argument("--device-types", type=int, default=15)
    parser.add_argument("--shapes", type=int, default=2672)
    parser.add_argument("--served", type=int, default=616)
    parser.add_argument("--cells-per-toolchain", type=int, default=31_000)
    parser.add_argument("--empty-ok", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "gaps_page.json"))
    args = parser.parse_args()

    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    if not url.startswith("postgres"):
        raise SystemExit("this benchmark needs PostgreSQL (COPY): set DATABASE_URL")
    if "bench" not in url.rsplit("/", 1)[1] and not args.empty_ok:
        raise SystemExit("refusing a database whose name lacks 'bench': it is emptied")
    ensure_database(url)
    setup_django(url)
    from django.core.cache import cache
    from django.test import Client

    reset()
    cat = catalogue(args.device_types, args.shapes, args.served)
    loaded = fill(cat, args.results, args.cells_per_toolchain)
    runner_online(cat)
    client = Client()
    reviewer_login(client)
    api = client.get("/api/v1/gaps?limit=100").json()
    last_page = -(-api["count"] // 100)
    row = {
        "results": args.results,
        **loaded,
        "gap_count": api["count"],
        "run_missing_jobs": api["runnable"],
    }

    class ColdDurations:
        """Empties the job durations' cache before every request."""

        def __init__(self, client):
            self.client = client

        def get(self, url):
            cache.delete("gaps:job-durations")
            return self.client.get(url)

    class NewResult:
        """A new data version before every request, as after a stored
        result: the counts and the page are read from the database again."""

        def __init__(self, client):
            self.client = client
            self.version = 0

        def get(self, url):
            from matrix import gaps

            self.version += 1
            with mock.patch.object(gaps, "gaps_version", lambda: (self.version,)):
                return self.client.get(url)

    for label, who, path in (
        ("gaps", client, "/gaps/"),
        ("gaps-last", client, f"/gaps/?page={last_page}"),
        ("gaps-new", NewResult(client), "/gaps/"),
        ("gaps-cold", ColdDurations(client), "/gaps/"),
        ("api", client, "/api/v1/gaps?limit=100"),
        ("api-next", client, api["next"].split("testserver", 1)[1]),
    ):
        row[label] = time_page(who, path, args.requests)
    # Streamed: timed until its last byte.
    samples = []
    for _ in range(max(5, args.requests // 10)):
        t0 = time.perf_counter()
        body = b"".join(client.get("/gaps.csv").streaming_content)
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    row["csv"] = {
        "p50_ms": round(samples[len(samples) // 2], 2),
        "p95_ms": round(samples[int(0.95 * (len(samples) - 1))], 2),
        "max_ms": round(samples[-1], 2),
        "queries": "",
        "bytes": len(body),
    }
    report = {
        "catalogue": {
            "device_types": args.device_types,
            "shapes": args.shapes,
            "served": args.served,
            "toolchains": len(cat["toolchains"]),
        },
        "requests": args.requests,
        "run": row,
        "load_average_at_end": os.getloadavg(),
        "database": url.rsplit("@", 1)[-1],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{row['results']:,} results, {row['cells']:,} cells "
        f"({row['current_cells']:,} on the current toolchain), {row['gap_count']:,} gaps, "
        f"Run missing plans {row['run_missing_jobs']:,} jobs"
    )
    print(
        f"{'page':<10} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'queries':>7} {'KiB':>6}"
    )
    for label in (
        "gaps",
        "gaps-last",
        "gaps-new",
        "gaps-cold",
        "api",
        "api-next",
        "csv",
    ):
        r = row[label]
        print(
            f"{label:<10} {r['p50_ms']:>8} {r['p95_ms']:>8} {r['max_ms']:>8} "
            f"{r['queries']:>7} {r['bytes'] // 1024:>6}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
