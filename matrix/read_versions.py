"""Versions of the cached reads, by what they show, coalesced over a second.

A cached read (a matrix page, an API answer, the gaps) is keyed by the
version of the data it shows. Keyed by the newest result id, every page was
computed again after every result anywhere: under a fleet's steady ingest
(a result every millisecond) no read was ever served from the cache.

Here each stored batch moves only the counters of what its results touch
(``scopes_bump``): its toolchains, and each toolchain's device types and
operators. A read names the narrowest scope its filters allow
(``scope_version``): the matrix of one toolchain moves with that
toolchain's results alone, one device type's column with that column's.

A counter that moves every millisecond would still make every read a
miss, so a read takes the counter's value as it stood when the current
window of ``COALESCE_S`` began (the first reader of a window records it for
the others): a page is computed at most once a window, and shows results
stored up to ``STALE_BOUND_S`` ago at worst (the window, plus the time one
reader takes to compute it while others are given the answer before;
pages say so).

The counters live in the cache every web process and the control worker
share (``TILEMATRIX_CACHE_URL``): ingest bumps them with one pipelined
round trip per batch, after its transaction commits, so that a reader never
computes a new version from rows not yet visible. A counter that is lost
(Redis emptied) starts again from the clock, not from zero, so that a
version once used never names other data. With a cache inside each process
(the embedded default) ingest cannot tell the web processes anything: the
versions are then the newest result id, read from the database, as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.db import connection, transaction
from django.dispatch import receiver

from matrix.events import results_stored
from matrix.models import KernelRevision, Operator, Result

COALESCE_S = 1.0
# What a page may lag behind ingest: a window, and one reader's compute.
STALE_BOUND_S = 2
# Kept a few windows: a snapshot is read only within its own.
SNAPSHOT_KEEP_S = 5
# A stand-in scope: every result moves it (reads that show other
# toolchains' cells too, such as "passes on toolchain X" hints).
EVERYWHERE = "all"


def shared() -> bool:
    """Whether the counters reach every process (the cache is Redis)."""
    return isinstance(caches["default"], RedisCache)


def scope_key(toolchain: int | None = None, *, device_type=None, operator=None):
    """The counter's name: a toolchain, one of its device types or one of
    its operators (ids); no toolchain: every result."""
    if toolchain is None:
        return f"scope:{EVERYWHERE}"
    if device_type is not None:
        return f"scope:tc{toolchain}:dt{device_type}"
    if operator is not None:
        return f"scope:tc{toolchain}:op{operator}"
    return f"scope:tc{toolchain}"


def _fresh_base() -> int:
    """Where a new counter starts: microseconds of the clock, above any
    value a lost counter of the same name can have reached."""
    return time.time_ns() // 1000


def _redis():
    """The raw client and the key maker of the shared cache."""
    return cache._cache.get_client(write=True), cache.make_and_validate_key


# revision id -> operator id; a revision never changes operator.
_operators_of: dict[int, int] = {}


def _operators(revision_ids: set[int]) -> dict[int, int]:
    missing = revision_ids - _operators_of.keys()
    if missing:
        _operators_of.update(
            KernelRevision.objects.filter(pk__in=missing).values_list(
                "pk", "operator_id"
            )
        )
    return _operators_of


def scopes_of(results: Iterable) -> set[str]:
    """The counters a batch of results moves."""
    results = list(results)
    operators = _operators({r.revision_id for r in results})
    keys = {scope_key()}
    for r in results:
        keys.add(scope_key(r.toolchain_id))
        keys.add(scope_key(r.toolchain_id, device_type=r.device_type_id))
        operator = operators.get(r.revision_id)
        if operator is not None:
            keys.add(scope_key(r.toolchain_id, operator=operator))
    return keys


def scopes_bump(keys: Iterable[str]) -> None:
    """Move these counters by one, in one round trip; a lost counter starts
    from the clock first. A cache that cannot be reached is skipped: its
    readers compute what they read (matrix.cache), and a bump lost that way
    leaves a read kept at most until it expires (``cache_seconds()``)."""
    keys = sorted(set(keys))
    if not keys or not shared():
        return
    try:
        client, make = _redis()
        base = _fresh_base()
        pipe = client.pipeline(transaction=False)
        for key in keys:
            made = make(key)
            pipe.set(made, base, nx=True)
            pipe.incr(made)
        pipe.execute()
    except Exception:  # noqa: BLE001 (the cache is an optimisation)
        return


@receiver(results_stored, dispatch_uid="read_versions.results_stored")
def _results_stored(sender, results, **kwargs) -> None:
    keys = scopes_of(results)
    transaction.on_commit(lambda: scopes_bump(keys))


def _counter(key: str) -> int | None:
    try:
        client, make = _redis()
        made = make(key)
        value = client.get(made)
        if value is None:
            client.set(made, _fresh_base(), nx=True)
            value = client.get(made)
        return int(value)
    except Exception:  # noqa: BLE001
        return None


def newest_result_id() -> int | None:
    """The version where counters are not shared: every result moves it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT MAX(id) FROM {connection.ops.quote_name(Result._meta.db_table)}"
        )
        return cursor.fetchone()[0]


def scope_version(toolchain: int | None = None, *, device_type=None, operator=None):
    """The version of the data a read of this scope shows: the scope's
    counter as it stood when the current window began (shared cache), or
    the newest result id (a cache per process)."""
    if not shared():
        return ("newest", newest_result_id())
    key = scope_key(toolchain, device_type=device_type, operator=operator)
    window = int(time.time() // COALESCE_S)
    snapshot = f"{key}@w{window}"
    value = cache.get(snapshot)
    if value is None:
        value = _counter(key)
        if value is None:
            # Redis unreachable: a version no other read names, so nothing
            # old is served (the read is computed, as matrix.cache does).
            return ("unreachable", time.time_ns())
        if not cache.add(snapshot, value, SNAPSHOT_KEEP_S):
            value = cache.get(snapshot, value)
    return (key, value)


def filters_version(filters, *, everywhere: bool = False) -> tuple:
    """What a read under ``filters`` (a ``queries.MatrixFilters``) shows
    beyond the catalogue: its toolchain's counter, narrowed to the device
    type or operator the filters name; with ``everywhere``, every result's
    too (a read that shows other toolchains' cells). Empty where counters
    are not shared: the caller's ``cache.data_version()`` then holds the
    newest result id."""
    if not shared():
        return ()
    toolchain = filters.toolchain.pk if filters.toolchain is not None else None
    scope = {}
    if filters.device_type is not None:
        scope["device_type"] = filters.device_type.pk
    elif filters.operator:
        operator = (
            Operator.objects.filter(name=filters.operator)
            .values_list("pk", flat=True)
            .first()
        )
        if operator is not None:
            scope["operator"] = operator
    version = (scope_version(toolchain, **scope),) if toolchain is not None else ()
    if everywhere or toolchain is None:
        version += (scope_version(),)
    return version
