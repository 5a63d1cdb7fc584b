"""Where the keyboard lands after an htmx action replaces what it pressed,
and what the URL keeps of the page's state for Back and refresh."""

from __future__ import annotations

from unittest import mock

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FOCUSED_TEXT = "document.activeElement.textContent.trim()"


@pytest.fixture
def no_broker():
    """The live server runs in this process: planning's publish is skipped."""
    with mock.patch("matrix.fleet.services.planning.jobs_publish"):
        yield


def test_run_missing_puts_the_keyboard_on_the_sweep_it_started(
    tab, results, cpu_runner, sweeper, no_broker
):
    page = tab.page
    tab.login("sweeper", "sweeper-pass-123")
    tab.open("/gaps/?backend=c")
    page.once("dialog", lambda dialog: dialog.accept())
    page.focus("button:has-text('Run missing')")
    page.keyboard.press("Enter")
    page.wait_for_selector("#sweep-slot .sweep")
    page.wait_for_function(
        "() => document.activeElement.closest('#sweep-slot') !== null",
        timeout=3_000,
    )
    assert page.evaluate(FOCUSED_TEXT).startswith("Sweep ")
    # The list reloads and no longer offers the cells just queued.
    page.wait_for_selector("#gap-list:has-text('already have a job queued')")
    assert page.locator("button:has-text('Run missing')").count() == 0


def test_run_missing_on_cells_already_queued_focuses_the_answer(
    tab, results, cpu_runner, sweeper, no_broker
):
    page = tab.page
    tab.login("sweeper", "sweeper-pass-123")
    tab.open("/gaps/?backend=c")
    # Another tab queues the same cells first.
    other = page.context.new_page()
    other.goto(tab.base_url + "/gaps/?backend=c")
    other.once("dialog", lambda dialog: dialog.accept())
    other.click("button:has-text('Run missing')")
    other.wait_for_selector("#sweep-slot .sweep")
    other.close()
    page.once("dialog", lambda dialog: dialog.accept())
    page.focus("button:has-text('Run missing')")
    page.keyboard.press("Enter")
    page.wait_for_selector("#sweep-slot:has-text('Nothing new to plan')")
    page.wait_for_function(
        "() => document.activeElement.closest('#sweep-slot') !== null",
        timeout=3_000,
    )
    assert page.evaluate(FOCUSED_TEXT).startswith("Nothing new to plan")


def test_an_open_operator_stays_open_on_back_and_refresh(tab, results):
    page = tab.page
    tab.open("/")
    page.click("#op-gemm a.toggle")
    page.wait_for_selector("#op-gemm tr.shape-row")
    assert "open=gemm" in page.url
    page.locator("#op-gemm tr.shape-row td.c a").first.click()
    page.wait_for_selector("h2#history")
    page.go_back()
    page.wait_for_selector("#op-gemm tr.shape-row")
    assert page.get_attribute("#op-gemm a.toggle", "aria-expanded") == "true"
    page.reload()
    page.wait_for_selector("#op-gemm tr.shape-row")
    # Collapsing is recorded too.
    page.click("#op-gemm a.toggle")
    page.wait_for_selector("#op-gemm a.toggle[aria-expanded=false]")
    assert "open=gemm" not in page.url
    page.reload()
    assert page.locator("#op-gemm tr.shape-row").count() == 0


def test_show_more_puts_the_keyboard_on_the_first_row_it_added(tab, results):
    page = tab.page
    tab.open("/?open=gemm&rows=2")
    assert page.locator("#op-gemm tr.shape-row").count() == 2
    page.focus("#op-gemm a:has-text('more of the')")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.querySelectorAll('#op-gemm tr.shape-row').length > 2"
    )
    page.wait_for_function("() => document.activeElement.closest('tr.shape-row')")
    third = page.evaluate(
        "Array.from(document.querySelectorAll('#op-gemm tr.shape-row'))"
        ".indexOf(document.activeElement.closest('tr'))"
    )
    assert third == 2


def test_the_toggle_keeps_the_keyboard_when_it_was_pressed(tab, results):
    page = tab.page
    tab.open("/")
    page.focus("#op-gemm a.toggle")
    page.keyboard.press("Enter")
    page.wait_for_selector("#op-gemm tr.shape-row")
    page.wait_for_function(
        "() => document.activeElement.matches('#op-gemm a.toggle[aria-expanded=true]')"
    )


def test_a_wrong_password_puts_the_keyboard_on_the_alert(tab, admin_user):
    page = tab.page
    tab.open("/login/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "not-the-password")
    page.click("button[type=submit]")
    page.wait_for_selector("#login-error[role=alert]")
    assert page.evaluate("document.activeElement.id") == "login-error"
