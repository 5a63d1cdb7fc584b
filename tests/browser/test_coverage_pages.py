"""The coverage pages in a real browser: matrix, filters, keyboard, cell,
gaps, error groups."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_matrix_opens_filters_and_moves_by_keyboard(tab, results):
    page = tab.page
    tab.open("/")
    assert page.locator("table.matrix tbody.operator").count() == 3

    gemm = page.locator("#op-gemm a.toggle")
    gemm.click()
    page.wait_for_selector("#op-gemm tr.shape-row")
    assert page.locator("#op-gemm a.toggle").get_attribute("aria-expanded") == "true"
    assert "pass" in page.locator("#op-gemm tr.shape-row").first.inner_text()

    # Arrow keys walk from the toggle into the summary row and down into cells.
    page.locator("#op-gemm a.toggle").focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    focused = page.evaluate("document.activeElement.closest('tr').className")
    assert focused == "shape-row"
    href = page.evaluate("document.activeElement.getAttribute('href')")
    assert href.startswith("/cells/")

    page.select_option("select[name=backend]", "cuda")
    page.wait_for_url("**backend=cuda**")
    page.wait_for_function(
        "!document.querySelector('#matrix').textContent.includes('MI300X')"
    )
    assert "H200" in page.locator("#matrix thead").inner_text()
    assert tab.errors == []


def test_a_cell_shows_its_evidence(tab, results):
    page = tab.page
    tab.open(f"/?open={results['top'].operator.name}")
    page.locator(
        f"#op-{results['top'].operator.name} tr.shape-row td.c.k-pass a"
    ).first.click()
    page.wait_for_selector("h2#history")
    tab.open(page.url.removeprefix(tab.base_url))  # timed, like every page
    # Kernel and reference time on one chart, the relative error on another.
    assert page.locator("svg.chart polyline").count() == 3
    assert "python -m runners.harness job.json" in page.inner_text("#repro-cmd")
    assert '"operator"' in page.inner_text("#job-json")
    assert tab.errors == []


def test_the_error_groups_and_gaps_pages(tab, results, cpu_runner):
    page = tab.page
    tab.open("/errors/")
    assert "2 cells" in page.inner_text(".error-group h2")
    tab.open("/gaps/")
    assert page.locator("table.gaps tbody tr").count() > 0
    tab.screenshot("gaps")
    assert tab.errors == []
