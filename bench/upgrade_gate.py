"""The upgrade gate at scale: an open proposal over a large matrix, its
background re-evaluation, its page, and ingest while it is open.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME \\
        .venv/bin/python bench/upgrade_gate.py [--shapes 2600] [--history 3]

The database NAME is emptied (its public schema dropped) and filled: the
demo's device types and 11 more (15), ``--shapes`` shapes (a quarter served),
two toolchains with a result for every cell and ``--history`` results a cell
(each pointing at one 5 KB kernel source, stored once as ingest stores it;
each operator's revision with 20 KB of source), 1% of the candidate's served
cells failing;
then one proposal over every device type. Timed: opening it (the diff
computed and stored at once), the background re-evaluation with nothing new
and after 1,000 new results, the proposal page (p50/p95 of 30 requests, its
HTML size, its queries, and the process's peak memory), and ingest in real
message sizes (20 results) with and without the open proposal.
Prints a table and writes var/bench/upgrade_gate.json. Goals (issue 21):
the page at most 200 ms, paged; ingest as fast with the proposal open.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE_GOAL_MS = 200
REQUESTS = 30
MESSAGE = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=2600)
    parser.add_argument("--history", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument(
        "--out", default=str(REPO / "var" / "bench" / "upgrade_gate.json")
    )
    args = parser.parse_args()
    database = os.environ.get("DATABASE_URL", "")
    if not database.startswith(("postgres", "pgsql")):
        raise SystemExit("DATABASE_URL must name a PostgreSQL database to empty")
    setup(database)
    load = [os.getloadavg()[0]]

    from matrix.gate.services import proposal_open, proposal_reevaluate_requested
    from matrix.models.gate import UpgradeProposal

    world = fill(args.shapes, args.history)
    rows = [("results", "", world["results"]), ("cells", "", world["cells"])]

    started = time.perf_counter()
    proposal = proposal_open(
        baseline=world["old"],
        candidate=world["new"],
        device_types=world["device_types"],
        by=world["owner"],
    )
    rows.append(("open: diff computed and stored", "s", lap(started)))
    rows.append(("diff rows", "", proposal.diff_rows.count()))

    mark(proposal)
    started = time.perf_counter()
    proposal_reevaluate_requested(proposal_id=proposal.pk)
    rows.append(("re-evaluation, nothing new", "s", lap(started)))

    without, with_open = ingest_rates(world, args.messages)
    rows.append((f"ingest without the proposal ({MESSAGE} a message)", "/s", without))
    rows.append((f"ingest with it open ({MESSAGE} a message)", "/s", with_open))
    UpgradeProposal.objects.filter(pk=proposal.pk).update(
        reevaluation_requested_at=None
    )
    mark(proposal)
    started = time.perf_counter()
    proposal_reevaluate_requested(proposal_id=proposal.pk)
    rows.append(
        (f"re-evaluation after {args.messages * MESSAGE} results", "s", lap(started))
    )

    page = page_times(proposal, world["reviewer"])
    rows += [
        ("page p50", "ms", page["p50_ms"]),
        ("page p95", "ms", page["p95_ms"]),
        ("page, CPU time of this process", "ms", page["cpu_ms"]),
        ("page, blocking cells, p95", "ms", page["blocking_p95_ms"]),
        ("page, last page of cells, p95", "ms", page["last_p95_ms"]),
        ("page HTML", "KB", page["html_kb"]),
        ("page queries", "", page["queries"]),
        (f"memory grown over {3 * REQUESTS} pages", "MB", page["grown_mb"]),
    ]
    load.append(os.getloadavg()[0])
    rows.append(("load average at start, end", "", f"{load[0]:.1f}, {load[1]:.1f}"))
    width = max(len(r[0]) for r in rows)
    for name, unit, value in rows:
        print(f"{name:<{width}}  {value} {unit}".rstrip())
    ok = page["p95_ms"] <= PAGE_GOAL_MS and with_open >= 0.5 * without
    print(
        f"goal: page p95 <= {PAGE_GOAL_MS} ms, ingest unhurt: {'met' if ok else 'NOT met'}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "shapes": args.shapes,
                "history": args.history,
                "rows": [{"what": n, "unit": u, "value": v} for n, u, v in rows],
                "page_goal_ms": PAGE_GOAL_MS,
                "ok": ok,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"written to {out}")


def lap(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def setup(database: str) -> None:
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    root = Path(os.environ.get("TILEMATRIX_VAR_DIR") or REPO / "var" / "bench-gate")
    root.mkdir(parents=True, exist_ok=True)
    os.environ["TILEMATRIX_VAR_DIR"] = str(root)
    os.environ.setdefault("TILEMATRIX_SERVER_KEY_FILE", str(root / "server.key"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
    # Production settings: no debug query log slowing every request down.
    os.environ.setdefault("DJANGO_DEBUG", "0")
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-" + "k3y!" * 16)
    os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
    os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "0")
    sys.path.insert(0, str(REPO))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    call_command("seed_demo", stdout=open(os.devnull, "w"))


def fill(shape_count: int, history: int) -> dict:
    """The matrix: every shape on every device type on both toolchains."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission
    from django.utils import timezone

    from matrix.fleet import services
    from matrix.models import (
        Blob,
        Cell,
        DeviceType,
        KernelRevision,
        Operator,
        Result,
        Shape,
        Status,
        ValidationJob,
        dims_key,
    )
    from matrix.services import toolchain_register
    from runners import signing

    for n in range(11):
        DeviceType.objects.get_or_create(
            vendor="Bench", model=f"GPU {n}", arch=f"sm_{80 + n}", backend="cuda"
        )
    device_types = list(DeviceType.objects.all())
    # Only the bench's shapes: the demo's served ones have no results here.
    Shape.objects.all().delete()
    KernelRevision.objects.filter(is_current=True).update(source="x" * 20_000)
    gemm = Operator.objects.get(name="gemm")
    revision = gemm.current_revision("c")
    Shape.objects.bulk_create(
        [
            Shape(
                operator=gemm,
                dims=dims,
                dims_key=dims_key(dims),
                dtype="float16",
                served=n % 4 == 0,
                weight=float(n % 7),
                source_profile="bench",
            )
            for n in range(shape_count)
            for dims in [{"M": 1 + n, "N": 4096, "K": 4096}]
        ],
        batch_size=2000,
    )
    shapes = list(Shape.objects.filter(source_profile="bench"))
    old = toolchain_register(name="bench-0.1.13", components={"tilelang": "0.1.13"})
    key = Ed25519PrivateKey.generate()
    runner = services.runner_register(
        token=services.token_create(expires=timedelta(hours=1)),
        name="bench-runner",
        public_key=signing.public_key_hex(key),
        inventory={
            "devices": [
                {"vendor": "x86-64", "model": "CPU", "arch": "", "backend": "c"}
            ],
            "toolchains": [
                {
                    "name": "bench-0.1.15",
                    "interpreter": "/usr/bin/python3",
                    "components": {"tilelang": "0.1.15"},
                }
            ],
        },
    )
    # A registered runner is pending: its toolchain is a row once approved.
    runner = services.runner_approve(name=runner.name)
    new = runner.toolchains.get()
    # One generated source for every result and one error message, each
    # stored once, as ingest stores them.
    source = Blob.stored("// kernel\n" + "x" * 5_000)
    error = Blob.stored("error: no")
    now = timezone.now()
    results = cells = 0
    for toolchain in (old, new):
        batch_jobs, batch_results, batch_cells = [], [], []
        for i, shape in enumerate(shapes):
            for j, dt in enumerate(device_types):
                failing = toolchain is new and shape.served and (i * 15 + j) % 100 == 0
                status = Status.COMPILE_ERROR if failing else Status.PASS
                for h in range(history):
                    batch_jobs.append(
                        ValidationJob(
                            revision=revision,
                            shape=shape,
                            device_type=dt,
                            toolchain=toolchain,
                            state="done",
                            seed=h,
                        )
                    )
                    batch_results.append(
                        dict(
                            status=status,
                            kernel_ms=None if failing else 1.0 + 0.01 * h,
                            reference_ms=None if failing else 1.1,
                            error=error if failing else None,
                            source=source,
                        )
                    )
            if len(batch_jobs) >= 6000 or i == len(shapes) - 1:
                jobs = ValidationJob.objects.bulk_create(batch_jobs)
                rows = Result.objects.bulk_create(
                    [
                        Result(
                            job=job,
                            attempt=1,
                            revision=revision,
                            shape_id=job.shape_id,
                            device_type_id=job.device_type_id,
                            toolchain=toolchain,
                            fingerprint=toolchain.fingerprint,
                            **fields,
                        )
                        for job, fields in zip(jobs, batch_results, strict=True)
                    ]
                )
                results += len(rows)
                for r in rows[history - 1 :: history]:
                    batch_cells.append(
                        Cell(
                            shape_id=r.shape_id,
                            device_type_id=r.device_type_id,
                            toolchain=toolchain,
                            revision=revision,
                            result=r,
                            status=r.status,
                            kernel_ms=r.kernel_ms,
                            reference_ms=r.reference_ms,
                            updated_at=now,
                        )
                    )
                Cell.objects.bulk_create(batch_cells)
                cells += len(batch_cells)
                batch_jobs, batch_results, batch_cells = [], [], []
    User = get_user_model()
    owner = User.objects.create_user("bench-owner")
    owner.user_permissions.add(Permission.objects.get(codename="propose_upgrade"))
    reviewer = User.objects.create_user("bench-reviewer")
    reviewer.groups.add(Group.objects.get(name="reviewer"))
    outside = DeviceType.objects.create(vendor="Elsewhere", model="X", backend="hip")
    runner.device_types.add(outside, DeviceType.objects.get(backend="c"))
    return {
        "old": old,
        "new": new,
        "device_types": device_types,
        "owner": owner,
        "reviewer": reviewer,
        "runner": runner,
        "key": key,
        "revision": revision,
        "shapes": shapes,
        "outside": outside,
        "inside": DeviceType.objects.get(backend="c"),
        "results": results,
        "cells": cells,
    }


