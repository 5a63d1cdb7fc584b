"""An upgrade's decisions in headless Chromium: the first approval, the
last one (which says it publishes the manifest, and is refused until its
box is ticked), and the roll-out with its reason and confirmation. Each
leaves its audit event; the manifest and the current toolchain follow."""

from __future__ import annotations

from matrix.gate.manifest import manifest_for
from matrix.gate.models import UpgradeProposal
from matrix.gate.services import proposal_open
from matrix.models import AuditEvent, Toolchain
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


def _decide(tab: Page, proposal: int, comment: str, *, tick: bool) -> None:
    tab.open(f"/upgrades/{proposal}/")
    tab.page.check("input[name=decision][value=approve]")
    tab.page.fill("textarea[name=comment]", comment)
    if tick:
        tab.page.check("#approve-preview input[name=confirm]")
    tab.page.click("text=Submit decision")


def test_approve_refused_approve_and_roll_out_in_the_browser(
    chromium,
    live_server,
    world,  # noqa: F811
):
    proposal = green_proposal(world)

    first = _tab(chromium, live_server, "reviewer", "reviewer-pass-123")
    _decide(first, proposal.pk, "clean diff", tick=False)
    first.page.wait_for_selector("text=Your approval is recorded")
    assert first.errors == []

    last = _tab(chromium, live_server, "reviewer2", "pw-123456")
    last.open(f"/upgrades/{proposal.pk}/")
    said = last.page.inner_text("#approve-preview")
    assert f"Approving publishes the manifest for {world.new.name}" in said
    _decide(last, proposal.pk, "agreed", tick=False)
    last.page.wait_for_selector("#decision-form >> text=Tick the box to confirm")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.READY
    last.errors.clear()  # the refusal's 400, reported by the console
    last.page.check("#approve-preview input[name=confirm]")
    last.page.click("text=Submit decision")
    last.page.wait_for_selector(f"text=Approved. The manifest for {world.new.name}")
    assert last.errors == []
    entries = manifest_for(toolchain=world.new)["entries"]
    assert entries and all(e["choice"] in ("tilelang", "reference") for e in entries)

    rollout = _tab(chromium, live_server, "reviewer3", "pw-123456")
    rollout.open(f"/upgrades/{proposal.pk}/")
    form = rollout.page.locator("#rollout-form")
    form.locator("input[name=comment]").fill("release day")
    form.locator("input[name=confirm]").check()
    form.locator("button:has-text('Roll out')").click()
    rollout.page.wait_for_selector(f"text=Rolled out: {world.new.name}")
    assert list(Toolchain.objects.filter(is_current=True)) == [world.new]
    assert rollout.errors == []

    verbs = list(
        AuditEvent.objects.filter(
            object_type="matrix.upgradeproposal", verb__startswith="proposal."
        )
        .order_by("id")
        .values_list("verb", "actor_label")
    )
    assert ("proposal.approve", "reviewer") in verbs
    assert ("proposal.approve", "reviewer2") in verbs
    assert verbs[-1] == ("proposal.rollout", "reviewer3")
    event = AuditEvent.objects.get(verb="proposal.rollout")
    assert event.after["comment"] == "release day"


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
