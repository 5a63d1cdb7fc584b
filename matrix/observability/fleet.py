"""What the figures read of the runner fleet's tables: the one module of
``matrix.observability`` that imports the fleet's code, so that moving it
is a change of the import below alone."""

from __future__ import annotations

from matrix.fleet import ingest_queues
from matrix.fleet.models import CONTROL_QUEUE, Receipt, Runner, RunnerHealth
from matrix.fleet.services.liveness import MISSED_HEARTBEATS

# Not Celery queues: a bundle's jobs travel in a file (``bundle.<runner>``).
BUNDLE_PREFIX = "bundle."

__all__ = [
    "BUNDLE_PREFIX",
    "CONTROL_QUEUE",
    "MISSED_HEARTBEATS",
    "broker_queues",
    "receipts_newest",
    "runners_watched",
]


def runners_watched():
    """Runners expected to send heartbeats: approved and not revoked (a
    pending runner waits for approval, an evidence lab never sends any)."""
    return (
        Runner.objects.filter(revoked_at__isnull=True)
        .exclude(health__in=[RunnerHealth.PENDING, RunnerHealth.EVIDENCE])
        .order_by("name")
    )


def broker_queues(job_queues=()) -> list[str]:
    """The broker queues worth a depth: the control and ingest queues, every queue a
    watched runner consumes, and ``job_queues`` (where queued jobs wait,
    which may be a queue no runner consumes any more)."""
    queues = {
        CONTROL_QUEUE,
        *ingest_queues.names(),
        *runners_watched().queues_read(),
        *job_queues,
    }
    return sorted(q for q in queues if q and not q.startswith(BUNDLE_PREFIX))


def receipts_newest(limit: int) -> list[tuple]:
    """(stored at, signed at, job queue) of the newest ``limit`` receipts,
    by primary key: an index read from its end, whatever the table's size."""
    return list(
        Receipt.objects.order_by("-pk").values_list(
            "received_at", "issued_at", "result__job__queue"
        )[:limit]
    )
