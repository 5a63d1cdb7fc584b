"""Cached reads versioned by what they show (matrix.read_versions), in the
real Redis: a stored result moves the reads of its toolchain, device type
and operator, and leaves every other read served from the cache."""

from __future__ import annotations

import time

import pytest
from django.db import transaction
from django.urls import reverse

from matrix import read_versions
from matrix.events import results_stored
from matrix.models import Result, Status
from tests.ui.conftest import record
from tests.ui.test_shared_cache import shared_cache  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

MATRIX = "/api/v1/matrix"


@pytest.fixture
def every_read_a_new_window(monkeypatch):
    """Windows of a microsecond: each read takes the counters as they are."""
    monkeypatch.setattr(read_versions, "COALESCE_S", 1e-6)


def stored(django_capture_on_commit_callbacks, shape, device_type, toolchain, status):
    """A result as ingest leaves it, its ``results_stored`` sent inside its
    transaction, which then commits (the counters move on commit)."""
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        result = record(shape, device_type, toolchain, status)
        results_stored.send(sender=Result, results=[result])
    return result


def etag(client, **params) -> str:
    response = client.get(MATRIX, params)
    assert response.status_code == 200
    return response["ETag"]


def within_bound(read, changed):
    """``read()`` until ``changed(value)``, for at most the staleness bound
    the pages state (and a second more for this host's load): the reader
    after a change may be given the answer before while a thread computes
    the new one."""
    deadline = time.monotonic() + read_versions.STALE_BOUND_S + 1
    value = read()
    while not changed(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value


def main_of(response) -> str:
    """The page's content, without its frame (the CSRF token is masked
    anew on each view)."""
    html = response.content.decode()
    return html[html.index("<main>") : html.index("</main>")]


def mismatches_in(client, params) -> int:
    body = client.get(MATRIX, params | {"limit": 5000}).json()
    return sum(cell["status"] == "mismatch" for cell in body["cells"])


# A thread of the web process computes a moved read (matrix.cache): it reads
# what is committed, as in production.
@pytest.mark.django_db(transaction=True)
def test_a_result_moves_the_reads_of_its_toolchain_and_column_alone(
    client,
    results,
    toolchains,
    device_types,
    shared_cache,  # noqa: F811
    every_read_a_new_window,
    django_capture_on_commit_callbacks,
):
    old, current = toolchains
    cpu, cuda = device_types["c"], device_types["cuda"]
    reads = {
        "its column": {"toolchain": current.name, "device": cpu.pk},
        "its toolchain": {"toolchain": current.name},
        "another column": {"toolchain": current.name, "device": cuda.pk},
        "another toolchain": {"toolchain": old.name},
    }
    before = {name: etag(client, **params) for name, params in reads.items()}
    mismatches = mismatches_in(client, reads["its column"])
    assert before == {name: etag(client, **params) for name, params in reads.items()}

    stored(
        django_capture_on_commit_callbacks,
        results["second"],
        cpu,
        current,
        Status.MISMATCH,
    )
    for name in ("its column", "its toolchain"):
        moved = within_bound(
            lambda name=name: etag(client, **reads[name]),
            lambda tag, name=name: tag != before[name],
        )
        assert moved != before[name]
    after = {name: etag(client, **params) for name, params in reads.items()}
    assert after["another column"] == before["another column"]
    assert after["another toolchain"] == before["another toolchain"]
    shown = within_bound(
        lambda: mismatches_in(client, reads["its column"]),
        lambda n: n == mismatches + 1,
    )
    assert shown == mismatches + 1


@pytest.mark.django_db(transaction=True)
def test_within_a_window_readers_share_one_version_and_the_page_says_so(
    client,
    viewer,
    results,
    toolchains,
    device_types,
    shared_cache,  # noqa: F811
    django_capture_on_commit_callbacks,
    monkeypatch,
):
    client.force_login(viewer)
    now = [1000.0]
    monkeypatch.setattr(read_versions.time, "time", lambda: now[0])
    first = client.get(MATRIX).json()
    page = client.get(reverse("matrix")).content.decode()
    assert "Shown as of at most 2 s ago" in page

    stored(
        django_capture_on_commit_callbacks,
        results["second"],
        device_types["c"],
        toolchains[1],
        Status.MISMATCH,
    )
    # The same window: the answer kept for it, not computed again.
    assert client.get(MATRIX).json() == first
    now[0] += read_versions.COALESCE_S
    assert within_bound(lambda: client.get(MATRIX).json(), lambda a: a != first)


def test_a_lost_counter_starts_again_above_every_value_it_had(
    shared_cache,  # noqa: F811
):
    store, prefix = shared_cache
    key = read_versions.scope_key(7, device_type=3)
    read_versions.scopes_bump([key])
    read_versions.scopes_bump([key])
    before = read_versions._counter(key)
    for found in store.scan_iter(f"{prefix}:*scope:tc7:dt3"):
        store.delete(found)
    read_versions.scopes_bump([key])
    assert read_versions._counter(key) > before


def test_the_models_reads_are_computed_once_per_version(
    client,
    viewer,
    results,
    shared_cache,  # noqa: F811
    django_assert_max_num_queries,
):
    client.force_login(viewer)
    api = client.get("/api/v1/models")
    page = client.get(reverse("models"))
    assert api.status_code == page.status_code == 200
    # Kept: the session, the user, the catalogue's stamp and the operator;
    # no served call or cell is read again.
    with django_assert_max_num_queries(4):
        assert client.get("/api/v1/models").content == api.content
    with django_assert_max_num_queries(5):
        again = client.get(reverse("models"))
    assert main_of(again) == main_of(page)


def test_with_a_cache_per_process_a_result_shows_at_once(
    client, results, toolchains, device_types
):
    """The embedded default: no counter reaches the web processes, so the
    version is the newest result id, as before."""
    assert not read_versions.shared()
    before = etag(client, toolchain=toolchains[1].name)
    record(results["second"], device_types["c"], toolchains[1], Status.MISMATCH)
    assert etag(client, toolchain=toolchains[1].name) != before


def test_a_moved_read_is_answered_at_once_by_the_one_before_while_a_thread_computes(
    shared_cache,  # noqa: F811
    monkeypatch,
):
    import threading
    import uuid

    from django.core.cache import cache

    from matrix import cache as reads

    read = uuid.uuid4().hex
    older = reads.read_key("test-read", read, version=1)
    assert reads.answer_read(older, lambda: "old") == (older, "old")
    newer = reads.read_key("test-read", read, version=2)
    computing = threading.Event()

    def slow_new():
        computing.wait(5)
        return "new"

    # Answered by the one before, without waiting for the new one.
    assert reads.answer_read(newer, slow_new) == (older, "old")
    computing.set()
    value = within_bound(lambda: cache.get(newer), lambda v: v is not None)
    assert value == "new"
    assert reads.answer_read(newer, lambda: "again") == (newer, "new")


def test_an_answer_older_than_the_bound_is_not_given_for_a_moved_read(
    shared_cache,  # noqa: F811
    monkeypatch,
):
    import uuid

    from matrix import cache as reads

    read = uuid.uuid4().hex
    older = reads.read_key("test-read", read, version=1)
    reads.answer_read(older, lambda: "old")
    clock = time.time() + reads.REFRESH_WITHIN_S + 0.5
    monkeypatch.setattr(reads.time, "time", lambda: clock)
    newer = reads.read_key("test-read", read, version=2)
    assert reads.answer_read(newer, lambda: "new") == (newer, "new")


def test_jobs_the_reaper_gives_up_move_the_reads_of_their_column(
    results,
    toolchains,
    device_types,
    shared_cache,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    """A lost job's infra_error result is stored by the reaper, not ingest:
    its column's reads move all the same (the gaps stop showing it queued)."""
    from matrix.fleet.services.liveness import jobs_lose
    from matrix.models import ValidationJob

    current, cpu = toolchains[1], device_types["c"]
    shape = results["second"]
    job = ValidationJob.objects.create(
        revision=shape.operator.current_revision(cpu.backend),
        shape=shape,
        device_type=cpu,
        toolchain=current,
        state=ValidationJob.State.RUNNING,
    )
    column = read_versions.scope_key(current.pk, device_type=cpu.pk)
    before = read_versions._counter(column)
    other = read_versions.scope_key(current.pk, device_type=device_types["cuda"].pk)
    other_before = read_versions._counter(other)
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs_lose(jobs=[job], reason="runner went away") == 1
    assert read_versions._counter(column) > before
    assert read_versions._counter(other) == other_before
