"""`manage.py control work`: the control worker. It holds the database and
serves the control queue (signed results, heartbeats) and, unless told
otherwise, beat (the reaper); runner hosts run `manage.py runner work`, in
processes of their own, so neither ever waits behind the other. With
several ingest queues (TILEMATRIX_INGEST_QUEUES), as many control workers
each store the results of their own (`--ingest`); exactly one runs beat."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from matrix.fleet import broker_access, ingest_queues
from matrix.fleet.tasks import INGEST_BATCH_MESSAGES


def ingest_processes() -> int:
    """One per core plus one: a process waits on PostgreSQL for about a
    third of a batch (its statements and the commit), and another keeps the
    core busy meanwhile. At 1M results on 2 cores, 3 processes stored 3,330
    results/s, 2 stored 3,000 and 4 stored 3,230 (bench/load.py's ingest,
    12,000 results a round)."""
    return (os.cpu_count() or 1) + 1


class Command(BaseCommand):
    help = (
        "The control worker: control work [--concurrency N] [--no-beat] [--ingest 0,1]."
    )

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
        work.add_argument(
            "--ingest",
            metavar="N[,N...]",
            help="with TILEMATRIX_INGEST_QUEUES above 1: the ingest queues this "
            "worker stores results from, by number (default: all of them); "
            "the control queue is served whatever this says",
        )
        work.add_argument("--loglevel", default="info")

    def handle(self, *args, action, concurrency, no_beat, ingest, loglevel, **_):
        from matrix.celery import app

        try:
            queues = ingest_queues.served(ingest)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            broker_access.queue_caps_ensure()
        except broker_access.BrokerAdminError as exc:
            # Results still flow; the queues are only unbounded.
            self.stderr.write(f"the control and ingest queues are not capped: {exc}")
        # Unique per worker on a host: two with one name would share a
        # remote-control mailbox (pause, resume, the bench's consumers).
        node = "control"
        if ingest is not None:
            node += "".join(
                f"-{q.removeprefix(ingest_queues.PREFIX)}" for q in queues[1:]
            )
        argv = [
            "worker",
            f"--queues={','.join(queues)}",
            f"--hostname={node}@%h",
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
