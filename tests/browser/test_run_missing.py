"""The whole loop, as a newcomer runs it, from an empty database: the lab
admin registers a CPU runner hosting TileLang 0.1.13 and 0.1.15 and approves
it on the Runners page, runs the missing cells of both toolchains from the
gaps page to 100% with real results, proposes the upgrade, two demo reviewers
approve it with the passwords printed once, and the manifest serves TileLang
only where it passed and is fast enough; production's dispatcher follows it.
Every process is real (web server, control worker, runner worker with the
sandboxed harness, embedded broker); only the browser drives it."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from tests.browser.conftest import Page
from tests.runners.cluster import Cluster, wait_for

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
PYTHON_0113 = REPO / "var" / "toolchains" / "tilelang-0.1.13" / "bin" / "python"
ADMIN = ("labadmin", "lab-admin-pass-123")
# The served catalogue of this deployment: the ten float32 shapes the CPU
# runs in seconds (the demo's model profile serves half-precision shapes,
# which the c kernels take as unsupported; they are not what this tests).
SMALL_SERVED = (
    "from matrix.models import Shape; "
    "Shape.objects.update(served=False); "
    "Shape.objects.filter(source_profile='cpu-smoke').update(served=True, weight=5.0)"
)
SPEED = re.compile(r"([\d.]+)× of the reference")


@pytest.fixture
def cluster():
    assert PYTHON_0113.exists(), "no TileLang 0.1.13 toolchain: run `make toolchains`"
    cluster = Cluster(harness="real")
    try:
        cluster.env.update(
            DJANGO_SUPERUSER_USERNAME=ADMIN[0], DJANGO_SUPERUSER_PASSWORD=ADMIN[1]
        )
        cluster.manage("ensure_admin")
        cluster.reviewers = cluster.demo_reviewers()
        cluster.manage("shell", "-c", SMALL_SERVED)
        cluster.start_web()
        cluster.start_control()
        yield cluster
    finally:
        cluster.close()


def test_a_newcomer_runs_the_whole_loop(chromium, cluster):
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

        # Absolute, not resolved: a venv's python is a link to its base.
        cluster.manage(
            "runner", "register", "--server", cluster.server, "--token", token,
            "--name", "cpu-ui", "--key-dir", str(cluster.key_dir("cpu-ui")),
            "--python", sys.executable, "--python", str(PYTHON_0113),
        )  # fmt: skip
        tab.open("/runners/")
        row = page.locator("tr", has_text="cpu-ui")
        assert "pending approval" in row.inner_text()
        row.locator("button", has_text="Approve").click()
        page.wait_for_selector("tr:has-text('cpu-ui') .badge.active")
        # The default harness: the real sandboxed TileLang run.
        cluster.start_runner("cpu-ui")
        wait_for(
            lambda: cluster.runner_state("cpu-ui") == "online",
            timeout=90,
            what="cpu-ui online",
        )
        tab.open("/runners/")
        assert "online" in page.locator("tr", has_text="cpu-ui").inner_text()
        tab.screenshot("runners")

        toolchains = {
            version: (pk, name)
            for pk, version, name in cluster.sql(
                "SELECT id, tilelang_version, name FROM matrix_toolchain"
            )
        }
        ((cpu,),) = cluster.sql("SELECT id FROM matrix_devicetype WHERE backend = 'c'")
        for version in ("0.1.13", "0.1.15"):
            name = toolchains[version][1]
            run_missing(tab, f"toolchain={name}&backend=c&dtype=float32")
            # Run, they stay gaps only where they fail: softmax does not
            # compile on c under 0.1.13.
            left = page.locator("#gap-list table.gaps tbody tr")
            if version == "0.1.13":
                wait_for(lambda rows=left: rows.count() == 2, timeout=30, what="2 gaps")
                assert all("softmax" in t for t in left.all_inner_texts())
            else:
                page.wait_for_selector("#gap-list:has-text('No gaps')")

        tab.open(
            f"/?toolchain={toolchains['0.1.15'][1]}&open=elementwise_add&backend=c"
            "&dtype=float32"
        )
        assert page.locator("#op-elementwise_add td.c.k-pass").count() == 2

        # CPU timings on a shared 2-core host swing between runs (a CI run
        # read rmsnorm 2.22x slower on one toolchain, ratio 2.22 +- 0.04,
        # while other tests took the cores): the admin's policy says so
        # before anyone proposes. This test is of the loop, not of speed.
        tab.open("/upgrades/policy/")
        page.fill("input[name=perf_budget]", "4.0")
        page.click("button:has-text('Save as v')")
        page.wait_for_selector("text=saved policy v2")
        tab.open("/upgrades/")
        page.click("text=Propose an upgrade")
        page.select_option("select[name=baseline]", str(toolchains["0.1.13"][0]))
        page.select_option("select[name=candidate]", str(toolchains["0.1.15"][0]))
        page.check(f"input[name=device_types][value='{cpu}']")
        page.fill("textarea[name=note]", "0.1.15 compiles softmax on c")
        page.click("text=Open proposal")
        # Judged on the results there are: both toolchains' are fresh.
        state = page.wait_for_selector(
            "[data-state=ready], [data-state=blocked], [data-state=collecting]",
            timeout=60_000,
        )
        assert state.get_attribute("data-state") == "ready", page.inner_text(
            "#gate-status"
        )
        proposal = page.url.rstrip("/").rsplit("/", 1)[-1]
        assert tab.errors == []
    finally:
        context.close()

    assert set(cluster.reviewers) == {"reviewer1", "reviewer2"}
    for n, (name, password) in enumerate(sorted(cluster.reviewers.items()), 1):
        context = chromium.new_context(viewport={"width": 1400, "height": 900})
        reviewer = Page(context.new_page(), cluster.server)
        try:
            reviewer.login(name, password)
            reviewer.open(f"/upgrades/{proposal}/")
            reviewer.page.check("input[name=decision][value=approve]")
            reviewer.page.fill("textarea[name=comment]", f"softmax compiles ({n})")
            if n == 2:
                # The last approval publishes the manifest: said, then ticked.
                said = reviewer.page.inner_text("#approve-preview")
                assert "Approving publishes the manifest for" in said
                assert "10 entries" in said
                reviewer.page.check("#approve-preview input[name=confirm]")
            reviewer.page.click("text=Submit decision")
            reviewer.page.wait_for_selector(f"text=softmax compiles ({n})")
            assert reviewer.errors == []
        finally:
            context.close()

    entries = cluster.manifest(toolchains["0.1.15"][1])["entries"]
    assert len(entries) == 10
    speeds = {key(e): speed_of(e) for e in entries}
    # With the default speed budget, TileLang only where it was measured at
    # least as fast as the reference; the reference elsewhere, with
    # how much slower it is, or why it is not served at all.
    for entry in entries:
        if entry["choice"] == "tilelang":
            assert entry["reason"].startswith("validated: pass"), entry
        else:
            assert SPEED.search(entry["reason"]) or "not timed" in entry["reason"]
    # The admin who serves what is within twice the reference's time on this
    # CPU says so; the approved manifest follows, cell by cell.
    timed = sorted(s for s in speeds.values() if s)
    assert timed[0] < timed[-1], speeds
    budget = 1 / math.sqrt(timed[0] * timed[-1]) - 1
    cluster.manage(
        "shell", "-c",
        "from django.contrib.auth import get_user_model; "
        "from matrix.gate.services import policy_save; "
        f"policy_save(by=get_user_model().objects.get(username={ADMIN[0]!r}), "
        f"speed_budget={max(budget, 0.0)!r})",
    )  # fmt: skip
    table = cluster.manifest(toolchains["0.1.15"][1])
    served = {key(e) for e in table["entries"] if e["choice"] == "tilelang"}
    kept = {key(e) for e in table["entries"] if e["choice"] == "reference"}
    assert served and kept, table["entries"]
    for entry in table["entries"]:
        if entry["choice"] == "reference":
            assert SPEED.search(entry["reason"]), entry
    production_dispatch(table, fast=min(served), slow=min(kept))


def run_missing(tab: Page, query: str) -> None:
    """Run the gaps of one toolchain's float32 CPU cells from the gaps page
    and watch the sweep reach 100%."""
    page = tab.page
    tab.open(f"/gaps/?{query}")
    assert page.locator("table.gaps tbody tr").count() == 10
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#run-missing button")
    progress = page.wait_for_selector("#sweep-slot .sweep")
    assert progress.query_selector("progress") is not None
    page.wait_for_selector("#sweep-slot .sweep:has-text('finished')", timeout=300_000)
    counts = page.inner_text("#sweep-slot .sweep-counts")
    assert "10 done" in counts and "0 failed" in counts, counts
    tab.screenshot("sweep-finished")


def key(entry: dict) -> tuple:
    return entry["operator"], json.dumps(entry["shape_rule"]["dims"])


def speed_of(entry: dict) -> float | None:
    found = SPEED.search(entry["reason"])
    return float(found.group(1)) if found else None


def production_dispatch(table: dict, *, fast: tuple, slow: tuple) -> None:
    """What production on this host does with the approved manifest: its
    toolchain's fingerprint and the library's revisions select TileLang for
    the cell that was fast enough and the reference for the slower one."""
    from runners.dispatch import (
        Dispatcher,
        host_toolchain_fingerprint,
        library_revisions,
    )

    (device_type,) = {e["device_type"] for e in table["entries"]}
    ran = []
    for operator, dims in (fast, slow):
        dispatcher = Dispatcher(
            table,
            device_type=device_type,
            toolchain_fingerprint=host_toolchain_fingerprint(),
            kernel_revisions=library_revisions(operator),
        )
        dispatcher.call(
            operator,
            json.loads(dims),
            "float32",
            tilelang=lambda: ran.append("tilelang"),
            reference=lambda: ran.append("reference"),
            args=(),
        )
    assert ran == ["tilelang", "reference"]
