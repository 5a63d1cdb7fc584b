"""Whole reader pages kept per data version: each signed-in reader still
sees their own name, their own working CSRF token and the navigation their
role gives; a notice for one reader is never served to another, nor kept."""

from __future__ import annotations

import re

import pytest
from django.contrib import messages
from django.contrib.auth.models import Group
from django.contrib.messages.storage.fallback import FallbackStorage
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client, RequestFactory
from django.urls import reverse
from django_htmx.middleware import HtmxDetails

from matrix.models import Status
from matrix.page_cache import _slots
from matrix.views.gaps import gaps_page
from tests.ui.conftest import record

pytestmark = pytest.mark.django_db

READER_PAGES = ["matrix", "errors", "gaps"]
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="(\w+)"')


def signed_in(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


@pytest.mark.parametrize("page", READER_PAGES)
def test_a_kept_page_shows_each_reader_their_own_name(page, results, viewer, owner):
    url = reverse(page)
    assert signed_in(viewer).get(url).templates, "the first view renders"
    kept = signed_in(owner).get(url)
    assert kept.status_code == 200
    assert not kept.templates, "the second reader's view runs no template"
    body = kept.content.decode()
    assert "owner ·" in body and "viewer ·" not in body
    assert not any(slot in body for slot in _slots())


def test_the_token_on_a_kept_page_is_the_readers_own_and_works(results, viewer, owner):
    signed_in(viewer).get(reverse("matrix"))
    client = signed_in(owner)
    body = client.get(reverse("matrix")).content.decode()
    (token,) = set(TOKEN.findall(body))
    assert f'"X-CSRFToken": "{token}"' in body
    # Logging out is a POST that needs the page's token.
    assert (
        client.post(reverse("logout"), {"csrfmiddlewaretoken": token}).status_code
        == 302
    )
    assert "owner ·" not in client.get(reverse("matrix")).content.decode()


def test_a_made_up_token_is_still_refused_after_a_kept_page(results, viewer):
    client = signed_in(viewer)
    client.get(reverse("matrix"))
    client.get(reverse("matrix"))
    forged = "a" * 64
    assert (
        client.post(reverse("logout"), {"csrfmiddlewaretoken": forged}).status_code
        == 403
    )


def test_the_admin_link_follows_the_reader_on_a_kept_page(results, viewer, admin_user):
    admin_page = reverse("admin:index")
    assert f'href="{admin_page}"' not in signed_in(viewer).get("/").content.decode()
    assert f'href="{admin_page}"' in signed_in(admin_user).get("/").content.decode()
    assert f'href="{admin_page}"' not in signed_in(viewer).get("/").content.decode()


def test_a_kept_page_shows_a_new_result_on_the_next_view(
    results, toolchains, device_types, viewer
):
    client = signed_in(viewer)
    first = client.get(reverse("errors")).content.decode()
    assert "tile shape does not divide M" in first
    _, current = toolchains
    record(
        results["top"],
        device_types["c"],
        current,
        Status.RUNTIME_ERROR,
        error_signature="cuda-launch-failed",
        error_message="CUDA error: an illegal memory access was encountered",
    )
    assert "illegal memory access" in client.get(reverse("errors")).content.decode()


def test_a_reader_with_a_notice_gets_their_page_rendered_not_the_kept_one(
    results, viewer, owner
):
    signed_in(viewer).get(reverse("gaps"))
    request = RequestFactory().get(reverse("gaps"))
    request.user = owner
    request.session = SessionStore()
    request._messages = FallbackStorage(request)
    request.htmx = HtmxDetails(request)
    messages.info(request, "Sweep 7 queued: 12 jobs")
    body = gaps_page(request).content.decode()
    assert "owner ·" in body
    # The notice is shown to its reader and never kept for another one.
    assert "Sweep 7 queued" in body
    assert (
        "Sweep 7 queued" not in signed_in(viewer).get(reverse("gaps")).content.decode()
    )


def test_a_reader_who_can_run_sweeps_gets_the_gaps_page_rendered(results, viewer):
    sweeper = viewer
    sweeper.groups.add(Group.objects.get(name="reviewer"))
    client = signed_in(sweeper)
    client.get(reverse("gaps"))
    # Run missing's plan follows the clock: never kept for this reader.
    assert client.get(reverse("gaps")).templates


@pytest.mark.parametrize("page", ["errors", "gaps"])
def test_a_kept_page_offers_a_new_host_in_its_filters(
    page, results, toolchains, viewer, monkeypatch
):
    from matrix import context_processors
    from matrix.fleet.models import Runner, RunnerToolchain

    # The filter choices are kept a few seconds for every page; here not at
    # all, so the page's key is all that could keep the old form.
    monkeypatch.setattr(context_processors, "CHOICES_SECONDS", 0)
    client = signed_in(viewer)
    assert "lab-host-7" not in client.get(reverse(page)).content.decode()
    lab = Runner.objects.create(name="lab-host-7", public_key="cd" * 32)
    RunnerToolchain.objects.create(
        runner=lab, toolchain=toolchains[1], interpreter="/usr/bin/python3"
    )
    assert "lab-host-7" in client.get(reverse(page)).content.decode()


def _another_reader_computes_every_answer(monkeypatch) -> None:
    """Another web worker holds the lock of every whole answer (a page, an
    API answer) for a new version and has not answered yet: a reader waits
    at most a moment for the reads inside one."""
    from django.core.cache import cache

    from matrix import cache as reads

    real_add = cache.add

    def add(key, *args, **kwargs):
        if key.endswith(":computing") and "@" in key:
            return False
        return real_add(key, *args, **kwargs)

    monkeypatch.setattr(cache, "add", add)
    monkeypatch.setattr(reads, "COMPUTE_WAIT_S", 0.05)


def _new_failure(results, toolchains, device_types) -> None:
    record(
        results["top"],
        device_types["c"],
        toolchains[1],
        Status.RUNTIME_ERROR,
        error_signature="cuda-launch-failed",
        error_message="CUDA error: an illegal memory access was encountered",
    )


def test_a_reader_arriving_while_another_renders_a_new_version_gets_the_page_before(
    results, toolchains, device_types, viewer, owner, monkeypatch
):
    signed_in(viewer).get(reverse("errors"))
    _new_failure(results, toolchains, device_types)
    _another_reader_computes_every_answer(monkeypatch)
    earlier = signed_in(owner).get(reverse("errors"))
    assert earlier.status_code == 200 and not earlier.templates
    body = earlier.content.decode()
    assert "tile shape does not divide M" in body
    assert "illegal memory access" not in body, "the page before the new result"
    assert "owner ·" in body, "still the reader's own frame"
    monkeypatch.undo()
    # Once nobody is computing it, the next view computes the new page.
    assert "illegal memory access" in (
        signed_in(owner).get(reverse("errors")).content.decode()
    )


def test_with_no_page_kept_before_a_reader_gets_the_new_version_itself(
    results, toolchains, device_types, viewer, monkeypatch
):
    _new_failure(results, toolchains, device_types)
    _another_reader_computes_every_answer(monkeypatch)
    body = signed_in(viewer).get(reverse("errors")).content.decode()
    assert "illegal memory access" in body


def test_a_page_given_from_the_version_before_is_not_kept_as_the_new_one(
    results, toolchains, device_types, viewer, monkeypatch
):
    """The reads inside a page name their version too: a page rendered while
    the new error groups were being computed elsewhere waits for them, so
    it never keeps the groups of the version before under the new key."""
    client = signed_in(viewer)
    client.get(reverse("errors"))
    _new_failure(results, toolchains, device_types)
    from django.core.cache import cache

    real_add = cache.add

    def add(key, *args, **kwargs):
        # The page's own lock is free; the groups' read is someone else's.
        if key.endswith(":computing") and ":page:" not in key and "@" in key:
            return False
        return real_add(key, *args, **kwargs)

    monkeypatch.setattr(cache, "add", add)
    from matrix import cache as reads

    monkeypatch.setattr(reads, "COMPUTE_WAIT_S", 0.05)
    assert "illegal memory access" in client.get(reverse("errors")).content.decode()
    monkeypatch.undo()
    assert "illegal memory access" in client.get(reverse("errors")).content.decode()
