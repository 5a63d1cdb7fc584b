"""In a real browser: Run missing's preview before anything is queued, the
nvcc build choice changing it in place, and the list's pages."""

from __future__ import annotations

from unittest import mock

import pytest

from matrix.models import JobStage, Sweep

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def no_broker():
    """The live server runs in this process: planning's publish is skipped."""
    with mock.patch("matrix.fleet.services.planning.jobs_publish"):
        yield


def preview_stages(page) -> list[str]:
    return page.locator("#run-missing tbody th").all_inner_texts()


def test_the_preview_follows_the_build_choice_before_anything_is_queued(
    tab, results, cpu_runner, sweeper, no_broker
):
    cpu_runner.inventory = {**cpu_runner.inventory, "nvcc": True}
    cpu_runner.save()
    page = tab.page
    tab.login("sweeper", "sweeper-pass-123")
    tab.open("/gaps/?backend=cuda")
    assert preview_stages(page) == ["lower"]
    lowering = page.inner_text("#run-missing button")
    page.check("input[name=build]")
    page.wait_for_selector("#run-missing tbody th:text-is('build')")
    assert preview_stages(page) == ["build"]
    assert "build" in page.locator("table.gaps tbody").inner_text()
    # The keyboard stays on the choice the list was reloaded around.
    assert page.evaluate("document.activeElement.id") == "build-choice"
    # The same cells, built instead of lowered; nothing is queued yet.
    assert page.inner_text("#run-missing button") == lowering
    assert not Sweep.objects.exists()
    tab.screenshot("gaps-run-missing")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#run-missing button")
    page.wait_for_selector("#sweep-slot .sweep")
    assert set(Sweep.objects.get().jobs.values_list("stage", flat=True)) == {
        JobStage.BUILD
    }
    assert tab.errors == []


def test_the_list_pages_to_its_last_row(tab, results, cpu_runner, monkeypatch):
    monkeypatch.setattr("matrix.views.gaps.PAGE_SIZE", 10)
    page = tab.page
    tab.open("/gaps/")
    total = int(page.inner_text("#gap-summary strong"))
    assert page.inner_text("table.gaps caption") == f"Gaps 1–10 of {total}"
    page.click("nav.pager a[rel=next]")
    page.wait_for_selector("table.gaps caption:has-text('Gaps 11–20')")
    last = -(-total // 10)
    page.click(f"nav.pager a:text-is('{last}')")
    page.wait_for_selector(f"table.gaps caption:has-text('of {total}')")
    rows = page.locator("table.gaps tbody tr")
    assert rows.last.locator("td").first.inner_text() == str(total)
    assert page.locator("nav.pager a[rel=next]").count() == 0
    assert tab.errors == []
