"""Load and speed: every page and API read users meet, ingest, and 50 mixed
connections, on a realistic PostgreSQL database at 10k, 100k and 1M results.

    nice -n 10 .venv/bin/python bench/load.py --sizes 10k,100k,1m

Each size's database is seeded once by bench/load_seed.py (a template,
``h_bench_seed_<size>``, reused while its seed version matches) and copied
fresh for each run (``h_bench_<size>``), then migrated; ``BENCH_DB_PREFIX``
names them otherwise. The web app runs as
docs/deploy.md says production runs it (its gunicorn command, 3 sync
workers) with ``DJANGO_DEBUG=0``, sessions and the shared cache in Redis;
one bench-only flag is added, a long ``--timeout``, so a slow page is
measured rather than cut at gunicorn's default 30 s. Requests are signed in
through the login form and accept gzip, as browsers and HTTP libraries do
(a gzipped answer is unpacked inside the time measured).

Rows, p95 of ``--requests`` requests each (fewer where a row's time budget
runs out first; the count is printed):

- home from its cache; home on the first view after a new result (a result
  is ingested before each request); home with one operator open, from its
  cache and after a new result,
- gaps, the cell with the longest history, errors, the upgrade diff,
- the API's matrix, gaps and manifest, the matrix again with the ETag it
  got (304 where conditional requests are answered) and after a new result,
  the manifest again not compressed and of one device type (what a serving
  host reads),
- each page of the mix alone under wrk at saturation for ``--cost-s``
  seconds: what one request costs of the machine (its cores over the rate),
  so the rate the mix can reach is known page by page,
- ingest of signed results by a real control worker (``manage.py control
  work``, one process per core plus one, Redis as its broker), sent as
  runners send them in messages of 5 to 25 results, all at once as when a
  sweep ends, on cells outside the open proposal and on cells in it (every
  result with a kernel source of about 5 KB), beside COPY of the same rows
  into a real (logged) table, the median of five rounds,
- 50 connections (wrk) over a mix of those pages for ``--load-s`` seconds
  while results keep arriving, as during a sweep, and the same mix without
  the gaps (page and API) and the upgrade diff,
- the largest web worker's RSS after the diff page,
- with ``--parts ingest-scale`` (bench/load_ingest_scale.py): the same
  results stored by one control worker on one queue and by two on two
  ingest queues,
- with ``--parts steady`` (bench/load_steady.py): reads of generated
  addresses while the real control worker ingests a steady stream
  (``--steady-rate`` results a second), the manifest with its cache just
  emptied, the cache's hit rate, 50 connections, and ingest's rate and lag.

Prints the table and writes bench/out/load.json (and, per size,
bench/out/load-<size>.json; ``--evidence PATH`` a copy of the report). ``--compare BEFORE.json AFTER.json`` prints two
runs' p95 side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load_ingest_scale  # noqa: E402
import load_seed  # noqa: E402
import load_steady  # noqa: E402
from load_web import (  # noqa: E402
    Client,
    Gunicorn,
    gunicorn_command,
    mixed_load,
    page_costs,
    time_row,
)

ROOT = load_seed.ROOT
OUT = ROOT / "bench" / "out"
REDIS_DEFAULT = "redis://127.0.0.1:6379/8"
SECRET = "bench-load-" + "s3cr3t!k3y" * 5
PASSWORD = "bench-" + secrets.token_hex(8)
METRICS_TOKEN = "bench-metrics-" + secrets.token_hex(8)
# (key, label, goal text, goal in ms or None)
PAGE_ROWS = [
    ("home_cached", "home, from its cache", "keep", None),
    ("home_new_result", "home, first view after a new result", "≤ 50 ms", 50),
    ("home_open", "home, one operator open", "≤ 50 ms", 50),
    ("home_open_new_result", "home, operator open, after a result", "", None),
    ("gaps", "gaps", "≤ 50 ms", 50),
    ("cell", "cell (longest history)", "≤ 50 ms", 50),
    ("errors", "errors", "≤ 50 ms", 50),
    ("upgrade_diff", "upgrade diff", "≤ 200 ms", 200),
    ("api_matrix", "API matrix", "≤ 50 ms", 50),
    ("api_matrix_304", "API matrix, If-None-Match", "304", 50),
    ("api_matrix_new_result", "API matrix, after a new result", "", None),
    ("api_gaps", "API gaps", "≤ 50 ms", 50),
    ("api_manifest", "API manifest", "≤ 50 ms", 50),
    ("api_manifest_identity", "API manifest, not compressed", "", None),
    ("api_manifest_device", "API manifest, one device type", "", None),
]
# Rows whose body grows with the data (the manifest is 104 KB at 10k results
# and 2.8 MB at 1M): their time to the first byte is shown apart, to tell the
# server's part from the client's transfer and unpacking.
FIRST_BYTE_ROWS = ("api_manifest", "api_manifest_identity", "api_manifest_device")
# Pages of the mix timed again without them (bench/load.py's own rows).
SLOW_ELSEWHERE = ("gaps", "api_gaps", "upgrade_diff")
# Share of each page in the 50-connection mix.
MIX = [
    ("home_cached", 30),
    ("home_open", 10),
    ("gaps", 12),
    ("cell", 15),
    ("errors", 8),
    ("upgrade_diff", 3),
    ("api_matrix", 8),
    ("api_gaps", 8),
    ("api_manifest", 6),
]


# --- the parent: seeding, one child per size, the table ----------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10k,100k,1m")
    # A p95 of 30 is the second slowest of them: one stall of the shared
    # host moved a row by several ms from run to run. Of 100, the sixth.
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument(
        "--row-budget-s",
        type=float,
        default=120.0,
        help="at most this long timing one row (at least 3 requests)",
    )
    # A sweep's worth: 1,500 results were stored in under a second, and the
    # start and end of the worker's batches weighed on the rate.
    # A sweep's worth of results (the fan-out goal's 10k jobs): at 3,000 a row
    # lasted about a second, and the worker's start and last batch were a
    # large part of it.
    parser.add_argument("--ingest-results", type=int, default=10_000)
    parser.add_argument("--ingest-budget-s", type=float, default=90.0)
    parser.add_argument(
        "--parts",
        default="pages,cost,ingest,mixed",
        help="which parts to run (a comma list of pages, cost, ingest, mixed, "
        "steady: reads during steady ingest, bench/load_steady.py; "
        "ingest-scale: one ingest queue and two, bench/load_ingest_scale.py)",
    )
    parser.add_argument("--steady-rate", type=float, default=1000.0)
    parser.add_argument(
        "--steady-max-s",
        type=float,
        default=900.0,
        help="the stream stops when the part ends, or after this long",
    )
    parser.add_argument("--steady-requests", type=int, default=60)
    parser.add_argument(
        "--steady-pool",
        type=int,
        default=400,
        help="addresses generated per kind of read, drawn from by rank (Zipf)",
    )
    parser.add_argument("--steady-urls", type=int, default=3000)
    parser.add_argument("--steady-load-s", type=int, default=20)
    parser.add_argument("--steady-manifest-trials", type=int, default=8)
    parser.add_argument("--steady-seed", type=int, help="the URLs' (default: clock)")
    parser.add_argument(
        "--evidence",
        help="also write the report here (docs/evidence/<date>-....json)",
    )
    parser.add_argument(
        "--cost-s",
        type=int,
        default=8,
        help="seconds of wrk on each page of the mix alone (the cost part)",
    )
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--load-s", type=int, default=30)
    parser.add_argument("--server", default=load_seed.DEFAULT_SERVER)
    parser.add_argument(
        "--redis",
        default=os.environ.get("BENCH_REDIS_URL", REDIS_DEFAULT),
        help="a Redis database index of the bench's own: it is emptied",
    )
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument("--size", help=argparse.SUPPRESS)  # the child's own
    parser.add_argument("--out", default=str(OUT / "load.json"))
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        print_comparison(before, after)
        return
    # A stop (SIGTERM) unwinds, so each gunicorn started is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if args.size:
        print("SIZE " + json.dumps(run_size(args)), flush=True)
        return

    sizes = [s.strip().lower() for s in args.sizes.split(",") if s.strip()]
    for size in sizes:
        load_seed.size_of(size)
    report = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
        "gunicorn": gunicorn_command(),
        "requests_per_row": args.requests,
        "sizes": {},
    }
    for size in sizes:
        seeded = None if args.reseed else load_seed.seed_marker(args.server, size)
        if seeded is None:
            print(f"seeding {size} ...", file=sys.stderr, flush=True)
            seeded = load_seed.seed_in_child(args.server, size, child_env(args))
            seeded["seeded_now"] = True
        print(
            f"{size}: seeded {seeded['results']:,} results, {seeded['cells']:,} "
            f"cells (seeding took {seeded['seed_s']} s)",
            file=sys.stderr,
            flush=True,
        )
        run_name = load_seed.run_name(size)
        copy_s = load_seed.copy_database(
            args.server, load_seed.seed_name(size), run_name
        )
        child = subprocess.Popen(
            [sys.executable, __file__, *sys.argv[1:], "--size", size],
            cwd=ROOT,
            env=child_env(args),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            stdout, _ = child.communicate()
        finally:
            # Stopped early: the child stops its gunicorn on SIGTERM.
            if child.poll() is None:
                child.terminate()
                child.wait()
        line = next((x for x in stdout.splitlines() if x.startswith("SIZE ")), None)
        if child.returncode != 0 or line is None:
            raise SystemExit(f"the {size} run failed (exit {child.returncode})")
        measured = json.loads(line.removeprefix("SIZE "))
        measured["seed"] = seeded
        measured["database_copy_s"] = round(copy_s, 1)
        report["sizes"][size] = measured
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"load-{size}.json").write_text(json.dumps(measured, indent=2) + "\n")
    report["host"]["load_average_at_end"] = os.getloadavg()
    report["verdicts"] = verdicts(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.evidence:
        Path(args.evidence).write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    for size in sizes:
        if "steady" in report["sizes"][size]:
            load_steady.print_table(size, report["sizes"][size]["steady"])
        if "ingest_scale" in report["sizes"][size]:
            load_ingest_scale.print_table(size, report["sizes"][size]["ingest_scale"])
    print(f"wrote {args.out}")


def child_env(args) -> dict:
    return {
        **os.environ,
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": SECRET,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SECURE_SSL_REDIRECT": "0",
        "TILEMATRIX_ANONYMOUS_READ": "0",
        "TILEMATRIX_SESSION_CACHE_URL": args.redis,
        "TILEMATRIX_CACHE_URL": args.redis,
        "CELERY_BROKER_URL": args.redis,
        "TILEMATRIX_VAR_DIR": str(ROOT / "var" / "bench" / "var"),
        "TILEMATRIX_METRICS_TOKEN": METRICS_TOKEN,
    }


# --- the child: one size -------------------------------------------------------


def run_size(args) -> dict:
    url = load_seed.database_url(args.server, load_seed.run_name(args.size))
    redis_flush(args.redis)
    load_seed.django_setup(url)
    from django.core.management import call_command

    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    out = {"migrate_s": round(time.perf_counter() - started, 1)}
    fixture = Fixture()
    out["catalogue"] = fixture.describe()
    server = Gunicorn(os.environ)
    try:
        client = Client(server.port)
        client.login("bench-viewer", PASSWORD)
        paths = fixture.paths()
        out["paths"] = paths
        parts = set(args.parts.split(","))
        rows = {}
        for key, label, _, _ in PAGE_ROWS if "pages" in parts else ():
            before = None
            if key.endswith("new_result"):
                before = fixture.one_new_result
            headers = {}
            if key == "api_matrix_304":
                etag = client.get(paths["api_matrix"])[2].get("etag")
                headers = {"If-None-Match": etag} if etag else {}
            if key.endswith("_identity"):
                headers = {"Accept-Encoding": "identity"}
            rows[key] = time_row(
                client,
                paths[key],
                args.requests,
                args.row_budget_s,
                before=before,
                headers=headers,
            )
            if key == "upgrade_diff":
                out["worker_rss_mb_after_diff"] = server.worker_rss_mb()
            print(
                f"{args.size} {label}: p95 {rows[key]['p95_ms']} ms "
                f"({rows[key]['requests']} requests)",
                file=sys.stderr,
                flush=True,
            )
        out["pages"] = rows
        if "cost" in parts:
            out["cost"] = page_costs(
                client,
                paths,
                fixture,
                [key for key, _ in MIX],
                args.cost_s,
                server.port,
                os.cpu_count(),
            )
            for key, row in out["cost"].items():
                print(
                    f"{args.size} {key} alone: {row['requests_per_s']} requests/s, "
                    f"{row['machine_ms_per_request']} ms of the machine a request",
                    file=sys.stderr,
                    flush=True,
                )
        if "ingest" in parts:
            out["ingest"] = fixture.ingest_rows(
                args.ingest_results, args.ingest_budget_s
            )
            print(f"{args.size} ingest: {out['ingest']}", file=sys.stderr, flush=True)
        if "ingest-scale" in parts:
            out["ingest_scale"] = load_ingest_scale.run(
                fixture, ControlWorker, args.ingest_results, args.ingest_budget_s
            )
        if "mixed" in parts:
            out["drain_s_before_mixed"] = server.drain(client)
            out["mixed"] = mixed_load(
                client, paths, fixture, MIX, args.connections, args.load_s, server.port
            )
            # The same without the pages whose work is elsewhere (the gaps, in
            # the API too, and the upgrade diff), to tell what the rest costs.
            rest = [(key, share) for key, share in MIX if key not in SLOW_ELSEWHERE]
            out["drain_s_before_mixed_rest"] = server.drain(client)
            out["mixed_rest"] = mixed_load(
                client, paths, fixture, rest, args.connections, args.load_s, server.port
            )
        if "steady" in parts:
            out["drain_s_before_steady"] = server.drain(client)
            out["steady"] = load_steady.run(
                client,
                fixture,
                ControlWorker,
                server.port,
                args,
                # The parent's, which the web app was given.
                os.environ["TILEMATRIX_METRICS_TOKEN"],
            )
        out["worker_rss_mb_at_end"] = server.worker_rss_mb()
    finally:
        server.stop()
    out["gunicorn_log_tail"] = server.log_tail()
    out["load_average"] = os.getloadavg()
    return out


def redis_flush(url: str) -> None:
    """Empty the bench's own Redis database (never another index)."""
    import redis

    index = urllib.parse.urlsplit(url).path.strip("/") or "0"
    if index == "0":
        raise SystemExit("give the bench a Redis database index of its own, not 0")
    redis.Redis.from_url(url).flushdb()


