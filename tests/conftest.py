"""Shared fixtures: three personas (owner, reviewer, outsider; viewers all)
and a small catalogue. Real services are used when DATABASE_URL / CELERY_BROKER_URL name
them (CI runs the suite once embedded and once against PostgreSQL + Redis)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# The slowest files go first, longest first: a file stays on one worker with
# --dist loadfile, and a long one handed out last runs on alone while the
# other workers idle. The Makefile passes --no-loadscope-reorder, or
# pytest-xdist would hand files out by their number of tests instead.
# Seconds: a file's wall time in a make test pass on PostgreSQL on this
# 2-core machine, three workers (2026-12-08); refresh them when a file grows.
SLOW_FILES_FIRST = (
    "tests/runners/test_worker_e2e.py",  # 202 s
    "tests/kernels/test_gpu_lowering.py",  # 112 s
    "tests/security/test_forged_verdicts.py",  # 109 s
    "tests/browser/test_run_missing.py",  # 97 s
    "tests/harness/test_submitted.py",  # 92 s
    "tests/deploy/test_slow_clients.py",  # 91 s
    "tests/browser/test_decisions_in_processes.py",  # 90 s
    "tests/runners/test_bisection_e2e.py",  # 84 s
    "tests/foundation/test_smoke.py",  # 82 s
    "tests/runners/test_broker_restart_e2e.py",  # 78 s
    "tests/security/test_permission_matrix.py",  # 64 s
    "tests/security/test_sandbox_escapes.py",  # 63 s
    "tests/gate/test_bisection_cpu.py",  # 62 s
    "tests/browser/test_pages_at_two_widths.py",  # 60 s
    "tests/harness/test_error_signatures.py",  # 59 s
    "tests/runners/test_broker_isolation_e2e.py",  # 56 s
    "tests/security/test_form_fuzz.py",  # 49 s
    "tests/foundation/test_migrations.py",  # 48 s
    "tests/security/test_native_code.py",  # 46 s
    "tests/runners/test_broker_isolation.py",  # 45 s
    "tests/gate/test_views_upgrades.py",  # 43 s
    "tests/browser/test_sessions_and_narrow_screens.py",  # 42 s
    "tests/runners/test_several_hosts_e2e.py",  # 40 s
    "tests/gate/test_real_ab.py",  # 38 s
    "tests/harness/test_distributions.py",  # 38 s
    "tests/runners/test_command_runner.py",  # 38 s
    "tests/gate/test_demo_upgrade.py",  # 38 s
    "tests/harness/test_warm_children.py",  # 33 s
    "tests/browser/test_runners_page.py",  # 33 s
    "tests/runners/test_runner_requests.py",  # 32 s
    "tests/runners/test_run_dev_e2e.py",  # 29 s
    "tests/ui/test_matrix_filters.py",  # 29 s
    "tests/runners/test_agent_without_the_server.py",  # 28 s
    "tests/runners/test_ingest_queues_e2e.py",  # 27 s
    "tests/runners/test_disk_full_e2e.py",  # 26 s
    "tests/gate/test_sustained.py",  # 25 s
    "tests/alerts/test_detection.py",  # 23 s
    "tests/security/test_web.py",  # 22 s
    "tests/kernels/test_decode_variants.py",  # 22 s
    "tests/runners/test_runner_approval.py",  # 22 s
    "tests/gate/test_manifest_cache.py",  # 21 s
    "tests/browser/test_focus_and_history.py",  # 21 s
    "tests/harness/test_cli.py",  # 20 s
)


def pytest_collection_modifyitems(items):
    rank = {path: n for n, path in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(autouse=True, scope="session")
def fast_password_hashing():
    """Users are made, and log in, in most tests: PBKDF2 at full strength
    took about 0.4 s a password here, 3 s of every test that makes one user
    per role. Processes a test starts (make run, a deployment) keep the
    real hasher."""
    from django.conf import settings

    if not settings.configured:
        yield
        return
    from django.test import override_settings

    with override_settings(
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]
    ):
        yield


@pytest.fixture(autouse=True, scope="session")
def flush_by_delete():
    """A transactional test (a live server, a browser) ends by emptying every
    table. On PostgreSQL Django does that with one TRUNCATE of all 51, which
    makes new files for each table and its indexes and drops the old ones at
    commit: 0.45 s on an idle host, 1.6-1.8 s with the cores busy, and 3-5 s
    a test in a whole pass. DELETE FROM each table, with the foreign keys
    (deferrable, as Django makes them) checked at commit, leaves the same
    empty tables in 0.03-0.09 s. Sequences are not reset either way, unless
    a test asks (then it is Django's own statement)."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return truncate(
                self,
                style,
                tables,
                reset_sequences=reset_sequences,
                allow_cascade=allow_cascade,
            )
        return [
            "SET CONSTRAINTS ALL DEFERRED",
            *(f"DELETE FROM {self.quote_name(table)}" for table in tables),
        ]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = truncate


@pytest.fixture(autouse=True)
def empty_cache():
    """Reads are cached by data version, and database ids repeat between
    tests: each test starts with an empty cache (a warm one left by another
    test would answer with its data, and hide queries a cold page makes).
    The GPU host runs the harness's tests without pytest-django: no
    settings, no cache."""
    from django.conf import settings

    if not settings.configured:
        yield
        return
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def no_warm_children_left():
    """Harness children kept warm by a test end with it: the next test may
    start them with another environment, and each holds its memory."""
    yield
    from runners.harness import warm

    warm.end_all()


def _viewer(user):
    """Every persona can read (the viewer role); rights beyond that are
    granted by the tests that need them."""
    from django.contrib.auth.models import Group

    user.groups.add(Group.objects.get(name="viewer"))
    return user


@pytest.fixture
def owner(django_user_model):
    return _viewer(
        django_user_model.objects.create_user("owner", password="owner-pass-123")
    )


@pytest.fixture
def reviewer(django_user_model):
    return _viewer(
        django_user_model.objects.create_user("reviewer", password="reviewer-pass-123")
    )


@pytest.fixture
def outsider(django_user_model):
    return _viewer(
        django_user_model.objects.create_user("outsider", password="outsider-pass-123")
    )


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser("root", password="root-pass-123")


@pytest.fixture
def catalog(db):
    """The demo catalogue, as `make run` seeds it."""
    from matrix.services import catalog_seed

    catalog_seed()
    return catalog


@pytest.fixture(scope="session")
def chromium():
    """Debian's headless Chromium, one per test session: Playwright's sync API
    runs an event loop in this thread, and a second one would collide."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
    # The live server's database access happens in its own thread, and the
    # fixtures' in this one outside any coroutine.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def server_http(monkeypatch):
    """The runner's HTTP client answered in process: a request to
    http://testserver goes through this test's URLconf and views (Django's
    test client) instead of a socket; other URLs go out as they would.
    Returns the (url, body) posted to http://testserver."""
    import json

    from django.test import Client

    from runners import client

    browser, posted, real = Client(), [], client.post_json

    def post_json(url, body, timeout=60):
        if not url.startswith("http://testserver/"):
            return real(url, body, timeout)
        posted.append((url, body))
        response = browser.post(
            url.removeprefix("http://testserver"),
            data=json.dumps(body),
            content_type="application/json",
        )
        return response.status_code, response.json()

    monkeypatch.setattr(client, "post_json", post_json)
    return posted
