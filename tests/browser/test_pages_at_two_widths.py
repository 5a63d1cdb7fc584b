"""The pages an ML-infra engineer keeps open, in Chromium at a laptop's and a
phone's width, on the demo's own data (one seeded server for the module):
the Models page, the matrix with its speed-ups, filters and permalinks, the
cell and operator charts, honest times, toolchains named for what they are,
the layout, dark mode, and no console error or CSP violation anywhere."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.browser.demo import ADMIN, EVIDENCE, REVIEWERS, demo_server

pytestmark = pytest.mark.browser

WIDTHS = {"laptop": (1280, 800), "phone": (390, 844)}
# The times at which the H200 lab signed the demo's results, as the pages
# show a time ("2026-12-02 15:20:56").
SIGNED_TIMES = {
    envelope["issued_at"][:19].replace("T", " ")
    for path in EVIDENCE
    for envelope in json.load(open(path))["results"]
}
# Records what the browser refused under the Content-Security-Policy: the
# console error says so too, this keeps the directive.
CSP_PROBE = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


@pytest.fixture(scope="module")
def demo():
    with demo_server() as server:
        yield server


class Tab:
    def __init__(self, context, demo):
        self.context = context
        self.page = context.new_page()
        self.demo = demo
        self.errors: list[str] = []
        self.page.on(
            "console",
            lambda m: self.errors.append(m.text) if m.type == "error" else None,
        )
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, path: str):
        response = self.page.goto(self.demo.url + path, wait_until="load")
        assert response is not None and response.ok, f"{path}: {response.status}"
        return response

    def clean(self, path: str = "") -> None:
        violations = self.page.evaluate("window.__csp || []")
        assert violations == [], f"{path}: CSP violations {violations}"
        assert self.errors == [], f"{path}: console errors {self.errors}"

    def rect(self, selector: str) -> dict:
        return self.page.eval_on_selector(
            selector,
            "e => { const r = e.getBoundingClientRect();"
            " return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,"
            " width: r.width, height: r.height}; }",
        )


def log_in(tab: Tab, username: str, password: str) -> None:
    tab.open("/login/")
    tab.page.fill("input[name=username]", username)
    tab.page.fill("input[name=password]", password)
    tab.page.click("main button[type=submit]")
    tab.page.wait_for_url(tab.demo.url + "/")


@pytest.fixture(scope="module", params=list(WIDTHS))
def tab(request, chromium, demo):
    """One signed-in admin tab per width, shared by the module's tests."""
    width, height = WIDTHS[request.param]
    context = chromium.new_context(viewport={"width": width, "height": height})
    context.add_init_script(CSP_PROBE)
    tab = Tab(context, demo)
    tab.width = width
    log_in(tab, *ADMIN)
    yield tab
    context.close()


@pytest.fixture
def fresh(tab):
    """The shared tab, with what earlier tests logged cleared."""
    tab.errors.clear()
    yield tab
    tab.clean(tab.page.url)


def cell_path(demo_tab: Tab, operator: str, backend: str) -> str:
    """The first cell link of an expanded operator in one backend's column."""
    demo_tab.open(f"/?served=1&backend={backend}&open={operator}")
    return demo_tab.page.get_attribute(f"#op-{operator} tr.shape-row td.c a", "href")


def test_every_page_logs_no_console_error_or_csp_violation(fresh, demo):
    cell = cell_path(fresh, "rmsnorm", "cuda").split("?")[0]
    paths = [
        "/",
        "/?served=1&open=gemm&open=softmax",
        "/models/",
        "/models/?model=llama-3-8b",
        "/operators/gemm/",
        "/operators/gemm/revisions/",
        cell,
        "/gaps/",
        "/errors/",
        "/runners/",
        f"/sweeps/{demo.sweep_id}/",
        "/upgrades/",
        f"/upgrades/{demo.proposal_id}/",
        "/upgrades/new/",
        "/submissions/",
        "/?status=bogus",
    ]
    for path in paths:
        response = fresh.open(path)
        assert "content-security-policy" in response.headers
        fresh.clean(path)
        width = fresh.page.evaluate("document.documentElement.scrollWidth")
        assert width <= fresh.width, f"{path} is {width}px wide at {fresh.width}px"