class Fixture:
    """What the bench needs in the copied database: a viewer who signs in,
    a runner whose key signs results, and the paths of the pages timed."""

    def __init__(self):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import (
            Ed25519PrivateKey,
        )
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group

        from matrix.fleet.models import Runner
        from matrix.models import DeviceType, Toolchain, UpgradeProposal
        from runners import signing

        users = get_user_model().objects
        viewer = users.filter(username="bench-viewer").first()
        viewer = viewer or users.create_user("bench-viewer")
        viewer.set_password(PASSWORD)
        viewer.save()
        viewer.groups.add(Group.objects.get(name="viewer"))
        self.key = Ed25519PrivateKey.generate()
        self.runner, _ = Runner.objects.update_or_create(
            name="bench-ingest",
            defaults={
                "public_key": signing.public_key_hex(self.key),
                "state": Runner.State.ONLINE,
            },
        )
        self.current = Toolchain.objects.get(is_current=True)
        self.proposal = UpgradeProposal.objects.open().first()
        covered = set(self.proposal.device_types.values_list("pk", flat=True))
        # Results on the current toolchain in a column the proposal does not
        # cover change the home page but no proposal; results on the
        # candidate in a covered column are the proposal's own.
        self.outside = DeviceType.objects.exclude(pk__in=covered).first()
        self.inside = DeviceType.objects.filter(pk__in=covered, backend="cuda").first()
        self.sources = load_seed.kernel_sources()
        self.rng = random.Random(5)
        self.lock = threading.RLock()
        self.signers = {}
        self.times = {}

    def describe(self) -> dict:
        from django.db.models import Count

        from matrix.models import Cell, Result, Shape, ValidationJob

        return {
            "results": Result.objects.count(),
            "cells": Cell.objects.count(),
            "cells_current_toolchain": Cell.objects.filter(
                toolchain=self.current
            ).count(),
            "shapes": Shape.objects.count(),
            "served": Shape.objects.served().count(),
            "open_jobs": ValidationJob.objects.open().count(),
            "proposal_device_types": self.proposal.device_types.count(),
            "statuses_current": dict(
                Cell.objects.filter(toolchain=self.current)
                .values_list("status")
                .annotate(n=Count("id"))
                .order_by()
            ),
        }

    def paths(self) -> dict:
        from django.db.models import Count

        from matrix.models import Operator, Result

        longest = (
            Result.objects.filter(toolchain=self.current)
            .values("shape_id", "device_type_id")
            .annotate(n=Count("id"))
            .order_by("-n")
            .first()
        )
        widest = (
            Operator.objects.annotate(n=Count("shapes")).order_by("-n", "name").first()
        )
        self.cell_paths = [
            f"/cells/{row['shape_id']}/{row['device_type_id']}/"
            for row in Result.objects.filter(toolchain=self.current)
            .values("shape_id", "device_type_id")
            .distinct()[:50]
        ]
        return {
            "home_cached": "/",
            "home_new_result": "/",
            "home_open": f"/?open={widest.name}",
            "gaps": "/gaps/",
            "cell": f"/cells/{longest['shape_id']}/{longest['device_type_id']}/",
            "cell_history": longest["n"],
            "errors": "/errors/",
            "upgrade_diff": f"/upgrades/{self.proposal.pk}/",
            "api_matrix": "/api/v1/matrix",
            "api_matrix_304": "/api/v1/matrix",
            "api_matrix_new_result": "/api/v1/matrix",
            "home_open_new_result": f"/?open={widest.name}",
            "api_gaps": "/api/v1/gaps",
            "api_manifest": "/api/v1/manifest",
            "api_manifest_identity": "/api/v1/manifest",
            # What a serving host reads: its own device type's entries.
            "api_manifest_device": "/api/v1/manifest?"
            + urllib.parse.urlencode({"device_type": str(self.inside)}),
        }

    # -- results, signed and ingested as a runner's message would be ----------

    def jobs(self, count: int, *, device_type, toolchain) -> list:
        """``count`` running jobs of the bench runner on that column."""
        from django.utils import timezone

        from matrix.models import JobState, KernelRevision, Shape, ValidationJob

        current = dict(
            KernelRevision.objects.filter(is_current=True).values_list(
                "operator_id", "pk"
            )
        )
        shapes = list(
            Shape.objects.select_related("operator")
            .only("id", "operator_id", "dims", "dtype", "operator__name")
            .order_by("?")[:count]
        )
        while len(shapes) < count:
            shapes += shapes[: count - len(shapes)]
        now = timezone.now()
        return ValidationJob.objects.bulk_create(
            ValidationJob(
                revision_id=current[shape.operator_id],
                shape=shape,
                device_type=device_type,
                toolchain=toolchain,
                state=JobState.RUNNING,
                runner=self.runner,
                started_at=now,
                queue="bench",
            )
            for shape in shapes
        )

    def envelope(self, job, device_type) -> dict:
        from runners import protocol

        backend = device_type.backend
        # A validate job's outcomes, in the seed's shares: a compile-only
        # status (lowered, built) on it is incoherent and ingest refuses it.
        outcomes = [
            (status, weight)
            for status, weight in load_seed.STATUS_MIX[backend]
            if status not in ("lowered", "built")
        ]
        status = self.rng.choices(
            [s for s, _ in outcomes], weights=[w for _, w in outcomes]
        )[0]
        ran = status in ("pass", "mismatch", "runtime_error", "timeout")
        # The NPU column (the one outside the proposal) has no kernel of its
        # own yet: its results carry the CUDA source's size too, so both
        # ingest rows send what a real result weighs (about 5 KB of source).
        source = self.sources.get(f"gemm/{backend}") or self.sources["gemm/cuda"]
        message = (
            ""
            if status in ("pass", "lowered", "built")
            else (f"bench: {status} in pass tl.LayoutInference ({backend})")
        )
        result = {
            "status": status,
            "stage_reached": "validate" if ran else "lower",
            # Within every operator's tolerance for a pass, far outside it
            # for a mismatch: ingest checks a verdict against its metrics.
            "metrics": (
                {"rel_err": 1e-7, "max_abs_err": 2e-7, "mismatch_ratio": 0.0}
                if status == "pass"
                else {"rel_err": 0.5, "max_abs_err": 1.0, "mismatch_ratio": 0.2}
                if status == "mismatch"
                else {"rel_err": None, "max_abs_err": None, "mismatch_ratio": None}
            ),
            "timings": {
                "compile_s": 2.5,
                "kernel_ms": self.kernel_ms(job, device_type) if ran else None,
                "reference_ms": 1.2 * self.kernel_ms(job, device_type) if ran else None,
            },
            "error": {"signature": "", "message": message} if message else None,
            "fingerprint": {"hash": "f" * 64, "components": {"tilelang": "0.1.15"}},
            "kernel_source": source,
            "tolerance": {"rtol": 1e-2, "atol": 1e-2},
            "target": device_type.target,
            "stage": "validate",
            "seed": 0,
        }
        return protocol.result_envelope(
            job={"job": job.pk, "attempt": job.attempt},
            result=result,
            runner_name=self.runner.name,
            key=self.key,
        )

    def kernel_ms(self, job, device_type) -> float:
        """A time the device could have run the job's kernel in: at least
        0.5 ms, and 1.5 times the fastest its datasheet allows (ingest
        refuses a faster one as implausible, as it would a real runner's)."""
        from runners import kernels
        from runners.kernels import peaks

        key = (job.shape_id, device_type.pk)
        if key not in self.times:
            shape, fastest = job.shape, 0.0
            peak = peaks.device_peak(device_type.model, device_type.backend)
            if peak is not None:
                operator = kernels.get(shape.operator.name)
                fastest = peak.fastest_ms(
                    flops=operator.flops(shape.dims),
                    bytes_moved=operator.bytes_moved(shape.dims, shape.dtype),
                    dtype=shape.dtype,
                )
            self.times[key] = max(0.5, round(1.5 * fastest, 4))
        return self.times[key]

    def one_new_result(self) -> None:
        """One result on the current toolchain, through ingest: the home
        page's data version moves."""
        from matrix.fleet import services

        with self.lock:
            (job,) = self.jobs(1, device_type=self.outside, toolchain=self.current)
            envelope = self.envelope(job, self.outside)
        services.results_ingest(envelopes=[envelope])

    def messages(self, total: int, *, device_type, toolchain) -> list[list]:
        """Signed messages of 5 to 25 results, ``total`` results in all."""
        jobs = self.jobs(total, device_type=device_type, toolchain=toolchain)
        envelopes = [self.envelope(job, device_type) for job in jobs]
        messages, i = [], 0
        while i < len(envelopes):
            size = self.rng.randint(5, 25)
            messages.append(envelopes[i : i + size])
            i += size
        return messages

    @contextlib.contextmanager
    def signer(self, name: str):
        """Jobs and results within are runner ``name``'s, signed with a key
        of its own (made on first use)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import (
            Ed25519PrivateKey,
        )

        from matrix.fleet.models import Runner
        from runners import signing

        if name not in self.signers:
            key = Ed25519PrivateKey.generate()
            runner, _ = Runner.objects.update_or_create(
                name=name,
                defaults={
                    "public_key": signing.public_key_hex(key),
                    "state": Runner.State.ONLINE,
                },
            )
            self.signers[name] = (runner, key)
        with self.lock:
            own = self.runner, self.key
            self.runner, self.key = self.signers[name]
            try:
                yield
            finally:
                self.runner, self.key = own

    def newest_result_id(self) -> int:
        from matrix.models import Result

        return Result.objects.order_by("-id").values_list("id", flat=True)[0]

    def ingest_rows(self, total: int, budget_s: float) -> dict:
        from matrix.models import Toolchain

        candidate = Toolchain.objects.get(pk=self.proposal.candidate_id)
        rows = {}
        with ControlWorker() as worker:
            # A control worker runs for days: each of its processes has
            # connected, imported the kernels' tolerances and filled its
            # caches before the rows are timed (100 results warmed one of
            # three, and the first row read lower than the second).
            ingest_timed(
                self.messages(
                    INGEST_WARM_RESULTS,
                    device_type=self.outside,
                    toolchain=self.current,
                ),
                self.newest_result_id(),
                budget_s,
            )
            for key, device_type, toolchain in (
                ("outside_proposal", self.outside, self.current),
                ("inside_proposal", self.inside, candidate),
            ):
                messages = self.messages(
                    total, device_type=device_type, toolchain=toolchain
                )
                first_id = self.newest_result_id()
                rows[key] = ingest_timed(messages, first_id, budget_s)
                floors = copy_floor(first_id)
                rows[key]["copy"] = floors["new_table"]
                rows[key]["copy_into_results"] = floors["results_table"]
                for share, floor in (
                    ("share_of_copy", "copy"),
                    ("share_of_copy_into_results", "copy_into_results"),
                ):
                    rows[key][share] = round(
                        rows[key]["per_s"] / rows[key][floor]["per_s"], 3
                    )
            rows["worker_log_tail"] = worker.log_tail()
        return rows


class ControlWorker:
    """The control worker as production runs it (``manage.py control work``,
    one process per core plus one, unless ``args`` say otherwise), on the
    bench's database and Redis broker; ``env``: settings of its own."""

    def __init__(self, *args: str, env: dict | None = None):
        self.args, self.env = args, {**os.environ, **(env or {})}
        # Its remote-control name (``manage.py control``): its ingest queues.
        shards = args[args.index("--ingest") + 1] if "--ingest" in args else None
        prefix = "control" + "".join(
            f"-{s.strip()}" for s in (shards.split(",") if shards else [])
        )
        self.node = f"{prefix}@{socket.gethostname()}"

    def __enter__(self):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "control", "work", "--no-beat", *self.args],
            cwd=ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while "ready." not in Path(self.log.name).read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    "the control worker did not start:\n" + self.log_tail()
                )
            time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def log_tail(self) -> str:
        return Path(self.log.name).read_text()[-2000:]


