"""Ingest: signed results stored through the real ingest path (signature,
runner identity, assignment, replay and idempotency checks, Result +
Receipt rows, job state, cell upsert), beside a raw COPY of the same rows.
Target: >= 3,000 results/s into PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/ingest.py [--results 10000] [--batch 500]

Rows: "batched" is ``results_ingest`` on batches of --batch in --workers
processes side by side, as control worker processes ingest the
``runners.ingest_result`` messages (one per job message, 5-25 results) and
``POST /api/v1/results`` bundles; "one by one" is ``result_ingest`` per
envelope, one transaction each.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import time
from datetime import timedelta
from pathlib import Path

from _scratch import REPO, scratch_setup, table

TARGET_PER_S = 3000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=10_000)
    parser.add_argument(
        "--single", type=int, default=1_000, help="results ingested one by one"
    )
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes ingesting side by side, as the control worker's "
        "(default: one per core)",
    )
    parser.add_argument("--out", default=str(REPO / "var" / "bench" / "ingest.json"))
    args = parser.parse_args()
    kinds = scratch_setup()

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from django.db import connection, connections
    from django.utils import timezone

    from matrix.models import DeviceType, JobState, Result, ValidationJob
    from matrix.services import shape_import
    from runners import services, signing
    from runners.models import Runner

    total = args.results + args.single
    per_shape = DeviceType.objects.count()
    shape_import(
        rows=[
            ("elementwise_add", {"M": m, "N": 64}, "float32", 0.0)
            for m in range(1, -(-total // per_shape) + 1)
        ],
        source_profile="bench",
        served=False,
    )
    key = Ed25519PrivateKey.generate()
    runner = services.runner_register(
        token=services.token_create(expires=timedelta(hours=1)),
        name="bench-cpu",
        public_key=signing.public_key_hex(key),
        inventory={
            "devices": [
                {"vendor": "x86-64", "model": "CPU", "arch": "", "backend": "c"}
            ],
            "toolchains": [
                {
                    "name": "bench-toolchain",
                    "interpreter": "/usr/bin/python3",
                    "components": {"tilelang": "0.1.15", "python": "CPython 3.11"},
                }
            ],
        },
    )
    services.runner_approve(name=runner.name)
    cells = services.cells_select(
        operator="elementwise_add", toolchain="bench-toolchain"
    )
    sweep = services.sweep_plan(cells=cells[:total])
    # Every job claimed by the runner, as its worker would have.
    ValidationJob.objects.filter(sweep=sweep).update(
        state=JobState.RUNNING, runner=runner, started_at=timezone.now()
    )
    jobs = list(ValidationJob.objects.filter(sweep=sweep).order_by("pk"))
    passed = {
        "status": "pass",
        "stage_reached": "validate",
        "metrics": {"rel_err": 1e-7, "max_abs_err": 2e-7, "mismatch_ratio": 0.0},
        "timings": {"compile_s": 1.2, "kernel_ms": 0.02, "reference_ms": 0.01},
        "error": None,
        "fingerprint": {"hash": "f" * 64, "components": {"tilelang": "0.1.15"}},
    }
    # The runner is offline, so the planner made every job compile-only:
    # what such a job ends in (ingest refuses a pass from it).
    lowered = {
        **passed,
        "status": "lowered",
        "stage_reached": "lower",
        "metrics": None,
        "timings": {"compile_s": 1.2},
    }
    envelopes = [
        services.result_envelope(
            job={"job": j.pk, "attempt": j.attempt},
            result=passed if j.stage == "validate" else lowered,
            runner_name=runner.name,
            key=key,
        )
        for j in jobs
    ]
    batched, single = envelopes[: args.results], envelopes[args.results :]

    per_worker = -(-len(batched) // args.workers)
    slices = [batched[i : i + per_worker] for i in range(0, len(batched), per_worker)]
    connections.close_all()  # each worker process opens its own
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(len(slices)) as pool:
        stored = sum(pool.starmap(ingest_slice, [(s, args.batch) for s in slices]))
    batched_s = time.perf_counter() - started

    started = time.perf_counter()
    for envelope in single:
        services.result_ingest(envelope=envelope)
    single_s = time.perf_counter() - started

    assert stored == len(batched), f"only {stored} of {len(batched)} stored"
    assert Result.objects.count() == total
    assert Runner.objects.get().receipts.count() == total

    copy_s = raw_copy_s(connection) if connection.vendor == "postgresql" else None
    rows = [
        (
            f"batched (results_ingest, {args.workers} processes)",
            len(batched),
            round(batched_s, 3),
            round(len(batched) / batched_s),
        ),
        (
            "one by one (result_ingest)",
            len(single),
            round(single_s, 3),
            round(len(single) / single_s),
        ),
    ]
    if copy_s is not None:
        rows.append(
            ("raw COPY, same rows", total, round(copy_s, 3), round(total / copy_s))
        )
    print(f"database {kinds['database']}, target {TARGET_PER_S} results/s")
    print(table(rows, ("path", "results", "seconds", "results/s")))
    report = {
        "database": kinds["database"],
        "target_per_s": TARGET_PER_S,
        "rows": [
            dict(zip(("path", "results", "seconds", "per_s"), r, strict=True))
            for r in rows
        ],
        "ok": kinds["database"] == "postgresql" and rows[0][3] >= TARGET_PER_S,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


def ingest_slice(envelopes: list, batch: int) -> int:
    """One control worker's share: batches through results_ingest."""
    from django.db import connections

    from runners import services

    stored = 0
    for i in range(0, len(envelopes), batch):
        outcomes = services.results_ingest(envelopes=envelopes[i : i + batch])
        stored += sum(o.status == "stored" for o in outcomes)
    connections.close_all()
    return stored


def raw_copy_s(connection) -> float:
    """COPY the stored result rows into an empty table of the same shape:
    the floor the database itself sets."""
    from matrix.models import Result

    columns = [f.column for f in Result._meta.concrete_fields if f.column != "id"]
    names = ", ".join(columns)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {names} FROM matrix_result")
        rows = cursor.fetchall()
    buffer = io.StringIO()
    for row in rows:
        buffer.write("\t".join(copy_text(v) for v in row) + "\n")
    data = buffer.getvalue()
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE copy_target (LIKE matrix_result INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING INDEXES)"
        )
        started = time.perf_counter()
        with cursor.copy(f"COPY copy_target ({names}) FROM STDIN") as copy:
            copy.write(data)
        elapsed = time.perf_counter() - started
        cursor.execute("DROP TABLE copy_target")
    return elapsed


def copy_text(value) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, dict | list):
        value = json.dumps(value)
    return str(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


if __name__ == "__main__":
    main()
