"""Propose → review → approve → manifest, in headless Chromium."""

from __future__ import annotations

import json

import pytest

from matrix.gate.services import proposal_open
from matrix.models.gate import UpgradeProposal

pytestmark = pytest.mark.browser


@pytest.fixture
def browser(chromium):
    return chromium


def log_in(browser, live_server, username, password):
    page = browser.new_context().new_page()
    page.goto(f"{live_server.url}/login/?next=/upgrades/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(f"{live_server.url}/upgrades/")
    return page


def test_propose_review_approve_and_read_the_manifest(
    transactional_db, live_server, browser, world
):
    world.green(world.old)
    world.green(world.new)
    for user in [world.owner, *world.reviewers]:
        user.set_password("browser-pass-123")
        user.save()

    page = log_in(browser, live_server, world.owner.username, "browser-pass-123")
    page.click("text=Propose an upgrade")
    page.select_option("select[name=baseline]", str(world.old.pk))
    page.select_option("select[name=candidate]", str(world.new.pk))
    page.check(f"input[name=device_types][value='{world.cpu.pk}']")
    page.fill("textarea[name=note]", "0.1.15 fixes softmax on c")
    page.click("text=Open proposal")
    page.wait_for_selector("[data-state=ready]")
    assert "needs 2 approvals from the reviewer group, has 0" in page.inner_text(
        "#gate-status"
    )
    assert page.locator("#decision-form").count() == 0
    proposal = UpgradeProposal.objects.get()
    page.context.close()

    for n, reviewer in enumerate(world.reviewers[:2], start=1):
        page = log_in(browser, live_server, reviewer.username, "browser-pass-123")
        page.click(f"text=#{proposal.pk}")
        page.check("input[name=decision][value=approve]")
        if n == 1:
            # A blank comment passes the browser's own check, not the
            # server's: the form comes back in place, the choice kept.
            page.fill("textarea[name=comment]", "   ")
            page.click("text=Submit decision")
            page.wait_for_selector("#decision-form >> text=write a comment")
            assert page.is_checked("input[name=decision][value=approve]")
            # Focus is on what to fix, not back at the top of the page.
            assert page.evaluate("document.activeElement.name") == "comment"
        page.fill("textarea[name=comment]", f"diff is clean ({n})")
        if n == 2:
            # The last approval publishes the manifest: said, and ticked.
            assert "Approving publishes the manifest" in page.inner_text(
                "#approve-preview"
            )
            page.check("#approve-preview input[name=confirm]")
        page.click("text=Submit decision")
        page.wait_for_selector(f"text=diff is clean ({n})")
        if n == 1:
            assert "has 1" in page.inner_text("#gate-status")
        else:
            page.wait_for_selector("[data-state=approved]")
            page.click("text=Manifest (JSON)")
            manifest = json.loads(page.inner_text("body"))
        page.context.close()

    assert manifest["toolchain"]["fingerprint"] == world.new.fingerprint
    assert {(e["operator"], e["choice"]) for e in manifest["entries"]} == {
        ("softmax", "tilelang"),
        ("gemm", "tilelang"),
    }


def proposal_page_width(browser, live_server, world, *, width, note="") -> int:
    """How wide the proposer's page of a fresh proposal renders in a window
    ``width`` pixels wide."""
    world.green(world.old)
    world.green(world.new)
    world.owner.set_password("browser-pass-123")
    world.owner.save()
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
        note=note,
    )
    page = log_in(browser, live_server, world.owner.username, "browser-pass-123")
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live_server.url}/upgrades/{proposal.pk}/")
    rendered = page.evaluate("document.documentElement.scrollWidth")
    page.context.close()
    return rendered


def test_a_long_unbroken_note_wraps_inside_the_page(
    transactional_db, live_server, browser, world
):
    assert (
        proposal_page_width(browser, live_server, world, width=1280, note="x" * 5000)
        <= 1280
    )


def test_a_proposal_fits_a_phone_screen(transactional_db, live_server, browser, world):
    """Its wide tables scroll inside themselves, the page does not."""
    assert proposal_page_width(browser, live_server, world, width=390) <= 390