def mark(proposal) -> None:
    from django.utils import timezone

    from matrix.models.gate import UpgradeProposal

    UpgradeProposal.objects.filter(pk=proposal.pk).update(
        reevaluation_requested_at=timezone.now()
    )


def ingest_rates(world: dict, messages: int) -> tuple[int, int]:
    """Results a second through results_ingest, one message of MESSAGE
    signed results at a time, as the control worker stores them: on a
    device type no proposal covers, and on one the open proposal covers,
    message by message in turn, so both meet the same load on the host."""
    from django.utils import timezone

    from matrix.fleet import services
    from matrix.models import ValidationJob

    result = {
        "status": "pass",
        "stage_reached": "validate",
        "metrics": {"rel_err": 1e-7, "max_abs_err": 2e-7, "mismatch_ratio": 0.0},
        "timings": {"compile_s": 1.2, "kernel_ms": 0.9, "reference_ms": 1.1},
        "error": None,
        "fingerprint": {"hash": "f" * 64, "components": {"tilelang": "0.1.15"}},
        "kernel_source": "// kernel\n" + "x" * 5_000,
    }

    def envelopes(device_type) -> list:
        from runners import protocol

        jobs = ValidationJob.objects.bulk_create(
            ValidationJob(
                revision=world["revision"],
                shape=shape,
                device_type=device_type,
                toolchain=world["new"],
                state="running",
                runner=world["runner"],
                started_at=timezone.now(),
                seed=7,
            )
            for shape in world["shapes"][: messages * MESSAGE]
        )
        return [
            protocol.result_envelope(
                job={"job": job.pk, "attempt": job.attempt},
                result=result,
                runner_name=world["runner"].name,
                key=world["key"],
            )
            for job in jobs
        ]

    sides = {
        "outside": envelopes(world["outside"]),
        "inside": envelopes(world["inside"]),
    }
    spent = {"outside": 0.0, "inside": 0.0}
    for i in range(0, messages * MESSAGE, MESSAGE):
        for side, signed in sides.items():
            started = time.perf_counter()
            outcomes = services.results_ingest(envelopes=signed[i : i + MESSAGE])
            spent[side] += time.perf_counter() - started
            assert all(o.status == "stored" for o in outcomes), outcomes
    total = messages * MESSAGE
    return round(total / spent["outside"]), round(total / spent["inside"])


def page_times(proposal, reviewer) -> dict:
    from django.db import connection
    from django.test import Client

    client = Client()
    client.force_login(reviewer)
    url = f"/upgrades/{proposal.pk}/"
    client.get(url)  # warm: templates compiled, caches filled
    before = rss_mb()

    def p95(query: dict) -> tuple[list[float], bytes]:
        times = []
        for _ in range(REQUESTS):
            started = time.perf_counter()
            response = client.get(url, query)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        return times, response.content

    cpu = time.process_time()
    times, body = p95({})
    cpu_ms = (time.process_time() - cpu) * 1000 / REQUESTS
    queries = []

    def counted(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        client.get(url)
    blocking, _ = p95({"blocking": "1"})
    last, _ = p95({"last": "1"})
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(statistics.quantiles(times, n=20)[-1], 1),
        "blocking_p95_ms": round(statistics.quantiles(blocking, n=20)[-1], 1),
        "last_p95_ms": round(statistics.quantiles(last, n=20)[-1], 1),
        "cpu_ms": round(cpu_ms, 1),
        "html_kb": round(len(body) / 1024, 1),
        "queries": len(queries),
        "grown_mb": round(rss_mb() - before, 1),
    }


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


if __name__ == "__main__":
    main()
