"""The shared cache (TILEMATRIX_CACHE_URL): reads computed once per data
version are kept in Redis for every web process, and computed again, not
refused, while Redis cannot be reached."""

from __future__ import annotations

import os
import time
import uuid

import pytest
import redis
from django.urls import reverse

from matrix.models import Status
from tests.ui.conftest import record

pytestmark = pytest.mark.django_db

MATRIX = "/api/v1/matrix"


def local_redis() -> str:
    """The Redis the suite runs against (CI's, or this host's)."""
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if broker.startswith("redis"):
        return broker
    return "redis://127.0.0.1:6379/0"


@pytest.fixture
def shared_cache(settings):
    """The default cache in Redis under a prefix of this test's own (the
    Redis may be shared with other runs: nothing else is touched)."""
    prefix = f"test-{uuid.uuid4().hex}"
    url = local_redis()
    settings.CACHES = {
        **settings.CACHES,
        "default": {
            "BACKEND": "matrix.cache.TolerantRedisCache",
            "LOCATION": url,
            "KEY_PREFIX": prefix,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        },
    }
    client = redis.Redis.from_url(url)
    yield client, prefix
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


def test_a_read_computed_once_is_kept_in_redis_for_every_process(
    client, results, shared_cache, django_assert_max_num_queries
):
    store, prefix = shared_cache
    first = client.get(MATRIX)
    assert first.status_code == 200
    kept = [k.decode() for k in store.scan_iter(f"{prefix}:*")]
    assert any(":api-matrix:" in k for k in kept)
    # Another process would find it the same way: no cell is read again.
    with django_assert_max_num_queries(2):
        again = client.get(MATRIX)
    assert again.json() == first.json()


@pytest.mark.django_db(transaction=True)
def test_a_new_result_is_read_through_the_shared_cache_within_the_bound(
    client,
    results,
    shared_cache,
    toolchains,
    device_types,
    monkeypatch,
    django_capture_on_commit_callbacks,
):
    from django.db import transaction

    from matrix import read_versions
    from matrix.events import results_stored
    from matrix.models import Result

    monkeypatch.setattr(read_versions, "COALESCE_S", 1e-6)

    def statuses():
        body = client.get(MATRIX, {"backend": "c", "limit": 5000}).json()
        return [c["status"] for c in body["cells"]]

    before = statuses()
    # As ingest sends it: inside the transaction storing the result.
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        result = record(
            results["second"], device_types["c"], toolchains[1], Status.MISMATCH
        )
        results_stored.send(sender=Result, results=[result])
    wanted = before.count("mismatch") + 1
    deadline = time.monotonic() + read_versions.STALE_BOUND_S + 1
    while statuses().count("mismatch") != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert statuses().count("mismatch") == wanted


def test_pages_and_the_api_answer_while_the_shared_cache_is_down(
    client, results, settings
):
    expected = {
        url: client.get(url).status_code
        for url in (reverse("matrix"), reverse("errors"), MATRIX)
    }
    settings.CACHES = {
        **settings.CACHES,
        # Nothing listens on port 1.
        "default": {
            "BACKEND": "matrix.cache.TolerantRedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
        },
    }
    for url, status in expected.items():
        assert status == 200
        assert client.get(url).status_code == 200, url


def test_readers_that_miss_together_wait_for_the_one_computing(monkeypatch):
    """Another web worker holds the read's lock and answers shortly: this
    reader takes its answer instead of computing the read again."""
    import threading

    from django.core.cache import cache

    from matrix import cache as reads

    key = reads.read_key("test-read", uuid.uuid4().hex)
    cache.add(key + ":computing", 1, 30)
    threading.Timer(0.05, lambda: cache.set(key, "their answer")).start()

    def compute():
        raise AssertionError("computed a read another worker was computing")

    assert reads.cached_read(key, compute) == "their answer"


def test_a_reader_computes_itself_when_the_other_never_answers(monkeypatch):
    from django.core.cache import cache

    from matrix import cache as reads

    monkeypatch.setattr(reads, "COMPUTE_WAIT_S", 0.05)
    key = reads.read_key("test-read", uuid.uuid4().hex)
    cache.add(key + ":computing", 1, 30)
    assert reads.cached_read(key, lambda: "mine") == "mine"
    assert cache.get(key) == "mine"


