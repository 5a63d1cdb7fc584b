"""A lab admin registers a CPU runner through the runners page, sees it come
online, runs the missing cells from the gaps page and watches the sweep
finish with real results: the whole deployment in subprocesses (web server,
control worker, runner worker with the real sandboxed harness)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import Page
from tests.runners.cluster import Cluster, wait_for

pytestmark = pytest.mark.browser

ADMIN = ("labadmin", "lab-admin-pass-123")
# Two small float32 shapes the CPU runs in seconds, made served so that they
# are gaps; filtered to float32 on the CPU column, nothing else is.
SMALL_SERVED = (
    "from matrix.models import Shape; "
    "Shape.objects.filter(source_profile='cpu-smoke', dims_key='M=7,N=33', "
    "operator__name__in=['elementwise_add', 'row_sum']).update(served=True, weight=5.0)"
)


@pytest.fixture
def cluster():
    cluster = Cluster(harness="real")
    try:
        cluster.env.update(
            DJANGO_SUPERUSER_USERNAME=ADMIN[0], DJANGO_SUPERUSER_PASSWORD=ADMIN[1]
        )
        cluster.manage("ensure_admin")
        cluster.manage("shell", "-c", SMALL_SERVED)
        cluster.start_web()
        cluster.start_control()
        yield cluster
    finally:
        cluster.close()


def test_register_a_runner_then_run_missing_cells_to_real_results(chromium, cluster):
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    tab = Page(context.new_page(), cluster.server)
    page = tab.page
    try:
        tab.login(*ADMIN)
        tab.open("/runners/")
        page.click("text=Register a runner")
        command = page.wait_for_selector("#register-cmd").inner_text()
        assert "manage.py runner register" in command
        token = command.split("--token ", 1)[1].split()[0]
        tab.screenshot("runners-token")

        cluster.manage(
            "runner", "register", "--server", cluster.server, "--token", token,
            "--name", "cpu-ui", "--key-dir", str(cluster.key_dir("cpu-ui")),
        )  # fmt: skip
        tab.open("/runners/")
        page.locator("tr", has_text="cpu-ui").locator(
            "button", has_text="Approve"
        ).click()
        page.wait_for_selector("tr:has-text('cpu-ui') .badge.active")
        # The default harness: the real sandboxed TileLang run.
        cluster.start_runner("cpu-ui")
        wait_for(
            lambda: cluster.runner_state("cpu-ui") == "online",
            timeout=90,
            what="cpu-ui online",
        )
        tab.open("/runners/")
        row = page.locator("tr", has_text="cpu-ui")
        assert "online" in row.inner_text()
        tab.screenshot("runners")

        tab.open("/gaps/?backend=c&dtype=float32")
        runnable = page.locator("table.gaps tbody tr").count()
        assert runnable == 2
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("button:has-text('Run missing')")
        progress = page.wait_for_selector("#sweep-slot .sweep")
        assert progress.query_selector("progress") is not None
        page.wait_for_selector(
            "#sweep-slot .sweep:has-text('finished')", timeout=240_000
        )
        counts = page.inner_text("#sweep-slot .sweep-counts")
        assert "2 done" in counts and "0 failed" in counts
        # The finished sweep refreshes the gap list: nothing is missing now.
        page.wait_for_selector("#gap-list:has-text('No gaps')")
        tab.screenshot("sweep-finished")

        tab.open("/?open=elementwise_add&backend=c&dtype=float32")
        assert page.locator("#op-elementwise_add td.c.k-pass").count() >= 1
        assert tab.errors == []
    finally:
        context.close()
