"""Every decision that changes production, walked in headless Chromium
against the deployment `make run` starts: the web server and the control
worker each a process of its own, the embedded broker, a database seeded as
`make seed` seeds it (the H200 lab's evidence and its upgrade, ready for two
reviewers). For each: what the page says it will change, the refusal
without the confirmation, the decision, its audit event, and what the
manifest or the current revision says afterwards, read from the database
and the API the processes serve."""

from __future__ import annotations

import json
import urllib.request
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
        said = cluster.manage("demo_upgrade", *EVIDENCE).stdout
        cluster.reviewers = dict(
            line.split("reviewer account: ", 1)[1]
            .split("  (shown once)")[0]
            .split(" / ")
            for line in said.splitlines()
            if "(shown once)" in line
        )
        cluster.manage(
            "shell", "-c",
            "from django.contrib.auth.models import Group; "
            "from django.contrib.auth import get_user_model; "
            f"u = get_user_model().objects.create_user({AUTHOR[0]!r}, "
            f"password={AUTHOR[1]!r}); "
            "u.groups.add(*Group.objects.filter(name__in=['kernel author', 'viewer']))",
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
    with urllib.request.urlopen(
        f"{deployment.server}/api/v1/manifest?toolchain={toolchain}", timeout=30
    ) as answer:
        return json.load(answer)["entries"]


def test_the_upgrade_approved_by_two_refused_once_then_rolled_out(chromium, deployment):
    ((proposal, candidate),) = deployment.sql(
        "SELECT p.id, t.name FROM matrix_upgradeproposal p "
        "JOIN matrix_toolchain t ON t.id = p.candidate_id"
    )
    assert _manifest(deployment, candidate) == []
    first, second = sorted(deployment.reviewers.items())
    for n, reviewer in enumerate((first, second), 1):
        tab, context = _tab(chromium, deployment, reviewer)
        tab.open(f"/upgrades/{proposal}/")
        tab.page.check("input[name=decision][value=approve]")
        tab.page.fill("textarea[name=comment]", f"the A/B reads right ({n})")
        if n == 2:
            said = tab.page.inner_text("#approve-preview")
            assert f"Approving publishes the manifest for {candidate}" in said
            # Refused without the tick: nothing is published.
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
    entries = _manifest(deployment, candidate)
    choices = [e["choice"] for e in entries]
    assert len(entries) == 188 and {"tilelang", "reference"} == set(choices)
    assert [actor for actor, _ in _audit(deployment, "proposal.approve")] == [
        first[0],
        second[0],
    ]

    # Roll-out: the policy's roll-out group or an admin, with a reason and
    # the confirmation; the candidate becomes the current toolchain.
    admin, context = _tab(chromium, deployment, ADMIN)
    admin.open(f"/upgrades/{proposal}/")
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
        "SELECT id, source_sha256 FROM matrix_kernelrevision WHERE origin = 'submitted'"
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
