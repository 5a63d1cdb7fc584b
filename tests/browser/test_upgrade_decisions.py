"""Rejecting an approved upgrade in headless Chromium: the page says the
manifest goes to 0 entries, refuses until the box is ticked, and the
manifest is withdrawn. (The approvals and the roll-out are walked against
real processes in test_decisions_in_processes.py.)"""

from __future__ import annotations

from matrix.gate.manifest import manifest_for
from matrix.gate.services import proposal_open
from matrix.models import AuditEvent
from tests.browser.conftest import Page
from tests.gate.conftest import people, world  # noqa: F401  (fixtures)


def _tab(chromium, live_server, name: str, password: str) -> Page:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = Page(context.new_page(), live_server.url)
    tab.login(name, password)
    return tab


def green_proposal(lab):
    """Green on both toolchains, on the CPU: ready for a decision."""
    lab.green(lab.old)
    lab.green(lab.new)
    return proposal_open(
        baseline=lab.old,
        candidate=lab.new,
        device_types=[lab.cpu],
        by=lab.owner,
    )


def test_rejecting_an_approved_upgrade_says_it_empties_the_manifest(
    chromium,
    live_server,
    world,  # noqa: F811
):
    from matrix.gate.services import proposal_approve

    proposal = green_proposal(world)
    for reviewer in world.reviewers[:2]:
        proposal_approve(proposal=proposal, by=reviewer, comment="ok")
    entries = len(manifest_for(toolchain=world.new)["entries"])
    assert entries

    tab = _tab(chromium, live_server, "reviewer3", "pw-123456")
    tab.open(f"/upgrades/{proposal.pk}/")
    said = tab.page.inner_text("#reject-preview")
    assert f"{world.new.name} goes from {entries} entries to 0" in said
    tab.page.check("input[name=decision][value=reject]")
    tab.page.fill("textarea[name=comment]", "a regression on the CPU")
    tab.page.click("text=Submit decision")
    tab.page.wait_for_selector("#decision-form >> text=Tick the box to confirm")
    assert len(manifest_for(toolchain=world.new)["entries"]) == entries
    tab.errors.clear()  # the refusal's 400, reported by the console
    tab.page.check("#reject-preview input[name=confirm]")
    tab.page.click("text=Submit decision")
    tab.page.wait_for_selector(
        f"text=Rejected. The manifest for {world.new.name} is withdrawn."
    )
    assert manifest_for(toolchain=world.new)["entries"] == []
    assert tab.errors == []
    event = AuditEvent.objects.filter(verb="proposal.reject").get()
    assert event.actor_label == "reviewer3"
