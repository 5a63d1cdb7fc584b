"""Reads computed once per data version, kept in the cache every web process
shares.

A read that depends only on the stored results, the catalogue and its
filters is the same for every reader until one of those changes. It is
computed once and kept under a key that names them, the data version
included. With a shared cache the version is the counter of what the read
shows (its toolchain, device type or operator; ``read_versions``), moved by
ingest and read at most once a second, so a page lags ingest by at most
``read_versions.STALE_BOUND_S``; with a cache per process it is the newest
result id, so the request after a result computes the read again. With ``TILEMATRIX_CACHE_URL`` the cache is one Redis for all
web processes (a read is computed once, not once per process); without it,
a cache inside each process (the embedded default). A cache that cannot be
reached is a miss, never an error: the read is computed instead.

Each web process also keeps what it read from Redis, or wrote there, for
``NEAR_S`` (as the bytes Redis holds, so every read still gets its own
copy): most keys name a data version and never change, and under load a
page view asked Redis for the same few values several times a second in
every process. A key that expires or is written by time (a catalogue kept
for 5 s, a user's admin link for a minute) may show its old value in a
process for up to ``NEAR_S`` longer.

The API's answers carry an ``ETag`` made from the same key, so a client
that polls (a CI step) gets a 304 without a body until the data changes,
and a client that accepts gzip gets the answer gzipped, compressed once per
version and kept beside it.

A whole answer (a reader page, an API answer) is not waited for: while one
reader computes it for a new data version, a reader arriving meanwhile is
given the answer to the version before, the newest one kept, with its own
``ETag`` (``answer_read``). A request that finds nothing being computed
computes the new answer, so the request after a result still shows it;
under 50 readers while results arrive every few seconds, every reader of a
slow page had been waiting for the one computing it.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import threading
import time
from collections import OrderedDict

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.db import connection
from django.http import HttpResponse
from django.utils.cache import get_conditional_response, patch_vary_headers
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from matrix import read_versions
from matrix.api_json import StrictJSONRenderer

logger = logging.getLogger(__name__)
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
WARN_EVERY_S = 60
# One reader computes a missing read; the others look for its answer this
# often, for this long, before computing it themselves.
COMPUTE_POLL_S = 0.01
COMPUTE_WAIT_S = 5.0
COMPUTE_LOCK_S = 30


class _ReusedClient(RedisCacheClient):
    """Django's Redis cache client, keeping one ``redis.Redis`` per pool:
    the stock client builds a new one (and its table of a few hundred
    response callbacks) for every get and set, which was a fifth of a page
    view served from the cache. A ``redis.Redis`` is safe to share between
    threads; its pool starts over in a forked process."""

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        clients = self.__dict__.setdefault("_clients", {})
        client = clients.get(id(pool))
        if client is None:
            client = clients[id(pool)] = self._client(connection_pool=pool)
        return client


# How long a process keeps a value it read from the shared cache, and how
# much it keeps: at most NEAR_BYTES, no single value over NEAR_VALUE_BYTES.
NEAR_S = 2.0
NEAR_BYTES = 32 * 1024 * 1024
NEAR_VALUE_BYTES = 4 * 1024 * 1024


class _NearClient(_ReusedClient):
    """The shared cache's client, keeping each value this process read or
    wrote for ``NEAR_S`` (least recently used first out past
    ``NEAR_BYTES``). Values are kept as the serialized bytes, and loaded
    again on each read, exactly as from Redis."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._near: OrderedDict[str, tuple[float, object]] = OrderedDict()
        self._near_bytes = 0
        self._near_lock = threading.Lock()

    def _near_get(self, key):
        with self._near_lock:
            found = self._near.get(key)
            if found is None:
                return None
            if found[0] <= time.monotonic():
                self._near_drop_locked(key)
                return None
            self._near.move_to_end(key)
            return found[1]

    def _near_put(self, key, raw, timeout=None) -> None:
        size = len(raw) if isinstance(raw, bytes) else 64
        if size > NEAR_VALUE_BYTES:
            self.near_drop(key)
            return
        keep_s = NEAR_S if timeout is None else min(NEAR_S, timeout)
        with self._near_lock:
            self._near_drop_locked(key)
            self._near[key] = (time.monotonic() + keep_s, raw)
            self._near_bytes += size
            while self._near_bytes > NEAR_BYTES:
                self._near_drop_locked(next(iter(self._near)))

    def _near_drop_locked(self, key) -> None:
        found = self._near.pop(key, None)
        if found is not None:
            raw = found[1]
            self._near_bytes -= len(raw) if isinstance(raw, bytes) else 64

    def near_drop(self, *keys) -> None:
        with self._near_lock:
            for key in keys:
                self._near_drop_locked(key)

    def get(self, key, default):
        raw = self._near_get(key)
        if raw is None:
            raw = self.get_client(key).get(key)
            if raw is None:
                return default
            self._near_put(key, raw)
        return self._serializer.loads(raw)

    def set(self, key, value, timeout):
        raw = self._serializer.dumps(value)
        client = self.get_client(key, write=True)
        if timeout == 0:
            self.near_drop(key)
            client.delete(key)
        else:
            client.set(key, raw, ex=timeout)
            self._near_put(key, raw, timeout)

    def add(self, key, value, timeout):
        self.near_drop(key)
        return super().add(key, value, timeout)

    def touch(self, key, timeout):
        self.near_drop(key)
        return super().touch(key, timeout)

    def delete(self, key):
        self.near_drop(key)
        return super().delete(key)

    def incr(self, key, delta):
        self.near_drop(key)
        return super().incr(key, delta)

    def set_many(self, data, timeout):
        self.near_drop(*data)
        return super().set_many(data, timeout)

    def delete_many(self, keys):
        self.near_drop(*keys)
        return super().delete_many(keys)

    def clear(self):
        with self._near_lock:
            self._near.clear()
            self._near_bytes = 0
        return super().clear()