def ingest_timed(messages: list[list], after_id: int, budget_s: float) -> dict:
    """Messages sent to the control queue as a runner sends them and stored
    by the control worker (``load_ingest_scale.queued_then_timed``)."""
    return load_ingest_scale.queued_then_timed(
        {"control": ControlWorker().node}, {"control": messages}, after_id, budget_s
    )


COPY_ROUNDS = 5
INGEST_WARM_RESULTS = 1_000


def copy_floor(after_id: int) -> dict:
    """COPY the result rows just ingested, twice over: what the database
    itself takes to store them. The median of ``COPY_ROUNDS`` rounds each
    (one round of 1,500 rows lasted 30-200 ms, and a single one moved by
    1.5x from run to run), into

    - ``new_table``: a new logged table of the same shape, with its indexes
      and constraints but empty (the floor the goal is judged against), and
    - ``results_table``: the results table itself, at this size, its foreign
      keys checked as each row goes in, rolled back: what ingest's own rows
      cost, whose indexes hold every result stored before (as new attempts
      of the same jobs, so no row conflicts with the ones copied)."""
    from django.db import connection, transaction

    from matrix.models import Result

    table = Result._meta.db_table
    fields = [f for f in Result._meta.concrete_fields if f.column != "id"]
    names = ", ".join(f.column for f in fields)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {names} FROM {table} WHERE id > %s", [after_id])
        rows = cursor.fetchall()
    attempt = next(i for i, f in enumerate(fields) if f.name == "attempt")
    rows = [
        tuple(
            json.dumps(v)
            if fields[i].get_internal_type() == "JSONField"
            else v + 1000
            if i == attempt
            else v
            for i, v in enumerate(row)
        )
        for row in rows
    ]

    def copy_into(target: str) -> float:
        started = time.perf_counter()
        with connection.connection.cursor() as cursor:
            with cursor.copy(f"COPY {target} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        return time.perf_counter() - started

    floors = {"new_table": [], "results_table": []}
    for _ in range(COPY_ROUNDS):
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS bench_copy_target")
            cursor.execute(
                f"CREATE TABLE bench_copy_target (LIKE {table} INCLUDING ALL)"
            )
        # Autocommit: the COPY commits as it ends.
        floors["new_table"].append(copy_into("bench_copy_target"))
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            floors["results_table"].append(copy_into(table))
            transaction.set_rollback(True)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_copy_target")
    out = {}
    for key, rounds in floors.items():
        elapsed = statistics.median(rounds)
        out[key] = {
            "results": len(rows),
            "seconds": round(elapsed, 3),
            "rounds_s": [round(r, 3) for r in rounds],
            "per_s": round(len(rows) / elapsed, 1) if elapsed else None,
        }
    return out


# --- the table -------------------------------------------------------------------


def verdicts(report: dict) -> dict:
    sizes = report["sizes"]
    if not sizes:
        return {}
    first, last = next(iter(sizes.values())), list(sizes.values())[-1]
    out = {}
    for key, _, _, goal in PAGE_ROWS:
        if key not in last.get("pages", {}) or key not in first.get("pages", {}):
            continue
        p95 = last["pages"][key]["p95_ms"]
        base = first["pages"][key]["p95_ms"]
        out[key] = {
            "within_goal": goal is None or p95 <= goal,
            "ratio_largest_to_smallest": round(p95 / base, 2) if base else None,
        }
        if key in FIRST_BYTE_ROWS:
            p95 = last["pages"][key].get("first_byte_p95_ms")
            base = first["pages"][key].get("first_byte_p95_ms")
            if p95 is not None and base:
                out[key]["first_byte_ratio_largest_to_smallest"] = round(p95 / base, 2)
    if "api_matrix_304" in last.get("pages", {}):
        out.setdefault("api_matrix_304", {})["answers_304"] = 304 in {
            int(k) for k in last["pages"]["api_matrix_304"]["statuses"]
        }
    for key in ("outside_proposal", "inside_proposal") if "ingest" in last else ():
        out[f"ingest_{key}"] = last["ingest"][key]["share_of_copy"] >= 0.25
    if "mixed" in last:
        mixed = last["mixed"]
        out["mixed"] = mixed["p95_ms"] <= 300 and mixed["errors"] == 0
    if "worker_rss_mb_after_diff" in last:
        out["worker_rss"] = max(last["worker_rss_mb_after_diff"] or [0]) <= 300
    return out


def print_table(report: dict) -> None:
    sizes = list(report["sizes"])
    head = f"{'p95 of each row':<40}" + "".join(f"{s:>12}" for s in sizes)
    print(head + f"{'goal':>12}")
    print("-" * len(head + " " * 12))
    for key, label, goal, _ in PAGE_ROWS:
        cells = []
        for size in sizes:
            row = report["sizes"][size].get("pages", {}).get(key)
            if row is None:
                cells.append(f"{'-':>12}")
                continue
            text = f"{row['p95_ms']:g}"
            if key == "api_matrix_304":
                text += f" ({'/'.join(str(s) for s in row['statuses'])})"
            if row["requests"] < report["requests_per_row"]:
                text += f" n{row['requests']}"
            cells.append(f"{text:>12}")
        print(f"{label + ' (ms)':<40}" + "".join(cells) + f"{goal:>12}")
    print("  of which to the first byte (the server's part), p95 ms")
    for key, label, _, _ in PAGE_ROWS:
        if key not in FIRST_BYTE_ROWS:
            continue
        cells = []
        for size in sizes:
            row = report["sizes"][size].get("pages", {}).get(key) or {}
            first_byte = row.get("first_byte_p95_ms")
            cells.append("-" if first_byte is None else f"{first_byte:g}")
        print(f"{'  ' + label:<40}" + "".join(c.rjust(12) for c in cells))
    for key, label in (
        ("outside_proposal", "ingest results/s ÷ COPY, no proposal"),
        ("inside_proposal", "the same, in the open proposal"),
    ):
        cells = []
        for size in sizes:
            row = report["sizes"][size].get("ingest", {}).get(key)
            text = f"{row['per_s']:.0f} {row['share_of_copy']:.2f}×" if row else "-"
            cells.append(text.rjust(12))
        print(f"{label:<40}" + "".join(cells) + f"{'≥ 0.25×':>12}")
    for floor, label in (
        ("copy", "COPY into a new table, results/s"),
        ("copy_into_results", "COPY into the results table, results/s"),
    ):
        cells = []
        for size in sizes:
            row = report["sizes"][size].get("ingest", {}).get("outside_proposal")
            cells.append(f"{row[floor]['per_s']:g}" if row and floor in row else "-")
        print(f"{label:<40}" + "".join(c.rjust(12) for c in cells))
    for key, label in (
        ("outside_proposal", "  ingest ÷ COPY into the results table"),
        ("inside_proposal", "  the same, open proposal"),
    ):
        cells = []
        for size in sizes:
            row = report["sizes"][size].get("ingest", {}).get(key) or {}
            share = row.get("share_of_copy_into_results")
            cells.append("-" if share is None else f"{share:.2f}×")
        print(f"{label:<40}" + "".join(c.rjust(12) for c in cells))
    costs = [report["sizes"][s].get("cost") for s in sizes]
    if any(costs):
        print("ms of the machine a request, each page of the mix alone at saturation")
        weights = dict(MIX)
        for key in weights:
            cells = [
                f"{c[key]['machine_ms_per_request']:>12g}" if c else f"{'-':>12}"
                for c in costs
            ]
            print(f"{'  ' + key:<40}" + "".join(cells))
        mean = [
            sum(weights[k] * c[k]["machine_ms_per_request"] for k in weights)
            / sum(weights.values())
            if c
            else None
            for c in costs
        ]
        print(
            f"{'  the mix, weighted':<40}"
            + "".join(f"{m:>12.2f}" if m else f"{'-':>12}" for m in mean)
        )
    for key, label in (
        ("mixed", "50 connections mixed, p95 ms (errors)"),
        ("mixed_rest", "  the same, no gaps or upgrade diff"),
    ):
        cells = []
        for size in sizes:
            mixed = report["sizes"][size].get(key)
            text = f"{mixed['p95_ms']:g} ({mixed['errors']})" if mixed else "-"
            cells.append(f"{text:>12}")
        print(f"{label:<40}" + "".join(cells) + f"{'≤ 300, 0':>12}")
    print(
        f"{'largest worker RSS after diff, MB':<40}"
        + "".join(
            f"{max(report['sizes'][s].get('worker_rss_mb_after_diff') or [0]):>12g}"
            for s in sizes
        )
        + f"{'≤ 300':>12}"
    )
    for size in sizes:
        seed = report["sizes"][size]["seed"]
        print(
            f"{size}: {seed['results']:,} results, {seed['cells']:,} cells, "
            f"longest history {seed['longest_history']}, "
            f"{seed['database_bytes'] / 2**30:.2f} GiB "
            f"({seed['database_bytes'] / seed['results']:,.0f} bytes a result); "
            f"seeding took {seed['seed_s']} s"
            f"{' (this run)' if seed.get('seeded_now') else ' (earlier)'}"
        )


def print_comparison(before: dict, after: dict) -> None:
    """p95 of two runs, row by row: before → after, per size."""
    sizes = [s for s in after["sizes"] if s in before["sizes"]]
    print(f"{'p95 ms, before → after':<42}" + "".join(f"{s:>24}" for s in sizes))
    for key, label, goal, _ in PAGE_ROWS:
        cells = []
        for size in sizes:
            old = before["sizes"][size]["pages"].get(key)
            new = after["sizes"][size]["pages"].get(key)
            text = " → ".join(f"{r['p95_ms']:g}" if r else "-" for r in (old, new))
            cells.append(f"{text:>24}")
        print(f"{label:<42}" + "".join(cells) + f"  {goal}")
    for key, label in (
        ("outside_proposal", "ingest/s, no proposal touched"),
        ("inside_proposal", "ingest/s, open proposal"),
    ):
        cells = []
        for size in sizes:
            old, new = (
                r["sizes"][size]["ingest"][key]["per_s"] for r in (before, after)
            )
            cells.append(f"{f'{old:g} → {new:g}':>24}")
        print(f"{label:<42}" + "".join(cells))
    for key, label in (
        ("mixed", "50 mixed connections, p95 ms/errors"),
        ("mixed_rest", "  the same, no gaps or upgrade diff"),
    ):
        cells = []
        for size in sizes:
            old, new = (r["sizes"][size].get(key) for r in (before, after))
            text = " → ".join(
                f"{m['p95_ms']:g}/{m['errors']}" if m else "-" for m in (old, new)
            )
            cells.append(f"{text:>24}")
        print(f"{label:<42}" + "".join(cells))
    cells = []
    for size in sizes:
        old, new = (
            max(r["sizes"][size].get("worker_rss_mb_after_diff") or [0])
            for r in (before, after)
        )
        cells.append(f"{f'{old:g} → {new:g}':>24}")
    print(f"{'largest worker RSS after diff, MB':<42}" + "".join(cells))
    for name, run in (("before", before), ("after", after)):
        print(
            f"{name}: started {run['started']}, load average "
            f"{run['host']['load_average_at_start'][0]:.1f} at start, "
            f"{run['host']['load_average_at_end'][0]:.1f} at end"
        )


if __name__ == "__main__":
    main()