def test_the_nav_says_what_the_readme_says(fresh):
    fresh.open("/")
    links = fresh.page.locator("header.top nav a").all_inner_texts()
    assert links[:8] == [
        "Matrix",
        "Models",
        "Gaps",
        "Alerts",
        "Error groups",
        "Runners",
        "Submissions",
        "Upgrades",
    ]
    # Two short rows at most, never a tall column.
    assert fresh.rect("header.top")["height"] < 110
    edges = fresh.page.eval_on_selector_all(
        "header.top a, header.top button",
        "els => els.map(e => e.getBoundingClientRect().right)",
    )
    assert max(edges) <= fresh.width


def test_the_models_page_adds_up_each_models_forward_step(fresh):
    fresh.open("/models/")
    rows = fresh.page.locator("table.models tbody tr")
    assert rows.count() == 3
    llama = rows.filter(has_text="llama-3-8b").first
    # The H200 column: most of Llama's calls run TileLang; slow passes fall
    # back to the reference; only the softmax calls are not validated (its
    # kernel was fixed after the H200 evidence), under 1% of the calls.
    h200 = llama.locator("td.share").first.inner_text()
    assert re.search(r"\d+% TileLang · \d+% reference · <1% not validated", h200)
    # The compile-only ROCm column: lowered everywhere, validated nowhere.
    rocm = llama.locator("td.share").nth(1).inner_text()
    assert "0% TileLang" in rocm and "100% not validated" in rocm


def test_the_biggest_missing_pieces_lead_to_their_cells_and_to_run_missing(fresh, demo):
    fresh.open("/models/?model=llama-3-8b")
    section = fresh.page.locator("section.model-device", has_text="MI300X")
    first = section.locator("table.pieces tbody tr").first
    assert "lowered only, not run on the device" in first.inner_text()
    run = section.locator("a.button", has_text="Run missing for these")
    count = int(re.search(r"these (\d+) cells", run.inner_text()).group(1))
    href = run.get_attribute("href")
    query = parse_qs(urlsplit(href).query)
    assert query["model"] == ["llama-3-8b"] and query["device"]
    run.click()
    fresh.page.wait_for_url("**/gaps/**")
    gaps = fresh.page.locator("table.gaps tbody tr")
    assert 0 < gaps.count() <= count
    assert all("MI300X" in t for t in gaps.locator("td:nth-child(4)").all_inner_texts())
    # The filters the link set stay set on the gaps page's form.
    assert fresh.page.input_value("select[name=model]") == "llama-3-8b"
    fresh.page.go_back()
    fresh.page.wait_for_url("**/models/**")
    first_cell = section.locator("table.pieces tbody tr th a").first
    first_cell.click()
    fresh.page.wait_for_url("**/cells/**")
    assert "lowered" in fresh.page.inner_text("#verdict + p")


def test_a_permalink_opens_several_operators_and_the_toggles_keep_them(fresh):
    fresh.open("/?served=1&open=gemm&open=softmax")
    assert fresh.page.locator("tbody.operator.open").count() == 2
    fresh.page.click("#op-softmax a.toggle")
    fresh.page.wait_for_selector("#op-softmax:not(.open)")
    assert parse_qs(urlsplit(fresh.page.url).query)["open"] == ["gemm"]
    assert fresh.page.locator("#op-gemm.open tr.shape-row").count() > 0
    fresh.page.reload()
    assert fresh.page.locator("tbody.operator.open").count() == 1


