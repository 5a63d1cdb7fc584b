"""The Alerts page and an alert's page in a real browser: a served cell that
fails on the current toolchain and passes on a newer release is listed as
one alert "fixed on candidate"; a reviewer presses Bisect on its page and
comes back to the named release. Results arrive through real ingest."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from matrix.models.alerts import Alert
from tests.alerts.conftest import (  # noqa: F401 (fixtures)
    COMPILE_ERROR,
    lab,
    register,
    run,
    served_shapes,
    server_key_file,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def alert(lab):  # noqa: F811 (the fixture imported above)
    hand, toolchains = lab
    shapes = served_shapes(3)
    run(hand, shapes, toolchains["0.1.13"], "compile_error", **COMPILE_ERROR)
    run(hand, shapes[:1], toolchains["0.1.14"], "compile_error", **COMPILE_ERROR)
    run(hand, shapes, toolchains["0.1.15"])
    return Alert.objects.get()


def test_an_alert_is_listed_fixed_on_candidate_and_bisected_from_its_page(
    tab, alert, reviewer
):
    reviewer.groups.add(Group.objects.get(name="reviewer"))
    page = tab.page
    tab.login("reviewer", "reviewer-pass-123")

    tab.open("/alerts/")
    row = page.locator("table.alerts tbody tr").first
    assert "compile error (sig-release) on the current toolchain" in row.inner_text()
    assert "fixed on candidate tilelang-0.1.15-cpu" in row.inner_text()
    assert "3 / 3" in row.inner_text()
    tab.screenshot("alerts-list-browser")

    row.locator(f'a[href="/alerts/{alert.pk}/"]').click()
    page.wait_for_selector("h1:has-text('Alert #')")
    assert "not bisected yet" in page.inner_text("#bisection")
    page.click("#bisect button")
    page.wait_for_url("**/bisections/*/")
    assert "TileLang 0.1.15" in page.inner_text("main")

    tab.open(f"/alerts/{alert.pk}/")
    said = page.inner_text("#bisection")
    assert "release named" in said
    assert "first good release: TileLang 0.1.15 (tilelang-0.1.15-cpu)" in said
    page.click("#bisection a")
    page.wait_for_url("**/bisections/*/")
    assert tab.errors == []
