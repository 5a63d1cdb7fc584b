"""/livez and /readyz, for an orchestrator.

/livez says the process answers: nothing else. A restart cures a process
that hangs, not a database or a broker that is down, so liveness never
depends on them (restarting every web process because the broker is down
would only add a stampede to the outage).

/readyz says whether this process can serve pages: 503 naming what is
missing when it cannot. Fatal: the database, and its migrations applied
(the code would query columns that are not there yet). Reported but not
fatal, because the process serves without them and every web process
shares them, so taking this one out of the load balancer helps nobody: the
caches (reads are computed, sessions read from the database, while Redis
is down: docs/deploy.md) and the broker (pages and the API read the
database; only planning new work and the heartbeat fallback need it).
/api/v1/health keeps its own contract (503 when the broker is down)."""

from __future__ import annotations

from django.core.cache import caches
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import JsonResponse

from matrix.observability.queues import queue_depths

# A probe is asked every few seconds, and a dependency that hangs must
# not make the probe itself time out.
BROKER_TIMEOUT_S = 1.0
PROBE_KEY = "tilematrix-readyz"

_migrated = False


def _failure(exc: Exception) -> str:
    return f"unreachable ({exc.__class__.__name__})"


def database_check() -> str:
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return _failure(exc)
    return "ok"


def migrations_check() -> str:
    """Whether every migration is applied. Read once and remembered once
    true: a running process's code does not gain migrations, and building
    the migration graph on every probe would cost more than the probe."""
    global _migrated
    if _migrated:
        return "ok"
    try:
        executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:
        return _failure(exc)
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:3])
        more = f" and {len(plan) - 3} more" if len(plan) > 3 else ""
        return f"{len(plan)} not applied ({names}{more})"
    _migrated = True
    return "ok"


def cache_check(alias: str) -> str:
    """A Redis cache is asked directly: the tolerant one used for reads
    answers a miss, not an error, while Redis is down."""
    cache = caches[alias]
    try:
        client = getattr(cache, "_cache", None)
        if hasattr(client, "get_client"):
            client.get_client(write=True).ping()
        else:
            cache.set(PROBE_KEY, 1, 10)
    except Exception as exc:
        return _failure(exc)
    return "ok"


def broker_check() -> str:
    depths, status = queue_depths([], timeout_s=BROKER_TIMEOUT_S)
    return status if depths is None else "ok"


def checks() -> tuple[dict[str, str], list[str]]:
    """(every dependency's state, the fatal ones)."""
    found = {"database": database_check()}
    found["migrations"] = (
        migrations_check() if found["database"] == "ok" else "unknown (no database)"
    )
    for alias in caches.settings:
        found[f"cache:{alias}"] = cache_check(alias)
    found["broker"] = broker_check()
    return found, ["database", "migrations"]


def livez(request) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def readyz(request) -> JsonResponse:
    found, fatal = checks()
    missing = [name for name in fatal if found[name] != "ok"]
    degraded = [name for name in found if name not in fatal and found[name] != "ok"]
    return JsonResponse(
        {
            "ready": not missing,
            "missing": missing,
            "degraded": degraded,
            "checks": found,
        },
        status=503 if missing else 200,
    )
