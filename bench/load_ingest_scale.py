"""Ingest over one queue and over two: bench/load.py's ``ingest-scale`` part.

The same number of signed results (``--ingest-results``, in messages of 5
to 25 as runners send them, each result with a kernel source of about 5 KB)
is stored by real control workers (``manage.py control work``) in four
set-ups, three rounds each (the median reported, every round kept):

- ``one_queue``: one worker on the control queue, as a deployment with
  ``TILEMATRIX_INGEST_QUEUES=1`` runs it (one process per core plus one);
- ``two_queues``: two workers, each on an ingest queue of its own
  (``TILEMATRIX_INGEST_QUEUES=2``, ``--ingest 0`` and ``--ingest 1``), with
  as many processes each, the results of two runners whose names take
  one queue each;
- ``one_queue_one_process`` and ``two_queues_one_process_each``: the same
  with one ingest process per worker, which shows what a second worker
  adds where the first does not already hold every core.

As in the ``ingest`` part, the messages are queued while the workers do
not read them (runners send from their own hosts), and each row is timed
from when the workers read their queues again until the last result is
stored. The workers are warmed first (connected, caches filled).
"""

from __future__ import annotations

import contextlib
import sys
import time
import zlib

# (row, ingest queues, ingest processes per worker or None for the default)
SETUPS = (
    ("one_queue", 1, None),
    ("two_queues", 2, None),
    ("one_queue_one_process", 1, 1),
    ("two_queues_one_process_each", 2, 1),
)
WARM_RESULTS = 300
# Rounds of each set-up, the median reported: one round of 10,000 results
# lasted 3-6 s, and the host's other work moved a single one by a fifth.
ROUNDS = 3


def runner_on(queue: int, of: int) -> str:
    """A runner name whose results take ingest queue ``queue`` of ``of``
    (``matrix.fleet.ingest_queues.of_runner``)."""
    return next(
        name
        for name in (f"bench-ingest-{i}" for i in range(1000))
        if zlib.crc32(name.encode()) % of == queue
    )


def run(fixture, control_worker, total: int, budget_s: float) -> dict:
    rows = {}
    for key, queues, processes in SETUPS:
        names = ["control"] if queues == 1 else [f"ingest.{i}" for i in range(queues)]
        concurrency = [] if processes is None else ["--concurrency", str(processes)]
        env = {"TILEMATRIX_INGEST_QUEUES": str(queues)}
        with contextlib.ExitStack() as stack:
            workers = {
                queue: stack.enter_context(
                    control_worker(
                        *concurrency,
                        *(
                            []
                            if queue == "control"
                            else ["--ingest", queue.removeprefix("ingest.")]
                        ),
                        env=env,
                    )
                )
                for queue in names
            }
            signers = {queue: runner_on(i, queues) for i, queue in enumerate(names)}
            timed(fixture, workers, signers, WARM_RESULTS, budget_s)
            rounds = [
                timed(fixture, workers, signers, total, budget_s) for _ in range(ROUNDS)
            ]
            rows[key] = dict(
                sorted(rounds, key=lambda r: r["per_s"])[len(rounds) // 2],
                per_s_rounds=[r["per_s"] for r in rounds],
            )
            rows[key].update(
                ingest_queues=queues,
                processes_per_worker=processes or "one per core plus one",
            )
        print(f"ingest-scale {key}: {rows[key]}", file=sys.stderr, flush=True)
    for base, scaled in (
        ("one_queue", "two_queues"),
        ("one_queue_one_process", "two_queues_one_process_each"),
    ):
        rows[scaled]["scale"] = round(rows[scaled]["per_s"] / rows[base]["per_s"], 2)
    return rows


def timed(fixture, workers: dict, signers: dict, total: int, budget_s: float) -> dict:
    """``total`` results, shared evenly by the queues, each queue's signed
    by the runner whose results take it (``signers``: queue → name); stored
    by ``workers`` (queue → ControlWorker)."""
    per_queue = {}
    for queue, name in signers.items():
        with fixture.signer(name):
            per_queue[queue] = fixture.messages(
                total // len(signers),
                device_type=fixture.outside,
                toolchain=fixture.current,
            )
    return queued_then_timed(
        {queue: worker.node for queue, worker in workers.items()},
        per_queue,
        fixture.newest_result_id(),
        budget_s,
    )


def queued_then_timed(
    nodes: dict, per_queue: dict, after_id: int, budget_s: float
) -> dict:
    """Messages (``per_queue``: queue → messages) sent as a runner's agent
    sends them (``results_send``), all at once as when a sweep's jobs end
    together, while the control workers (``nodes``: queue → the worker's
    remote-control name) do not read those queues: runners send from their
    own hosts, so the sending is not counted on the control host's cores.
    Timed from when the workers read their queues again until the last
    result is stored (a result id above ``after_id``), or the budget is
    spent."""
    from django.db import connection

    from matrix.celery import app
    from matrix.models import Result
    from runners import host, protocol

    expected = sum(len(m) for messages in per_queue.values() for m in messages)
    for queue, node in nodes.items():
        if not app.control.cancel_consumer(
            queue, reply=True, limit=1, destination=[node]
        ):
            raise SystemExit(f"the control worker {node} did not answer")
    for queue, messages in per_queue.items():
        app.conf[protocol.INGEST_QUEUE] = queue
        for message in messages:
            host.results_send(message)
    app.conf[protocol.INGEST_QUEUE] = None
    started = time.perf_counter()
    for queue, node in nodes.items():
        app.control.add_consumer(queue, reply=True, limit=1, destination=[node])
    deadline = time.monotonic() + budget_s
    stored = 0
    count = f"SELECT count(*) FROM {Result._meta.db_table} WHERE id > %s"
    with connection.cursor() as cursor:
        while stored < expected and time.monotonic() < deadline:
            time.sleep(0.05)
            cursor.execute(count, [after_id])
            stored = cursor.fetchone()[0]
    elapsed = time.perf_counter() - started
    return {
        "results": stored,
        "not_stored": expected - stored,
        "messages": sum(len(m) for m in per_queue.values()),
        "seconds": round(elapsed, 2),
        "per_s": round(stored / elapsed, 1),
        "budget_spent": stored < expected,
    }


def print_table(size: str, rows: dict) -> None:
    print(f"\ningest over one queue and two ({size})")
    print(f"{'set-up':<34}{'results':>9}{'s':>8}{'results/s':>11}{'scale':>7}")
    for key, _, _ in SETUPS:
        row = rows[key]
        print(
            f"{key:<34}{row['results']:>9,}{row['seconds']:>8}"
            f"{row['per_s']:>11,}{row.get('scale', ''):>7}"
        )