def test_an_unreachable_cache_makes_no_reader_wait(settings, monkeypatch):
    from matrix import cache as reads

    settings.CACHES = {
        **settings.CACHES,
        "default": {
            "BACKEND": "matrix.cache.TolerantRedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
        },
    }

    def no_waiting(seconds):
        raise AssertionError("waited on a cache that cannot answer")

    monkeypatch.setattr(reads.time, "sleep", no_waiting)
    assert reads.cached_read("test-read:down", lambda: "computed") == "computed"


def test_a_page_view_builds_no_redis_client(client, results, shared_cache):
    # Django's client built a redis.Redis (and its few hundred response
    # callbacks) for every get and set: a fifth of a view served from the
    # cache. One per pool is kept and shared.
    client.get(reverse("matrix"))
    built = []
    original = redis.Redis.__init__

    def counted(self, *args, **kwargs):
        built.append(1)
        original(self, *args, **kwargs)

    redis.Redis.__init__ = counted
    try:
        assert client.get(reverse("matrix")).status_code == 200
    finally:
        redis.Redis.__init__ = original
    assert built == []


def _other_process(prefix: str):
    """The shared cache as another web process holds it: its own client,
    its own values kept near."""
    from matrix.cache import TolerantRedisCache

    return TolerantRedisCache(
        local_redis(),
        {
            "KEY_PREFIX": prefix,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        },
    )


def test_a_process_keeps_what_it_read_for_near_s_then_reads_redis_again(
    shared_cache, monkeypatch
):
    import time

    from django.core.cache import cache

    from matrix import cache as reads

    _, prefix = shared_cache
    monkeypatch.setattr(reads, "NEAR_S", 0.2)
    other = _other_process(prefix)
    other.set("catalogue", "before", 60)
    assert cache.get("catalogue") == "before"
    other.set("catalogue", "after", 60)
    # Within NEAR_S this process answers from what it holds, without Redis.
    assert cache.get("catalogue") == "before"
    time.sleep(0.25)
    assert cache.get("catalogue") == "after"


def test_what_this_process_writes_or_deletes_it_reads_at_once(shared_cache):
    from django.core.cache import cache

    cache.set("key", "first", 60)
    assert cache.get("key") == "first"
    cache.set("key", "second", 60)
    assert cache.get("key") == "second"
    cache.delete("key")
    assert cache.get("key") is None
    cache.set("key", "third", 60)
    cache.clear()
    assert cache.get("key") is None


def test_each_read_of_a_value_kept_near_is_its_own_copy(shared_cache):
    from django.core.cache import cache

    cache.set("rows", [1, 2], 60)
    cache.get("rows").append(3)
    assert cache.get("rows") == [1, 2]


def test_a_process_keeps_at_most_near_bytes(shared_cache, monkeypatch):
    from django.core.cache import cache

    from matrix import cache as reads

    monkeypatch.setattr(reads, "NEAR_BYTES", 3_500)
    for i in range(6):
        cache.set(f"page-{i}", "x" * 1_000, 60)
        cache.get(f"page-{i}")
    held = cache._cache
    assert held._near_bytes <= 3_500
    assert len(held._near) <= 3
    # The oldest went first, and is still read from Redis.
    assert not any(key.endswith(":page-0") for key in held._near)
    assert cache.get("page-0") == "x" * 1_000


def test_an_earlier_answer_is_given_only_while_the_one_computing_is_recent(
    monkeypatch,
):
    """A request that died computing the new answer leaves its lock behind:
    its readers compute the answer themselves, not the old one for as long
    as the lock lasts."""
    import time

    from django.core.cache import cache

    from matrix import cache as reads

    read = uuid.uuid4().hex
    older = reads.read_key("test-read", read, version=1)
    assert reads.answer_read(older, lambda: "old") == (older, "old")
    newer = reads.read_key("test-read", read, version=2)
    cache.add(newer + ":computing", time.time(), 30)
    assert reads.answer_read(newer, lambda: "new") == (older, "old")
    monkeypatch.setattr(reads, "COMPUTE_WAIT_S", 0.05)
    cache.set(newer + ":computing", time.time() - 60, 30)
    assert reads.answer_read(newer, lambda: "new") == (newer, "new")
    assert reads.answer_read(newer, lambda: "again") == (newer, "new")