class SharedClientRedisCache(RedisCache):
    """Django's Redis cache with one client per pool (the sessions' cache)."""

    def __init__(self, server, params):
        super().__init__(server, params)
        # RedisCache sets its client class per instance.
        self._class = _ReusedClient


class TolerantRedisCache(SharedClientRedisCache):
    """Django's Redis cache, for reads that can always be computed again: while
    Redis cannot be reached a get is a miss and a write is dropped (with a
    warning a minute), so pages stay up, only slower. Each process keeps
    what it read for ``NEAR_S`` (``_NearClient``)."""

    _warned_at = 0.0

    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = _NearClient

    def _unreachable(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - TolerantRedisCache._warned_at > WARN_EVERY_S:
            TolerantRedisCache._warned_at = now
            logger.warning("shared cache unreachable, reads computed: %s", exc)

    def get(self, key, default=None, version=None):
        try:
            return super().get(key, default, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return default

    def get_many(self, keys, version=None):
        try:
            return super().get_many(keys, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return {}

    def set(self, key, value, timeout=..., version=None):
        try:
            if timeout is ...:
                return super().set(key, value, version=version)
            return super().set(key, value, timeout, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)

    def set_many(self, data, timeout=..., version=None):
        try:
            if timeout is ...:
                return super().set_many(data, version=version)
            return super().set_many(data, timeout, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return list(data)

    def add(self, key, value, timeout=..., version=None):
        try:
            if timeout is ...:
                return super().add(key, value, version=version)
            return super().add(key, value, timeout, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            # A cache that cannot be reached holds no entry: the caller goes
            # on as the one that added it (cached_read then computes).
            return True

    def delete(self, key, version=None):
        try:
            return super().delete(key, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return False


def cache_seconds() -> int:
    """How long a read is kept (0: not kept): at most this long past the
    version change that a key would name anyway."""
    return int(getattr(settings, "TILEMATRIX_MATRIX_CACHE_S", 300))


def read_key(name: str, *parts, version=None) -> str:
    """A cache key for the read ``name`` over ``parts`` (filters) and
    ``version`` (what moves with the data). The version is named apart
    (after an ``@``) where ``answer_read`` may give the answer to an earlier
    one; a read that must never do that puts it among ``parts``."""
    key = f"{name}:" + hashlib.sha256(repr(parts).encode()).hexdigest()
    if version is not None:
        key += "@" + hashlib.sha256(repr(version).encode()).hexdigest()[:32]
    return key


def derived_key(key: str, *more) -> str:
    """The key of a read made from ``key``'s (a page around its content):
    ``more`` joins its name, its version stays apart."""
    family, at, version = key.partition("@")
    return ":".join([family, *map(str, more)]) + at + version


def cached_read(key: str, compute, timeout: int | None = None):
    """The value under ``key``, computed and kept when missing. Readers that
    miss it together do not all compute it: one does while the others wait
    for its answer (up to COMPUTE_WAIT_S, then they compute it too). A new
    result misses every read at once, so under load each web worker would
    otherwise compute the same read side by side."""
    return _read(key, compute, timeout, earlier=False)[1]


# Whole answers (answer_read) by how they were served, counted in the shared
# cache for every web process (/metrics: tilematrix_read_answers): "hit"
# (kept for this version), "earlier" (the version before, while another
# reader computes this one) or "computed".
ANSWER_OUTCOMES = ("hit", "earlier", "computed")


def _answer_counted(outcome: str) -> None:
    key = f"read-answers:{outcome}"
    try:
        if isinstance(caches["default"], RedisCache):
            # One INCR, not the cache API's EXISTS and INCRBY.
            client = cache._cache.get_client(write=True)
            client.incr(cache.make_and_validate_key(key))
        elif not cache.add(key, 1, None):
            cache.incr(key)
    except Exception:  # noqa: BLE001 (a count is never worth an error)
        return


def answers_counted() -> dict[str, int]:
    """How many whole answers were served each way, since the cache began."""
    found = cache.get_many([f"read-answers:{o}" for o in ANSWER_OUTCOMES])
    return {o: int(found.get(f"read-answers:{o}") or 0) for o in ANSWER_OUTCOMES}


def answer_read(key: str, compute, timeout: int | None = None) -> tuple[str, object]:
    """``(key served, value)``: as ``cached_read``, except that while another
    reader computes the value for a key naming its version apart
    (``read_key(..., version=)``), this one is given the newest value kept
    for an earlier version of the same read, where there is one, instead
    of waiting. Only for what a response sends as it is: a value read this
    way must not go into another kept value, which would then name a
    version it does not show."""
    served, value, outcome = _read(key, compute, timeout, earlier="@" in key)
    _answer_counted(outcome)
    return served, value


# With the versions of read_versions (a shared cache), an answer computed at
# most this long ago stands in for the next version while a thread of this
# process computes that one: a page is then never older than the window in
# which its version was read plus this (read_versions.STALE_BOUND_S).
REFRESH_WITHIN_S = read_versions.STALE_BOUND_S - read_versions.COALESCE_S


def _newest_of(newest: str) -> tuple[str, float] | None:
    """(key, computed at) of the newest answer kept for a read."""
    found = cache.get(newest)
    if isinstance(found, (tuple, list)) and len(found) == 2:
        return found[0], found[1]
    return None


def _keep(key: str, value, timeout: int | None, newest: str | None) -> None:
    pointer = (key, time.time())
    if timeout is None:
        cache.set(key, value)
        if newest:
            cache.set(newest, pointer)
    else:
        cache.set(key, value, timeout)
        if newest:
            cache.set(newest, pointer, timeout)


def _refresh_in_background(key, compute, timeout, newest: str, lock: str) -> None:
    """Compute ``key``'s answer in a thread of this process (its lock held),
    while the reader that found it missing is given the answer before."""

    def refresh() -> None:
        try:
            _keep(key, compute(), timeout, newest)
        except Exception:
            logger.exception("a read was not computed again: %s", key.split(":")[0])
        finally:
            cache.delete(lock)
            # The thread's own database connection.
            connection.close()

    threading.Thread(target=refresh, name="read-refresh", daemon=True).start()


def _read(key: str, compute, timeout: int | None, *, earlier: bool):
    """``(key served, value, how)``: how is one of ANSWER_OUTCOMES."""
    value = cache.get(key)
    if value is not None:
        return key, value, "hit"
    newest = key.partition("@")[0] + "@newest"
    lock = key + ":computing"
    if earlier and read_versions.shared():
        found = _newest_of(newest)
        if (
            found is not None
            and found[0] != key
            and time.time() - found[1] <= REFRESH_WITHIN_S
        ):
            value = cache.get(found[0])
            if value is not None:
                if cache.add(lock, time.time(), COMPUTE_LOCK_S):
                    _refresh_in_background(key, compute, timeout, newest, lock)
                return found[0], value, "earlier"
    if not cache.add(lock, time.time(), COMPUTE_LOCK_S):
        # The earlier answer only while the other request is recent: one
        # that died computing leaves its lock for COMPUTE_LOCK_S, and its
        # readers then compute the new answer as they would without one.
        started = cache.get(lock) if earlier else None
        recent = started is None or time.time() - started < COMPUTE_WAIT_S
        found = _newest_of(newest) if earlier and recent else None
        if found is not None and found[0] != key:
            value = cache.get(found[0])
            if value is not None:
                return found[0], value, "earlier"
        deadline = time.monotonic() + COMPUTE_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(COMPUTE_POLL_S)
            value = cache.get(key)
            if value is not None:
                # Computed once, by the reader it waited for.
                return key, value, "hit"
    try:
        value = compute()
        _keep(key, value, timeout, newest if earlier else None)
    finally:
        cache.delete(lock)
    return key, value, "computed"


def etag_of(key: str, coding: str = "") -> str:
    """The answer's entity tag; a gzip body is another representation of it,
    with a tag of its own (RFC 9110, 8.8.3)."""
    tag = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f'"{tag}-{coding}"' if coding else f'"{tag}"'


# An answer's compressed copy is kept beside it, made once per version: the
# manifest at 1M results is 2.8 MB of JSON and 47 KB gzipped (level 6, 14 ms
# to make, 1.3 ms for a client to unpack). Only answers every reader shares
# are compressed, so no secret rides beside attacker-chosen text (BREACH).
GZIP_LEVEL = 6


def accepts_gzip(request) -> bool:
    """Whether the client's Accept-Encoding takes gzip (by name or ``*``,
    with a quality above 0)."""
    qualities = {}
    for part in request.headers.get("Accept-Encoding", "").split(","):
        coding, _, params = part.partition(";")
        quality = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        qualities[coding.strip().lower()] = quality
    return qualities.get("gzip", qualities.get("*", 0.0)) > 0


def gzipped_read(key: str, render, snapshot=None) -> tuple[str, bytes]:
    """``(key served, body)`` as ``answer_read``, the body gzipped: compressed
    by the first reader asking for it and kept for the others, so that a
    reader of a kept answer reads only the small copy. ``snapshot(key)``:
    the gzipped body kept outside the cache, or None, asked where the
    cache has none."""
    packed = cache.get(key + ":gzip")
    if packed is None and snapshot is not None:
        packed = snapshot(key)
        if packed is not None:
            cache.set(key + ":gzip", packed)
    if packed is not None:
        _answer_counted("hit")
    else:
        key, content = answer_read(key, render)
        packed = cache.get(key + ":gzip")
        if packed is None:
            # mtime 0: the same answer compresses to the same bytes anywhere.
            packed = gzip.compress(content, GZIP_LEVEL, mtime=0)
            cache.set(key + ":gzip", packed)
    return key, packed


# The API's own renderer (matrix/api.py gives NinjaAPI the same class).
RENDERER = StrictJSONRenderer()


def json_answer(request, key: str, compute, schema, snapshots=None) -> HttpResponse:
    """An API answer for ``key``: 304 when the client holds it already (its
    If-None-Match names the ETag), else the JSON of ``compute()``, checked
    against ``schema`` (where the answer has one) and rendered as the API
    renders, from the cache when another request computed it; gzipped for
    a client that accepts it. ``snapshots``: (read, keep), functions that
    read and keep the gzipped answer of a key outside the cache, consulted
    before computing it where the cache lost it."""
    coding = "gzip" if accepts_gzip(request) else ""
    not_modified = get_conditional_response(request, etag=etag_of(key, coding))
    if not_modified is None:

        def render() -> bytes:
            if snapshots is not None:
                packed = snapshots[0](key)
                if packed is not None:
                    cache.set(key + ":gzip", packed)
                    return gzip.decompress(packed)
            data = compute()
            if schema is not None:
                data = schema.model_validate(data).model_dump(by_alias=True)
            content = RENDERER.render(request, data, response_status=200)
            content = content.encode() if isinstance(content, str) else content
            if snapshots is not None:
                packed = gzip.compress(content, GZIP_LEVEL, mtime=0)
                cache.set(key + ":gzip", packed)
                snapshots[1](key, packed)
            return content

        # Under load, the answer to the version before while another request
        # computes this one, sent with that answer's own ETag.
        if coding:
            key, content = gzipped_read(
                key, render, snapshots[0] if snapshots is not None else None
            )
        else:
            key, content = answer_read(key, render)
        response = HttpResponse(
            content,
            content_type=f"{RENDERER.media_type}; charset={RENDERER.charset}",
        )
        if coding:
            response["Content-Encoding"] = coding
    else:
        response = not_modified
    response["ETag"] = etag_of(key, coding)
    patch_vary_headers(response, ["Accept-Encoding"])
    # Every use asks again, and a 304 costs no body.
    response["Cache-Control"] = "private, no-cache"
    return response


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _catalogue_stamp() -> tuple[list[str], list]:
    """Subqueries (and their parameters) stamping the catalogue: counts and
    newest ids of shapes, device types, toolchains and kernel revisions, the
    served shapes' total weight, the models' calls, the current toolchain
    and revisions, and the rollouts (which make a toolchain older). A catalogue edit that
    changes none of these (a rename) shows once the cached read expires."""
    from matrix.models import (
        CurrentRevision,
        DeviceType,
        KernelRevision,
        ServedCall,
        Shape,
        Toolchain,
        UpgradeProposal,
    )

    shape, revision = _table(Shape), _table(KernelRevision)
    # The models' calls (an import adds or replaces them): the Models reads
    # show them, and a model filter picks shapes by them.
    calls = (
        "SELECT CAST(COUNT(*) AS TEXT) || ',' || CAST(MAX(id) AS TEXT) || ','"
        f" || CAST(SUM(calls) AS TEXT) FROM {_table(ServedCall)}"
    )
    # The shapes in one pass (four subqueries read the table four times).
    shapes = (
        "SELECT CAST(COUNT(*) AS TEXT) || ',' || CAST(MAX(id) AS TEXT) || ','"
        " || CAST(SUM(CASE WHEN served THEN 1 ELSE 0 END) AS TEXT) || ','"
        f" || CAST(SUM(CASE WHEN served THEN weight ELSE 0 END) AS TEXT) FROM {shape}"
    )
    parts = [
        # First: current_toolchain_in() reads it there.
        f"SELECT MAX(id) FROM {_table(Toolchain)} WHERE is_current",
        shapes,
        f"SELECT COUNT(*) FROM {_table(DeviceType)}",
        f"SELECT MAX(id) FROM {_table(DeviceType)}",
        f"SELECT COUNT(*) FROM {_table(Toolchain)}",
        f"SELECT MAX(id) FROM {revision}",
        # Which revision is current where (matrix.revisions).
        f"SELECT SUM(id * revision_id) FROM {_table(CurrentRevision)}",
        f"SELECT COUNT(*) FROM {_table(UpgradeProposal)} WHERE state = %s",
        calls,
    ]
    return parts, [UpgradeProposal.State.ROLLED_OUT]


def _versions(parts: list[str], params: list) -> tuple:
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(f"({p})" for p in parts), params)
        return tuple(cursor.fetchone())


def data_version() -> tuple:
    """What the cached reads depend on, in one query: the catalogue's stamp
    and, where the cache is one per process, the newest result id (every
    stored result moves it; ingest writes a result before it points a cell
    at it). With a shared cache the results' part is the counters of
    ``read_versions``: a read adds ``read_versions.filters_version()`` of
    what it shows."""
    from matrix.models import Result

    catalogue, params = _catalogue_stamp()
    if read_versions.shared():
        return ("scoped", *_versions(catalogue, params))
    return _versions([f"SELECT MAX(id) FROM {_table(Result)}", *catalogue], params)


def current_toolchain_in(version: tuple) -> int | None:
    """The current toolchain's id as ``data_version()`` read it."""
    return version[1]


def cell_version(shape_id: int, device_type_id: int, toolchain_id: int | None):
    """What one cell's page depends on, in one query of index lookups: the
    newest result of its history (the shape on the device type, any
    toolchain), the newest of its column on the toolchain (the other shapes
    its chart places it among), how many cells on the toolchain share its
    error signature, and the catalogue's stamp. A result elsewhere in the
    matrix leaves the page as it was: under a sweep, every page read again
    after each result had cost most of the web workers' time."""
    from matrix.models import Cell, Result

    result, cell = _table(Result), _table(Cell)
    catalogue, params = _catalogue_stamp()
    signature = (
        f"SELECT error_signature FROM {cell} WHERE shape_id = %s"
        " AND device_type_id = %s AND toolchain_id = %s"
    )
    parts = [
        f"SELECT MAX(id) FROM {result} WHERE shape_id = %s AND device_type_id = %s",
        f"SELECT MAX(id) FROM {result} WHERE device_type_id = %s AND toolchain_id = %s",
        f"SELECT COUNT(*) FROM {cell} WHERE toolchain_id = %s"
        f" AND error_signature <> '' AND error_signature = ({signature})",
    ]
    cell_params = [
        shape_id,
        device_type_id,
        device_type_id,
        toolchain_id,
        toolchain_id,
        shape_id,
        device_type_id,
        toolchain_id,
    ]
    return _versions([*parts, *catalogue], cell_params + params)


def jobs_version(sweep_id: int | None = None) -> tuple:
    """What counts of open jobs depend on, in one query of index lookups: the
    newest job (planning adds jobs), the newest result (a job ends done or
    failed with its result, lost with an infra_error one) and, for one
    sweep, its latest claim (a claim moves a job from queued to running)."""
    from matrix.models import Result, ValidationJob

    jobs = _table(ValidationJob)
    parts = [f"SELECT MAX(id) FROM {jobs}", f"SELECT MAX(id) FROM {_table(Result)}"]
    params = []
    if sweep_id is not None:
        parts.append(f"SELECT MAX(started_at) FROM {jobs} WHERE sweep_id = %s")
        params.append(sweep_id)
    return _versions(parts, params)


def manifest_version() -> tuple:
    """What the manifest depends on, in one query: its rows, the proposals
    that approved them (an approval, a rollout or a withdrawal changes which
    rows are served), the device types it names and, last, the current
    toolchain's id (the manifest a reader gets by default)."""
    from matrix.models import DeviceType, ManifestEntry, Toolchain, UpgradeProposal

    entries, proposals = _table(ManifestEntry), _table(UpgradeProposal)
    served = f"FROM {proposals} WHERE state IN (%s, %s)"
    parts = [
        f"SELECT COUNT(*) FROM {entries}",
        f"SELECT MAX(id) FROM {entries}",
        f"SELECT COUNT(*) {served}",
        f"SELECT SUM(id) {served}",
        f"SELECT MAX(approved_at) {served}",
        f"SELECT COUNT(*) FROM {_table(DeviceType)}",
        f"SELECT MAX(id) FROM {_table(DeviceType)}",
        f"SELECT MAX(id) FROM {_table(Toolchain)} WHERE is_current",
    ]
    states = [UpgradeProposal.State.APPROVED, UpgradeProposal.State.ROLLED_OUT]
    return _versions(parts, states * 3)
