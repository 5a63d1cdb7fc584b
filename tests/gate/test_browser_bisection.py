"""Bisect from a red diff row in headless Chromium: the button starts it, the
bisection page polls while its step's job runs and shows the conclusion
once the result is stored."""

from __future__ import annotations

import pytest

from matrix.bisection.services import bisection_results_record
from matrix.gate.services import proposal_open
from matrix.models import Bisection, Blob, Result, Status
from matrix.services import toolchain_register
from tests.gate.conftest import online_runner

pytestmark = pytest.mark.browser


def test_bisect_a_red_row_and_watch_it_name_the_release(
    transactional_db, live_server, chromium, world
):
    world.record("softmax", world.cpu, world.old, Status.PASS)
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    middle = toolchain_register(
        name="tilelang-0.1.14", components={"tilelang": "0.1.14"}
    )
    # A runner online with 0.1.14 (no worker behind it: the test answers
    # the step's job itself).
    online_runner("cpu-lab", device_types=[world.cpu], toolchains=[middle])
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    reviewer = world.reviewers[0]
    reviewer.set_password("browser-pass-123")
    reviewer.save()

    page = chromium.new_context().new_page()
    page.goto(f"{live_server.url}/login/?next=/upgrades/{proposal.pk}/")
    page.fill("input[name=username]", reviewer.username)
    page.fill("input[name=password]", "browser-pass-123")
    page.click("button[type=submit], input[type=submit]")
    page.click("tr.change-green_to_red >> text=Bisect")
    page.wait_for_url("**/bisections/*/")
    bisection = Bisection.objects.get()
    assert "Running: 2 of 3 releases answered" in page.inner_text("main")

    step = bisection.steps.get(job__isnull=False)
    result = Result.objects.create(
        job=step.job,
        attempt=1,
        revision=step.job.revision,
        shape=step.job.shape,
        device_type=step.job.device_type,
        toolchain=middle,
        status=Status.COMPILE_ERROR,
        error=Blob.stored("compile_error in the kernel"),
    )
    # What ingest's results_stored receiver does with it.
    bisection_results_record(results=[result])

    page.wait_for_selector("text=First bad release: TileLang 0.1.14", timeout=15_000)
    assert "0.1.14 ← first bad release" in page.inner_text("table.bisection")
    assert "python -m runners.harness job.json" in page.inner_text("pre.repro-commands")
    page.context.close()