def test_search_and_filters_stay_in_the_url(fresh):
    fresh.open("/?served=1&open=gemm")
    fresh.page.fill("input[name=q]", "M=1,")
    fresh.page.wait_for_url(re.compile(r".*q=M%3D1%2C.*"))
    fresh.page.wait_for_function(
        "[...document.querySelectorAll('#op-gemm tr.shape-row th')]"
        ".every(th => th.textContent.trim().startsWith('M=1,'))"
    )
    fresh.page.select_option("select[name=model]", "qwen2.5-7b")
    fresh.page.wait_for_url("**model=qwen2.5-7b**")
    fresh.page.wait_for_selector("#op-gemm tr.shape-row")
    shapes = fresh.page.locator("#op-gemm tr.shape-row th").all_inner_texts()
    assert shapes and all("N=152064" in s or "3584" in s for s in shapes)
    assert "open=gemm" in fresh.page.url


def test_an_unknown_filter_value_is_named_on_every_page(fresh):
    for path, note in [
        ("/?status=bogus", "Unknown status “bogus”"),
        ("/?toolchain=nope", "Unknown toolchain “nope”"),
        ("/models/?model=nope", "Unknown model “nope”"),
        ("/gaps/?operator=nope", "Unknown operator “nope”"),
    ]:
        fresh.open(path)
        assert note in fresh.page.inner_text("main"), path


def test_passing_cells_show_their_speed_up_without_colour_too(fresh):
    fresh.open("/?served=1&backend=cuda&open=gemm")
    marks = fresh.page.locator("#op-gemm td.c .sp").all_inner_texts()
    assert marks and all(re.fullmatch(r"[▲≈▼]\d+\.\d+×", m) for m in marks)
    assert any(m.startswith("▼") for m in marks) and any(
        m.startswith("▲") for m in marks
    )
    slow = fresh.page.locator("#op-gemm td.c:has(.sp-slower) a").first
    assert "production keeps the reference" in slow.get_attribute("title")


def test_operator_rows_count_every_status(fresh):
    fresh.open("/?served=1&backend=metal")
    summary = fresh.page.locator("#op-attention_causal td.summary span[title]").first
    assert summary.get_attribute("title") == "16 unsup."
    assert "16/16 unsup." in summary.inner_text()
    fresh.open("/?served=1&backend=hip")
    rocm = fresh.page.locator("#op-gemm td.summary span[title]").first
    assert "108/108 lowered" in rocm.inner_text()
    assert "0/108" not in rocm.inner_text()


def test_toolchains_are_named_for_what_they_are(fresh):
    fresh.open("/")
    options = fresh.page.locator("select[name=toolchain] option").all_inner_texts()
    assert any(
        o.startswith("TileLang 0.1.15 on h200-lab · torch 2.11.0 · driver nvidia")
        and o.endswith("(current)")
        for o in options
    )
    assert any(
        o.startswith("TileLang 0.1.15 on cpu-local · torch 2.13.0") for o in options
    )
    # The lab is known by its evidence: no approval waits behind a button.
    fresh.open("/runners/")
    lab = fresh.page.locator("tr", has_text="h200-lab").first.inner_text()
    assert "offline lab (evidence only)" in lab
    assert "pending approval" not in lab


def test_a_cell_shows_when_its_result_was_produced_and_charts_it(fresh):
    fresh.open(cell_path(fresh, "rmsnorm", "cuda"))
    produced = fresh.page.locator("dl.facts time").first
    # When the H200 lab signed the result, not when make run stored it.
    signed = produced.get_attribute("title")
    assert signed.removesuffix(" UTC") in SIGNED_TIMES, signed
    assert produced.inner_text().endswith("ago")
    assert "signed by h200-lab" in fresh.page.inner_text("dl.facts")
    chart = fresh.page.locator("svg.chart").first
    # A result under each TileLang release of the A/B: a kernel point and a
    # reference point for each.
    assert chart.locator("circle.kernel").count() == 2
    assert chart.locator("rect.reference").count() == 2
    assert fresh.rect("svg.chart")["right"] <= fresh.width
    scatter = fresh.page.locator("#across-shapes ~ figure svg.chart")
    assert scatter.locator(".point.this").count() == 1


def test_the_operator_page_charts_kernel_against_reference_across_shapes(fresh):
    fresh.open("/operators/gemm/")
    section = fresh.page.locator("section.device-speed", has_text="H200")
    assert re.search(r"\d+ faster, ≈\d+ at parity, ▼\d+ slower", section.inner_text())
    points = section.locator("svg.chart a")
    assert points.count() == 108
    # Each point opens its cell (the last one drawn is on top of any other).
    points.last.click()
    fresh.page.wait_for_url("**/cells/**")


