"""`manage.py control work`: the control worker. It holds the database and
serves the control queue (signed results, heartbeats) and, unless told
otherwise, beat (the reaper); runner hosts run `manage.py runner work`, in
processes of their own, so neither ever waits behind the other."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from matrix.fleet.tasks import CONTROL, INGEST_BATCH_MESSAGES


def ingest_processes() -> int:
    """One per core plus one: a process waits on PostgreSQL for about a
    third of a batch (its statements and the commit), and another keeps the
    core busy meanwhile. At 1M results on 2 cores, 3 processes stored 3,330
    results/s, 2 stored 3,000 and 4 stored 3,230 (bench/load.py's ingest,
    12,000 results a round)."""
    return (os.cpu_count() or 1) + 1


class Command(BaseCommand):
    help = "The control worker: control work [--concurrency N] [--no-beat]."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        work = sub.add_parser(
            "work",
            help="serve the control queue (results, heartbeats) and run beat "
            "(the reaper)",
        )
        work.add_argument(
            "--concurrency",
            type=int,
            default=ingest_processes(),
            help="processes ingesting side by side (default: one per core, plus one)",
        )
        work.add_argument(
            "--no-beat",
            action="store_true",
            help="run no beat here: a deployment runs exactly one",
        )
        work.add_argument("--loglevel", default="info")

    def handle(self, *args, action, concurrency, no_beat, loglevel, **_):
        from matrix.celery import app

        argv = [
            "worker",
            f"--queues={CONTROL}",
            "--hostname=control@%h",
            f"--concurrency={concurrency}",
            # Enough messages in hand to fill a batch of results per process
            # (runners.ingest_result); the runner workers keep taking one
            # message at a time.
            f"--prefetch-multiplier={2 * INGEST_BATCH_MESSAGES}",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
        ]
        if not no_beat:
            argv += ["--beat", f"--schedule={settings.VAR_DIR}/beat-schedule"]
        app.worker_main(argv)
