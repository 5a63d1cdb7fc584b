"""A kernel's decisions in headless Chromium, as the people who take them:
an author submits for the CPU, a reviewer reads what approving changes,
is refused without the confirmation, approves, and then reverts the CPU to
the library's revision through its preview. Each step leaves the audit
event it should, and the revision current on each backend follows."""

from __future__ import annotations

from django.contrib.auth.models import Group

from matrix.models import AuditEvent, KernelRevision, Operator
from runners.roles import KERNEL_AUTHOR, REVIEWER
from tests.browser.conftest import Page
from tests.security.helpers import attack_source


def _person(django_user_model, name: str, role: str):
    user = django_user_model.objects.create_user(name, password=f"{name}-pass-123")
    user.groups.add(Group.objects.get(name=role), Group.objects.get(name="viewer"))
    return user


def _tab(chromium, live_server, name: str) -> tuple[Page, object]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = Page(context.new_page(), live_server.url)
    tab.login(name, f"{name}-pass-123")
    return tab, context


def test_submit_approve_refused_approve_and_revert_in_the_browser(
    chromium, live_server, catalog, django_user_model
):
    _person(django_user_model, "ada", KERNEL_AUTHOR)
    _person(django_user_model, "rex", REVIEWER)
    add = Operator.objects.get(name="elementwise_add")
    library = add.current_revision("c")

    author, author_context = _tab(chromium, live_server, "ada")
    author.open("/submissions/new/")
    author.page.select_option("select[name=operator]", "elementwise_add")
    author.page.check("input[name=backends][value=c]")
    author.page.fill("textarea[name=source]", attack_source("good_add"))
    author.page.click("button:has-text('Submit for review')")
    author.page.wait_for_selector("text=Submitted; it runs once another reviewer")
    submission = KernelRevision.objects.get(origin="submitted")
    assert submission.backends == ["c"]
    author_context.close()
    assert author.errors == []

    reviewer, reviewer_context = _tab(chromium, live_server, "rex")
    reviewer.open(f"/submissions/{submission.pk}/")
    preview = reviewer.page.inner_text("#approve-preview")
    assert "Approving makes it current on CPU (C) (x86-64 CPU · c)" in preview
    # Refused: a comment but no tick.
    reviewer.page.fill("textarea[name=comment]", "adds without the library's tiles")
    reviewer.page.click("button[value=approve]")
    reviewer.page.wait_for_selector("text=tick the box: approving changes what runs")
    submission.refresh_from_db()
    assert submission.review_state == "pending"
    # The refusal is a 400 page, which the console reports; nothing else may.
    assert reviewer.errors == [
        "Failed to load resource: the server responded with a status of 400 "
        "(Bad Request)"
    ]
    reviewer.errors.clear()

    reviewer.page.fill("textarea[name=comment]", "adds without the library's tiles")
    reviewer.page.check("input[name=confirm]")
    reviewer.page.click("button[value=approve]")
    reviewer.page.wait_for_selector("text=Approved: new jobs on CPU (C) run it")
    assert add.current_revision("c") == submission
    assert add.current_revision("cuda") == library

    reviewer.open("/operators/elementwise_add/revisions/")
    table = reviewer.page.inner_text("#current-by-backend")
    assert f"CPU (C)\t{submission.source_sha256[:12]}" in table
    assert f"CUDA\t{library.source_sha256[:12]}" in table
    row = reviewer.page.locator("tr", has_text=library.source_sha256[:12]).last
    row.locator("input[name=backends][value=c]").check()
    row.locator("textarea[name=comment]").fill("slower than the library")
    row.locator("button:has-text('Preview the revert')").click()
    reviewer.page.wait_for_selector("#revert-preview")
    assert "New jobs on CPU (C) run" in reviewer.page.inner_text("#revert-preview")
    assert add.current_revision("c") == submission  # a preview changes nothing
    reviewer.page.check("#revert-preview input[name=confirm]")
    reviewer.page.click("#revert-preview button:has-text('Revert')")
    reviewer.page.wait_for_selector("text=Reverted: new jobs on CPU (C) run")
    assert add.current_revision("c") == library
    reviewer_context.close()
    assert reviewer.errors == []

    events = {
        e.verb: e
        for e in AuditEvent.objects.filter(
            verb__in=["submission.approve", "revision.revert"]
        )
    }
    assert events["submission.approve"].after["comment"] == (
        "adds without the library's tiles"
    )
    assert events["revision.revert"].after == {
        "current": {"c": library.source_sha256},
        "comment": "slower than the library",
    }
    assert events["revision.revert"].actor_label == "rex"
