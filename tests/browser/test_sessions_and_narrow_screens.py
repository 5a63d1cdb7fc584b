"""What the pages do around their edges: a session that ended in another tab,
an action the server refuses, the Back button after filtering, and a phone's
width."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from matrix.accounts.roles import RUNNER_ADMIN

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def runner_admin(django_user_model):
    user = django_user_model.objects.create_user("radmin", password="radmin-pass-123")
    user.groups.add(Group.objects.get(name=RUNNER_ADMIN))
    return user


def test_an_action_after_the_session_ended_opens_the_login_page(
    tab, runner_admin, cpu_runner
):
    page = tab.page
    tab.login("radmin", "radmin-pass-123")
    tab.open("/runners/")
    # Logged out in another tab, through the page a typed /logout/ shows.
    other = page.context.new_page()
    other.goto(tab.base_url + "/logout/")
    with other.expect_navigation():
        other.click("main button[type=submit]")
    assert "Log in" in other.inner_text("header.top")
    other.close()
    page.locator("#runner-list tr", has_text="cpu-host").locator(
        "text=Maintenance"
    ).click()
    page.wait_for_url("**/login/?next=/runners/")
    # The whole page is the login page, not a login form inside a table row.
    assert page.locator("input[name=username]").count() == 1
    assert page.locator("header.top").count() == 1
    tab.page.fill("input[name=username]", "radmin")
    tab.page.fill("input[name=password]", "radmin-pass-123")
    tab.page.click("button[type=submit]")
    page.wait_for_url("**/runners/")
    assert "cpu-host" in page.inner_text("#runner-list")


def test_a_refused_action_says_why(tab, runner_admin, cpu_runner):
    page = tab.page
    tab.login("radmin", "radmin-pass-123")
    tab.open("/runners/")
    # An admin takes the role away while the page is open.
    runner_admin.groups.set([Group.objects.get(name="viewer")])
    row = page.locator("#runner-list tr", has_text="cpu-host")
    row.locator("text=Maintenance").click()
    alert = page.locator("#request-error")
    alert.wait_for(state="visible")
    assert "403" in alert.inner_text()
    assert "managing runners needs runners.change_runner" in alert.inner_text()
    # Nothing changed, and the row is still the row.
    assert "Maintenance" in row.inner_text()
    cpu_runner.refresh_from_db()
    assert cpu_runner.health == cpu_runner.Health.ACTIVE
    page.click("#request-error [data-dismiss]")
    assert not alert.is_visible()
    tab.errors.clear()  # the browser logs the 403 itself


def test_back_after_filtering_shows_the_filters_the_table_was_drawn_with(
    tab, results, sweeper
):
    page = tab.page
    tab.login("sweeper", "sweeper-pass-123")
    tab.open("/")
    page.check("input[name=served]")
    page.wait_for_url("**served=1**")
    page.select_option("select[name=toolchain]", "tl-0.1.13")
    page.wait_for_url("**toolchain=tl-0.1.13**")
    page.go_back()
    page.wait_for_url(lambda url: "served=1" in url and "tl-0.1.13" not in url)
    page.wait_for_load_state("load")
    assert page.is_checked("input[name=served]")
    assert page.input_value("select[name=toolchain]") == "tl-0.1.15"


@pytest.mark.parametrize(
    "path",
    ["/", "/gaps/", "/errors/", "/runners/", "/upgrades/", "/submissions/", "/logout/"],
)
def test_every_page_fits_a_phone_screen(
    chromium, live_server, results, admin_user, path
):
    context = chromium.new_context(viewport=PHONE)
    page = context.new_page()
    page.goto(live_server.url + "/login/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "root-pass-123")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/")
    page.goto(live_server.url + path)
    page_width = page.evaluate("document.documentElement.scrollWidth")
    # Every navigation link is on screen, not pushed past its right edge.
    link_edges = page.eval_on_selector_all(
        "header.top a, header.top button",
        "els => els.map(e => e.getBoundingClientRect().right)",
    )
    context.close()
    assert page_width <= PHONE["width"], f"{path} is {page_width}px wide"
    assert max(link_edges) <= PHONE["width"]


def test_a_cell_and_its_chart_fit_a_phone_screen(
    chromium, live_server, results, device_types
):
    context = chromium.new_context(viewport=PHONE)
    page = context.new_page()
    top = results["top"]
    page.goto(f"{live_server.url}/cells/{top.pk}/{device_types['c'].pk}/")
    chart = page.eval_on_selector("svg.chart", "e => e.getBoundingClientRect().right")
    page_width = page.evaluate("document.documentElement.scrollWidth")
    context.close()
    assert chart <= PHONE["width"]
    assert page_width <= PHONE["width"], f"the cell page is {page_width}px wide"
