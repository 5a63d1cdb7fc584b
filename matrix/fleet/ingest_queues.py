"""Where runners send their signed results, so that ingest can grow past
one control worker.

With ``TILEMATRIX_INGEST_QUEUES=1`` (the default) results travel on the
control queue with heartbeats, as they always have. With N > 1 there are N
ingest queues, ``ingest.0`` … ``ingest.N-1``, and each runner sends every
result to one of them, picked from its name. A control worker serves the
queues it is given (``control work --ingest 0,2``), so N control workers,
on one host or several, each store a share of the fleet's results without
sharing a queue, a prefetch window or a broker connection.

A runner's queue depends only on its name and N: a runner keeps it across
restarts and re-registration, every result of one runner goes through one
queue in the order it was sent, and nothing is stored to say where it went.
A fleet of many runners spreads over the queues about evenly; a handful of
runners may not (two of them share a queue half the time). A runner told
nothing (an older agent) keeps sending to the control queue, which every
control worker also serves, so no result is stranded when N changes.
"""

from __future__ import annotations

import zlib

from django.conf import settings

from runners.protocol import CONTROL

PREFIX = "ingest."


def count() -> int:
    return settings.TILEMATRIX_INGEST_QUEUES


def names() -> list[str]:
    """Every ingest queue apart from the control queue (none when N is 1)."""
    n = count()
    return [] if n == 1 else [f"{PREFIX}{i}" for i in range(n)]


def of_runner(runner_name: str) -> str:
    """The queue ``runner_name`` sends its results to. CRC-32, not Python's
    ``hash``: the same on every process and every host."""
    n = count()
    if n == 1:
        return CONTROL
    return f"{PREFIX}{zlib.crc32(runner_name.encode()) % n}"


def served(shards: str | None) -> list[str]:
    """The queues a control worker serves: the control queue and the ingest
    queues numbered in ``shards`` ("0,2"), or all of them when None.
    ValueError names a shard that is not one."""
    every = names()
    if shards is None:
        return [CONTROL, *every]
    if not every:
        raise ValueError(
            "--ingest: TILEMATRIX_INGEST_QUEUES is 1, so results travel on the "
            "control queue; set it to the number of ingest queues first"
        )
    picked = []
    for part in shards.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) >= len(every):
            raise ValueError(
                f"--ingest {shards!r}: {part!r} is not an ingest queue; "
                f"TILEMATRIX_INGEST_QUEUES={len(every)} numbers them 0 to "
                f"{len(every) - 1}"
            )
        picked.append(f"{PREFIX}{int(part)}")
    return [CONTROL, *dict.fromkeys(picked)]
