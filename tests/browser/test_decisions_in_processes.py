"""Every decision that changes production, walked in headless Chromium
against the deployment `make run` starts: the web server and the control
worker each a process of its own, the embedded broker, a database seeded as
`make seed` seeds it (the H200 lab's evidence and its upgrade, ready for two
reviewers). The upgrade approved by two, rejected by a third, proposed
again, approved and rolled out; a runner's claim refused; a CPU submission
approved then reverted, another rejected. For each: what the page says it
will change, the refusal without the confirmation, the decision, its audit
event, and what the manifest or the current revision says afterwards, read
from the database and the API the processes serve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.browser.conftest import Page
from tests.runners.cluster import Cluster
from tests.security.helpers import attack_source

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
EVIDENCE = sorted(
    str(p) for p in (REPO / "docs/evidence").glob("*-h200-*.evidence.json")
)
ADMIN = ("labadmin", "lab-admin-pass-123")
AUTHOR = ("ada", "ada-pass-12345")
THIRD_REVIEWER = ("rex", "rex-pass-12345")
REFUSED_400 = (
    "Failed to load resource: the server responded with a status of 400 (Bad Request)"
)


@pytest.fixture(scope="module")
def deployment():
    cluster = Cluster()
    try:
        cluster.env.update(
            DJANGO_SUPERUSER_USERNAME=ADMIN[0], DJANGO_SUPERUSER_PASSWORD=ADMIN[1]
        )
        cluster.manage("evidence", "import", "--current-if-none", *EVIDENCE)
        cluster.manage("ensure_admin")
        cluster.reviewers = cluster.demo_reviewers(*EVIDENCE)
        cluster.manage(
            "shell", "-c",
            "from django.contrib.auth.models import Group; "
            "from django.contrib.auth import get_user_model; "
            f"u = get_user_model().objects.create_user({AUTHOR[0]!r}, "
            f"password={AUTHOR[1]!r}); "
            "u.groups.add(*Group.objects.filter(name__in=['kernel author', 'viewer'])); "
            f"r = get_user_model().objects.create_user({THIRD_REVIEWER[0]!r}, "
            f"password={THIRD_REVIEWER[1]!r}); "
            "r.groups.add(*Group.objects.filter(name__in=['reviewer', 'viewer']))",
        )  # fmt: skip
        cluster.start_web()
        cluster.start_control()
        yield cluster
    finally:
        cluster.close()


def _tab(chromium, deployment, user: tuple[str, str]) -> tuple[Page, object]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = Page(context.new_page(), deployment.server)
    tab.login(*user)
    return tab, context


def _audit(deployment, verb: str) -> list[tuple[str, dict]]:
    rows = deployment.sql(
        "SELECT actor_label, after FROM matrix_auditevent WHERE verb = ? ORDER BY id",
        (verb,),
    )
    return [
        (actor, json.loads(after) if isinstance(after, str) else after)
        for actor, after in rows
    ]


def _manifest(deployment, toolchain: str) -> list[dict]:
    return deployment.manifest(toolchain)["entries"]


def _approve_by_two(chromium, deployment, proposal: int, candidate: str) -> None:
    """The demo's two reviewers approve; the last approval says it publishes
    the manifest and is refused until its box is ticked."""
    first, second = sorted(deployment.reviewers.items())
    for n, reviewer in enumerate((first, second), 1):
        tab, context = _tab(chromium, deployment, reviewer)
        tab.open(f"/upgrades/{proposal}/")
        tab.page.check("input[name=decision][value=approve]")
        tab.page.fill("textarea[name=comment]", f"the A/B reads right ({n})")
        if n == 2:
            said = tab.page.inner_text("#approve-preview")
            assert f"Approving publishes the manifest for {candidate}" in said
            tab.page.click("text=Submit decision")
            tab.page.wait_for_selector("#decision-form >> text=Tick the box to confirm")
            assert _manifest(deployment, candidate) == []
            # The refusal's 400, where the console reports it; nothing else.
            assert set(tab.errors) <= {REFUSED_400}
            tab.errors.clear()
            tab.page.check("#approve-preview input[name=confirm]")
        tab.page.click("text=Submit decision")
        tab.page.wait_for_selector(
            f"text=Approved. The manifest for {candidate}"
            if n == 2
            else "text=Your approval is recorded"
        )
        assert tab.errors == []
        context.close()


def test_the_upgrade_approved_rejected_proposed_again_and_rolled_out(
    chromium, deployment
):
    ((proposal, baseline, candidate_id, candidate),) = deployment.sql(
        "SELECT p.id, p.baseline_id, p.candidate_id, t.name "
        "FROM matrix_upgradeproposal p JOIN matrix_toolchain t ON t.id = p.candidate_id"
    )
    device_types = [
        dt for (dt,) in deployment.sql(
            "SELECT devicetype_id FROM matrix_upgradeproposal_device_types "
            "WHERE upgradeproposal_id = ?", (proposal,),
        )
    ]  # fmt: skip
    assert _manifest(deployment, candidate) == []
    _approve_by_two(chromium, deployment, proposal, candidate)
    entries = _manifest(deployment, candidate)
    assert len(entries) == 188
    assert {e["choice"] for e in entries} == {"tilelang", "reference"}
    assert [actor for actor, _ in _audit(deployment, "proposal.approve")] == sorted(
        deployment.reviewers
    )

    # A third reviewer rejects it: the page says the manifest goes to 0
    # entries, refuses until the box is ticked, then withdraws it.
    tab, context = _tab(chromium, deployment, THIRD_REVIEWER)
    tab.open(f"/upgrades/{proposal}/")
    said = tab.page.inner_text("#reject-preview")
    assert f"{candidate} goes from 188 entries to 0" in said
    tab.page.check("input[name=decision][value=reject]")
    tab.page.fill("textarea[name=comment]", "a regression we must read first")
    tab.page.click("text=Submit decision")
    tab.page.wait_for_selector("#decision-form >> text=Tick the box to confirm")
    assert len(_manifest(deployment, candidate)) == 188
    assert set(tab.errors) <= {REFUSED_400}
    tab.errors.clear()
    tab.page.check("#reject-preview input[name=confirm]")
    tab.page.click("text=Submit decision")
    tab.page.wait_for_selector(
        f"text=Rejected. The manifest for {candidate} is withdrawn."
    )
    assert _manifest(deployment, candidate) == []
    assert tab.errors == []
    context.close()
    ((actor, _),) = _audit(deployment, "proposal.reject")
    assert actor == THIRD_REVIEWER[0]

    # Read, it is proposed again; the control worker judges it ready, the
    # two approve, and the admin rolls it out with a reason.
    admin, context = _tab(chromium, deployment, ADMIN)
    admin.open("/upgrades/")
    admin.page.click("text=Propose an upgrade")
    admin.page.select_option("select[name=baseline]", str(baseline))
    admin.page.select_option("select[name=candidate]", str(candidate_id))
    for device_type in device_types:
        admin.page.check(f"input[name=device_types][value='{device_type}']")
    admin.page.fill("textarea[name=note]", "read again: the regression was the host")
    admin.page.click("text=Open proposal")
    state = admin.page.wait_for_selector(
        "[data-state=ready], [data-state=blocked]", timeout=60_000
    )
    assert state.get_attribute("data-state") == "ready"
    again = int(admin.page.url.rstrip("/").rsplit("/", 1)[-1])
    assert again != proposal
    _approve_by_two(chromium, deployment, again, candidate)
    assert len(_manifest(deployment, candidate)) == 188

    admin.open(f"/upgrades/{again}/")
    form = admin.page.locator("#rollout-form")
    form.locator("input[name=comment]").fill("release day")
    form.locator("input[name=confirm]").check()
    form.locator("button:has-text('Roll out')").click()
    admin.page.wait_for_selector(f"text=Rolled out: {candidate}")
    assert admin.errors == []
    context.close()
    assert deployment.sql("SELECT name FROM matrix_toolchain WHERE is_current") == [
        (candidate,)
    ]
    ((actor, after),) = _audit(deployment, "proposal.rollout")
    assert actor == ADMIN[0] and after["comment"] == "release day"
    assert len(_manifest(deployment, candidate)) == 188


def test_a_runner_claim_refused_and_a_submission_rejected(chromium, deployment):
    token = deployment.manage("runner", "token", "create", "--expires", "10m").stdout
    deployment.manage(
        "runner", "register", "--server", deployment.server,
        "--token", token.strip().splitlines()[-1], "--name", "lab-claim",
        "--key-dir", str(deployment.key_dir("lab-claim")),
    )  # fmt: skip
    ((runner,),) = deployment.sql(
        "SELECT id FROM runners_runner WHERE name = 'lab-claim'"
    )
    admin, context = _tab(chromium, deployment, ADMIN)
    admin.open("/runners/")
    row = admin.page.locator(f"#runner-{runner}")
    assert "pending approval" in row.inner_text()
    admin.page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button", has_text="Refuse").click()
    admin.page.wait_for_selector(f"#runner-{runner} .badge.revoked")
    assert "refused" in row.inner_text()
    assert admin.errors == []
    context.close()
    assert [actor for actor, _ in _audit(deployment, "runner.refuse")] == [ADMIN[0]]
    assert deployment.sql(
        "SELECT state FROM runners_runner WHERE name = 'lab-claim'"
    ) != [("active",)]

    author, context = _tab(chromium, deployment, AUTHOR)
    author.open("/submissions/new/")
    author.page.select_option("select[name=operator]", "row_sum")
    author.page.check("input[name=backends][value=c]")
    author.page.fill(
        "textarea[name=source]",
        (REPO / "tests/harness/submitted/nansum_row_sum.py").read_text(),
    )
    author.page.click("button:has-text('Submit for review')")
    author.page.wait_for_selector("text=Submitted; it runs once another reviewer")
    context.close()
    ((submission,),) = deployment.sql(
        "SELECT r.id FROM matrix_kernelrevision r JOIN matrix_operator o "
        "ON o.id = r.operator_id WHERE o.name = 'row_sum' AND r.origin = 'submitted'"
    )
    reviewer, context = _tab(chromium, deployment, THIRD_REVIEWER)
    reviewer.open(f"/submissions/{submission}/")
    reviewer.page.fill("textarea[name=comment]", "drops NaN")
    reviewer.page.click("button[value=reject]")
    reviewer.page.wait_for_selector("text=Rejected: it never runs.")
    assert reviewer.errors == []
    context.close()
    assert deployment.sql(
        "SELECT review_state FROM matrix_kernelrevision WHERE id = ?", (submission,)
    ) == [("rejected",)]
    ((actor, after),) = _audit(deployment, "submission.reject")
    assert actor == THIRD_REVIEWER[0] and after["comment"] == "drops NaN"


def test_a_submission_approved_for_the_cpu_then_reverted(chromium, deployment):
    author, context = _tab(chromium, deployment, AUTHOR)
    author.open("/submissions/new/")
    author.page.select_option("select[name=operator]", "elementwise_add")
    author.page.check("input[name=backends][value=c]")
    author.page.fill("textarea[name=source]", attack_source("good_add"))
    author.page.click("button:has-text('Submit for review')")
    author.page.wait_for_selector("text=Submitted; it runs once another reviewer")
    assert author.errors == []
    context.close()
    ((submission, submitted_sha),) = deployment.sql(
        "SELECT r.id, r.source_sha256 FROM matrix_kernelrevision r "
        "JOIN matrix_operator o ON o.id = r.operator_id "
        "WHERE o.name = 'elementwise_add' AND r.origin = 'submitted'"
    )

    def current() -> dict[str, str]:
        return dict(
            deployment.sql(
                "SELECT c.backend, r.source_sha256 FROM matrix_currentrevision c "
                "JOIN matrix_kernelrevision r ON r.id = c.revision_id "
                "JOIN matrix_operator o ON o.id = c.operator_id "
                "WHERE o.name = 'elementwise_add'"
            )
        )

    library = current()
    assert submitted_sha not in library.values()

    reviewer, context = _tab(
        chromium, deployment, sorted(deployment.reviewers.items())[0]
    )
    reviewer.open(f"/submissions/{submission}/")
    assert "Approving makes it current on CPU (C)" in reviewer.page.inner_text(
        "#approve-preview"
    )
    reviewer.page.fill("textarea[name=comment]", "adds without the library's tiles")
    reviewer.page.click("button[value=approve]")
    reviewer.page.wait_for_selector("text=tick the box: approving changes what runs")
    assert current() == library
    assert set(reviewer.errors) <= {REFUSED_400}
    reviewer.errors.clear()
    reviewer.page.fill("textarea[name=comment]", "adds without the library's tiles")
    reviewer.page.check("input[name=confirm]")
    reviewer.page.click("button[value=approve]")
    reviewer.page.wait_for_selector("text=Approved: new jobs on CPU (C) run it")
    assert current() == {**library, "c": submitted_sha}

    reviewer.open("/operators/elementwise_add/revisions/")
    row = reviewer.page.locator("tr", has_text=library["c"][:12]).last
    row.locator("input[name=backends][value=c]").check()
    row.locator("textarea[name=comment]").fill("slower than the library")
    row.locator("button:has-text('Preview the revert')").click()
    reviewer.page.wait_for_selector("#revert-preview")
    assert current()["c"] == submitted_sha  # a preview changes nothing
    reviewer.page.check("#revert-preview input[name=confirm]")
    reviewer.page.click("#revert-preview button:has-text('Revert')")
    reviewer.page.wait_for_selector("text=Reverted: new jobs on CPU (C) run")
    assert current() == library
    assert reviewer.errors == []
    context.close()

    ((_, approved),) = _audit(deployment, "submission.approve")
    assert approved["comment"] == "adds without the library's tiles"
    ((actor, reverted),) = _audit(deployment, "revision.revert")
    assert actor == sorted(deployment.reviewers)[0]
    assert reverted == {
        "current": {"c": library["c"]},
        "comment": "slower than the library",
    }