def test_the_matrix_head_is_one_sticky_block_and_the_table_uses_the_width(fresh):
    if fresh.width < 500:
        pytest.skip("the laptop's layout")  # the phone's is the next test
    fresh.open("/?served=1&open=gemm")
    wrap = fresh.rect(".matrix-wrap")
    table = fresh.rect("table.matrix")
    assert table["width"] >= wrap["width"] - 4
    fresh.page.eval_on_selector(".matrix-wrap", "e => { e.scrollTop = 600; }")
    rows = fresh.page.eval_on_selector_all(
        "table.matrix thead tr",
        "rs => rs.map(r => { const b = r.getBoundingClientRect();"
        " return [b.top, b.bottom]; })",
    )
    # Each head row starts where the previous one ends: nothing shows between.
    for (_, bottom), (top, _) in zip(rows, rows[1:], strict=False):
        assert abs(top - bottom) < 1
    device = fresh.rect("table.matrix th.device")
    # Just under the backend row, across a device column: the head, not a
    # scrolled cell.
    hit = fresh.page.evaluate(
        f"document.elementFromPoint({device['left'] + 5}, {rows[0][1] + 0.5})"
        ".closest('thead') !== null"
    )
    assert hit


def test_on_a_phone_a_device_column_shows_on_the_first_screen(fresh):
    if fresh.width > 500:
        pytest.skip("the phone's layout")
    fresh.open("/?served=1")
    device = fresh.rect("table.matrix th.device")
    assert device["left"] < fresh.width and device["top"] < 844
    first = fresh.rect("table.matrix th.corner")
    assert first["width"] <= 0.45 * fresh.width


def test_runner_actions_are_reachable(fresh):
    fresh.open("/runners/")
    row = fresh.page.locator("#runner-list tr", has_text="cpu-local")
    for name in ("Maintenance", "Revoke"):
        button = row.locator("button", has_text=name)
        box = button.bounding_box()
        assert box and box["x"] + box["width"] <= fresh.width, name


def test_the_sweep_progress_bar_stays_in_its_box(fresh, demo):
    fresh.open(f"/sweeps/{demo.sweep_id}/")
    box = fresh.rect(".sweep")
    bar = fresh.rect(".sweep progress")
    assert bar["right"] <= box["right"] and bar["left"] >= box["left"]


def test_dark_mode_follows_the_system_setting(chromium, demo):
    context = chromium.new_context(
        color_scheme="dark", viewport={"width": 1280, "height": 800}
    )
    page = context.new_page()
    page.goto(demo.url + "/models/")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    text = page.evaluate("getComputedStyle(document.body).color")
    context.close()
    assert background == "rgb(13, 17, 23)" and text == "rgb(230, 237, 243)"


def test_a_decision_on_the_upgrade_page_breaks_no_policy(chromium, demo):
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    context.add_init_script(CSP_PROBE)
    reviewer = Tab(context, demo)
    log_in(reviewer, *REVIEWERS[1])
    reviewer.open(f"/upgrades/{demo.proposal_id}/")
    reviewer.page.check("input[name=decision][value=approve]")
    reviewer.page.fill("textarea[name=comment]", "the CPU column holds")
    reviewer.page.click("text=Submit decision")
    # No candidate result yet: the refusal comes back in the form, in words.
    reviewer.page.wait_for_selector("#decision-form [role=alert]")
    assert "cannot approve while" in reviewer.page.inner_text("#decision-form")
    reviewer.clean("upgrade decision")
    # The proposer is told why there is no form for them.
    proposer = Tab(chromium.new_context(), demo)
    log_in(proposer, *REVIEWERS[0])
    proposer.open(f"/upgrades/{demo.proposal_id}/")
    assert "You proposed this upgrade, so another reviewer must decide" in (
        proposer.page.inner_text("main")
    )
    proposer.context.close()
    context.close()
