"""The upgrade pages: who may do what, wrong methods, and what they show."""

from __future__ import annotations

import re
from urllib.parse import unquote

import pytest
from django.urls import reverse
from django.utils.html import escape

from matrix.gate.services import (
    policy_save,
    proposal_approve,
    proposal_open,
    proposal_reevaluate,
    proposal_reject,
    proposal_rollout,
)
from matrix.models import Shape, Status
from matrix.models.gate import Approval, BackendException, Policy, UpgradeProposal
from tests.gate.conftest import online_runner


@pytest.fixture
def proposal(world):
    world.green(world.old)
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    world.record("gemm", world.cpu, world.new, Status.PASS)
    return proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )


@pytest.fixture
def green(world):
    world.green(world.old)
    world.green(world.new)
    return proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )


GET_PAGES = ["upgrades", "upgrade-new", "upgrade-policy", "upgrade"]
POST_ONLY = [
    "upgrade-decide",
    "upgrade-reevaluate",
    "upgrade-rollout",
    "upgrade-exception",
    "upgrade-exception-sign-off",
]


def url(name, proposal, exception=None):
    if name == "upgrade-exception-sign-off":
        return reverse(name, args=[exception.pk])
    if name in ("upgrades", "upgrade-new", "upgrade-policy"):
        return reverse(name)
    return reverse(name, args=[proposal.pk])


@pytest.fixture
def exception(world, proposal):
    return BackendException.objects.create(
        proposal=proposal, backend="c", reason="why", granted_by=world.reviewers[0]
    )


@pytest.mark.parametrize("name", GET_PAGES)
def test_get_pages_refuse_other_methods(client, admin_user, proposal, name):
    client.force_login(admin_user)
    assert client.put(url(name, proposal)).status_code == 405
    assert client.delete(url(name, proposal)).status_code == 405


@pytest.mark.parametrize("name", ["upgrades", "upgrade"])
def test_read_only_pages_refuse_post(client, admin_user, proposal, name):
    client.force_login(admin_user)
    assert client.post(url(name, proposal)).status_code == 405


@pytest.mark.parametrize("name", POST_ONLY)
def test_actions_refuse_get(client, admin_user, proposal, exception, name):
    client.force_login(admin_user)
    assert client.get(url(name, proposal, exception)).status_code == 405


@pytest.mark.parametrize("name", GET_PAGES)
def test_anonymous_users_are_sent_to_log_in(client, proposal, name):
    response = client.get(url(name, proposal))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("name", ["upgrades", "upgrade"])
def test_an_outsider_reads_but_gets_no_controls(client, outsider, proposal, name):
    client.force_login(outsider)
    response = client.get(url(name, proposal))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Propose an upgrade" not in body
    assert 'id="decision-form"' not in body
    assert "Edit policy" not in body
    assert "Re-evaluate now" not in body


@pytest.mark.parametrize("name", ["upgrade-new", "upgrade-policy"])
def test_an_outsider_cannot_propose_or_edit_policy(client, outsider, proposal, name):
    client.force_login(outsider)
    assert client.get(url(name, proposal)).status_code == 403
    assert client.post(url(name, proposal), {}).status_code == 403


@pytest.mark.parametrize(
    "name",
    [
        "upgrade-decide",
        "upgrade-reevaluate",
        "upgrade-exception",
        "upgrade-exception-sign-off",
    ],
)
def test_an_outsider_cannot_act(client, outsider, proposal, exception, name):
    client.force_login(outsider)
    response = client.post(
        url(name, proposal, exception),
        {"decision": "approve", "comment": "x", "backend": "c", "reason": "x"},
    )
    assert response.status_code == 403
    assert not Approval.objects.exists()
    exception.refresh_from_db()
    assert not exception.signed


def test_an_outsider_cannot_roll_out(client, outsider, world, green):
    proposal_approve(proposal=green, by=world.reviewers[0], comment="ok")
    proposal_approve(proposal=green, by=world.reviewers[1], comment="ok")
    client.force_login(outsider)
    assert client.post(url("upgrade-rollout", green)).status_code == 403
    green.refresh_from_db()
    assert green.state == UpgradeProposal.State.APPROVED


def test_it_refuses_self_approval_in_the_view(client, world, green):
    client.force_login(world.owner)
    page = client.get(url("upgrade", green)).content.decode()
    assert 'id="decision-form"' not in page
    assert "another reviewer must decide" in page
    response = client.post(
        url("upgrade-decide", green),
        {"decision": "approve", "comment": "mine", "confirm": "on"},
    )
    assert response.status_code == 403
    assert not Approval.objects.exists()


def test_the_last_approval_says_it_publishes_the_manifest_and_needs_a_tick(
    client, world, green
):
    from matrix.gate.services import proposal_approve

    proposal_approve(proposal=green, by=world.reviewers[0], comment="clean diff")
    client.force_login(world.reviewers[1])
    page = client.get(url("upgrade", green)).content.decode()
    preview = page.split('id="approve-preview"')[1].split("</p>")[0]
    assert f"Approving publishes the manifest for {green.candidate.name}" in preview
    unticked = client.post(
        url("upgrade-decide", green), {"decision": "approve", "comment": "ok"}
    )
    assert "Tick the box to confirm" in unticked.content.decode()
    green.refresh_from_db()
    assert green.state == UpgradeProposal.State.READY
    assert not green.manifest_entries.exists()
    client.post(
        url("upgrade-decide", green),
        {"decision": "approve", "comment": "ok", "confirm": "on"},
    )
    green.refresh_from_db()
    assert green.state == UpgradeProposal.State.APPROVED
    assert green.manifest_entries.exists()


def test_a_reviewer_approves_with_a_comment(client, world, green):
    client.force_login(world.reviewers[0])
    response = client.post(
        url("upgrade-decide", green),
        {"decision": "approve", "comment": "clean diff", "confirm": "on"},
    )
    assert response.status_code == 302
    approval = Approval.objects.get()
    assert (approval.reviewer, approval.comment) == (world.reviewers[0], "clean diff")


def test_approving_a_blocked_proposal_says_why(client, world, proposal):
    client.force_login(world.reviewers[0])
    response = client.post(
        url("upgrade-decide", proposal),
        {"decision": "approve", "comment": "ship it", "confirm": "on"},
        follow=True,
    )
    assert "cannot approve while blocked" in response.content.decode()
    assert not Approval.objects.exists()


def test_the_diff_page_shows_counts_groups_and_the_blocking_cell(
    client, world, proposal
):
    client.force_login(world.reviewers[0])
    body = client.get(url("upgrade", proposal)).content.decode()
    assert 'data-state="blocked"' in body
    assert (
        "served cell softmax[M=64,N=256] float32 on x86-64 CPU · c went from pass "
        "to compile_error"
    ) in body
    assert '<td data-change="green_to_red">1</td>' in body
    assert '<td data-change="still_green">1</td>' in body
    assert 'id="by-operator-heading"' in body and 'id="by-backend-heading"' in body
    assert "1.00 ± 0.07" in body  # gemm: one timing each side, default band
    softmax = body.split('data-cell="softmax[M=64,N=256] float32 on x86-64 CPU · c"')
    row = softmax[1].split("</tr>")[0]
    assert '<td>green → red<br><strong class="blocks">blocks (regression)' in row


def test_the_proposer_opens_a_proposal_from_the_form(client, world):
    client.force_login(world.owner)
    form = client.get(reverse("upgrade-new")).content.decode()
    # The current toolchain is marked, as on the matrix: the usual baseline;
    # each reads as what it is, not only its name.
    old_fp, new_fp = world.old.fingerprint[:8], world.new.fingerprint[:8]
    assert (
        f'<option value="{world.old.pk}">tilelang-0.1.13: TileLang 0.1.13 · {old_fp}'
        " (current)</option>"
    ) in form
    assert (
        f'<option value="{world.new.pk}">tilelang-0.1.15: TileLang 0.1.15 · {new_fp}'
        "</option>"
    ) in form
    response = client.post(
        reverse("upgrade-new"),
        {
            "baseline": world.old.pk,
            "candidate": world.new.pk,
            "device_types": [world.cpu.pk],
            "note": "0.1.15 fixes softmax on c",
        },
    )
    proposal = UpgradeProposal.objects.get()
    assert response["Location"] == reverse("upgrade", args=[proposal.pk])
    assert (proposal.proposer, proposal.note) == (
        world.owner,
        "0.1.15 fixes softmax on c",
    )


def test_the_form_refuses_the_same_toolchain_twice(client, world):
    client.force_login(world.owner)
    response = client.post(
        reverse("upgrade-new"),
        {
            "baseline": world.old.pk,
            "candidate": world.old.pk,
            "device_types": [world.cpu.pk],
        },
    )
    body = response.content.decode()
    assert "the candidate must differ from the baseline" in body
    assert '<div role="alert" tabindex="-1" autofocus>' in body
    assert not UpgradeProposal.objects.exists()


def test_an_admin_saves_a_new_policy_version(client, admin_user, world):
    client.force_login(admin_user)
    assert client.get(reverse("upgrade-policy")).status_code == 200
    response = client.post(
        reverse("upgrade-policy"),
        {
            "forbid_served_regressions": "on",
            "require_candidate_results": "on",
            "perf_budget": "0.05",
            "perf_budgets": '{"gemm": 0.02}',
            "speed_budget": "0.1",
            "required_approvals": "3",
            "reviewer_group": "reviewer",
            "rollout_group": "reviewer",
            "backend_owners": '{"c": ["reviewer3"]}',
            "note": "gemm is hot",
        },
    )
    assert response.status_code == 302
    assert list(Policy.objects.values_list("version", "required_approvals")) == [
        (2, 3),
        (1, 2),
    ]
    assert Policy.current().perf_budgets == {"gemm": 0.02}
    assert Policy.current().speed_budget == 0.1


def test_the_policy_form_refuses_bad_json(client, admin_user, world):
    client.force_login(admin_user)
    response = client.post(
        reverse("upgrade-policy"),
        {
            "perf_budget": "0.05",
            "perf_budgets": "{gemm",
            "speed_budget": "0",
            "required_approvals": "2",
            "reviewer_group": "reviewer",
            "backend_owners": "{}",
        },
    )
    assert "not valid JSON" in response.content.decode()
    assert Policy.objects.count() == 1


def test_a_backend_owner_signs_off_from_the_page(client, admin_user, world, exception):
    policy_save(by=admin_user, backend_owners={"c": ["reviewer3"]})
    client.force_login(world.reviewers[2])
    assert "Sign off" in client.get(url("upgrade", exception.proposal)).content.decode()
    client.post(url("upgrade-exception-sign-off", None, exception))
    exception.refresh_from_db()
    assert exception.signed_off_by == world.reviewers[2]


def test_the_audit_trail_lists_exceptions_and_voided_decisions(
    client, admin_user, world, green
):
    policy_save(by=admin_user, backend_owners={"c": ["reviewer3"]})
    client.force_login(world.reviewers[0])
    client.post(url("upgrade-exception", green), {"backend": "c", "reason": "noisy"})
    client.post(url("upgrade-decide", green), {"decision": "reject", "comment": "no"})
    client.post(
        url("upgrade-decide", green),
        {"decision": "approve", "comment": "ok", "confirm": "on"},
    )
    client.force_login(world.reviewers[2])
    exception = BackendException.objects.get()
    client.post(url("upgrade-exception-sign-off", None, exception))
    # Someone else's proposal: its events stay out of this trail.
    other = proposal_open(
        baseline=world.old, candidate=world.new, device_types=[world.cpu], by=admin_user
    )
    proposal_reject(proposal=other, by=world.reviewers[1], comment="not now")
    proposal_approve(proposal=other, by=world.reviewers[1], comment="now")

    body = client.get(url("upgrade", green)).content.decode()
    trail = body[body.index('id="audit-heading"') :]
    assert "<td>reviewer</td><td>exception.grant</td>" in trail
    assert "<td>reviewer3</td><td>exception.sign_off</td>" in trail
    assert trail.count("<td>approval.void</td>") == 1


def test_an_exception_no_one_may_sign_off_says_so(client, admin_user, world, exception):
    client.force_login(world.reviewers[0])
    body = client.get(url("upgrade", exception.proposal)).content.decode()
    assert "the policy names no owner of c" in body
    assert "an admin sets one in the policy" in body
    client.force_login(admin_user)
    body = client.get(url("upgrade", exception.proposal)).content.decode()
    assert f'<a href="{reverse("upgrade-policy")}">set the backend owners</a>' in body
    policy_save(by=admin_user, backend_owners={"c": ["reviewer3"]})
    body = client.get(url("upgrade", exception.proposal)).content.decode()
    assert "awaits sign-off by its owner" in body
    assert "names no owner" not in body


def test_the_list_page_runs_a_fixed_number_of_queries(
    client, world, green, django_assert_max_num_queries
):
    for _ in range(3):
        proposal_open(
            baseline=world.old,
            candidate=world.new,
            device_types=[world.cpu],
            by=world.owner,
        )
    client.force_login(world.reviewers[0])
    # With a cold cache: the page's, and 3 catalogue reads (the nav's search
    # choices, device types, toolchains' runners) cached for the next page.
    with django_assert_max_num_queries(11):
        response = client.get(reverse("upgrades"))
    assert response.content.decode().count('href="/upgrades/') >= 4


def test_the_gate_status_polls_while_collecting_and_stops_after(client, world):
    world.green(world.old)
    online_runner("cpu-host", device_types=[world.cpu], toolchains=[world.new])
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    client.force_login(world.reviewers[0])
    page = url("upgrade", proposal)
    response = client.get(page, headers={"HX-Request": "true"})
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="gate-status"')
    assert 'hx-trigger="every 2s"' in body
    assert f'href="/sweeps/{proposal.sweeps.get().pk}/"' in body
    assert response["Vary"] == "HX-Request, HX-Target, Cookie"
    # The sweep's page links back to the proposal that planned it.
    sweep_page = client.get(url("sweep", proposal.sweeps.get())).content.decode()
    assert (
        f'<a href="/upgrades/{proposal.pk}/">upgrade proposal #{proposal.pk}</a>'
        in (sweep_page)
    )

    proposal.sweeps.get().jobs.update(state="done")
    world.green(world.new)
    proposal_reevaluate(proposal=proposal)
    response = client.get(page, headers={"HX-Request": "true"})
    assert response.status_code == 286
    assert 'data-state="ready"' in response.content.decode()


@pytest.mark.parametrize("page", ["matrix", "gaps", "runners", "submissions"])
def test_the_upgrade_gate_is_in_every_pages_navigation(client, world, page):
    client.force_login(world.reviewers[0])
    body = client.get(reverse(page)).content.decode()
    nav = body.split('<nav aria-label="Pages">', 1)[1].split("</nav>", 1)[0]
    assert f'href="{reverse("upgrades")}"' in nav


def test_a_reviewer_who_rejected_approves_later_from_the_page(client, world, green):
    client.force_login(world.reviewers[1])
    decide = url("upgrade-decide", green)
    client.post(decide, {"decision": "reject", "comment": "changed my mind"})
    response = client.post(
        decide,
        {"decision": "approve", "comment": "fine after all", "confirm": "on"},
        follow=True,
    )
    body = response.content.decode()
    assert 'data-state="ready"' in body
    assert "needs 2 approvals from the reviewer group, has 1" in body


def test_the_decision_list_says_approved_and_rejected(client, world, green):
    proposal_approve(proposal=green, by=world.reviewers[0], comment="clean diff")
    proposal_reject(proposal=green, by=world.reviewers[1], comment="wait for 0.1.16")
    client.force_login(world.reviewers[2])
    body = client.get(url("upgrade", green)).content.decode()
    assert "<strong>reviewer</strong> approved: “clean diff”" in body
    assert "<strong>reviewer2</strong> rejected: “wait for 0.1.16”" in body


def typed_into_textarea(text: str, body: str) -> bool:
    # Django writes a newline before a textarea's text.
    return f">\n{text}</textarea>" in body


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_a_decision_without_a_choice_keeps_the_comment(client, world, green, htmx):
    client.force_login(world.reviewers[0])
    response = client.post(
        url("upgrade-decide", green),
        {"comment": "looks right to me"},
        headers={"HX-Request": "true"} if htmx else {},
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert "choose approve or reject" in body
    assert typed_into_textarea("looks right to me", body)
    # htmx swaps the form in place; without it the whole page comes back.
    assert body.lstrip().startswith('<form method="post"') == htmx
    # Focus goes to the field to fix (htmx focuses [autofocus] it swaps in).
    assert re.search(
        r'<input type="radio" name="decision" value="approve"[^>]* autofocus', body
    )
    assert not re.search(r"<textarea[^>]* autofocus", body)
    assert not Approval.objects.exists()


def test_a_refused_approval_keeps_the_comment(client, world, proposal):
    client.force_login(world.reviewers[0])
    response = client.post(
        url("upgrade-decide", proposal),
        {"decision": "approve", "comment": "ship it", "confirm": "on"},
    )
    body = response.content.decode()
    assert "cannot approve while blocked: served cell softmax" in body
    assert typed_into_textarea("ship it", body)
    assert 'value="approve" required id="id_decision_0" checked>' in body
    # Refused as a whole: focus goes to the alert saying why.
    assert '<div role="alert" tabindex="-1" autofocus>' in body


def test_a_decision_over_htmx_reloads_the_page(client, world, green):
    client.force_login(world.reviewers[0])
    response = client.post(
        url("upgrade-decide", green),
        {"decision": "approve", "comment": "clean diff", "confirm": "on"},
        headers={"HX-Request": "true"},
    )
    assert response["HX-Redirect"] == url("upgrade", green)
    assert Approval.objects.get().comment == "clean diff"


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_an_exception_without_a_backend_keeps_the_reason(client, world, green, htmx):
    client.force_login(world.reviewers[0])
    response = client.post(
        url("upgrade-exception", green),
        {"reason": "CPU gemm is not served"},
        headers={"HX-Request": "true"} if htmx else {},
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert "choose a backend" in body
    assert typed_into_textarea("CPU gemm is not served", body)
    assert body.lstrip().startswith('<form method="post"') == htmx
    assert not BackendException.objects.exists()


def test_a_reviewer_grants_an_exception_from_the_page(client, world, green):
    client.force_login(world.reviewers[0])
    response = client.post(
        url("upgrade-exception", green), {"backend": "c", "reason": "not served"}
    )
    assert response["Location"] == url("upgrade", green)
    assert BackendException.objects.get().granted_by == world.reviewers[0]


def test_a_backend_with_an_exception_is_not_offered_again(client, world, green):
    client.force_login(world.reviewers[0])
    assert 'id="exception-form"' in client.get(url("upgrade", green)).content.decode()
    client.post(url("upgrade-exception", green), {"backend": "c", "reason": "noise"})
    page = client.get(url("upgrade", green)).content.decode()
    # The proposal covers the c column only: nothing is left to grant.
    assert 'id="exception-form"' not in page
    assert "Every backend of this proposal has an exception." in page


def test_the_proposer_cannot_grant_an_exception_from_the_page(client, world, green):
    client.force_login(world.owner)
    page = client.get(url("upgrade", green)).content.decode()
    assert 'id="exception-form"' not in page
    assert "another reviewer must grant any exception" in page
    response = client.post(
        url("upgrade-exception", green), {"backend": "c", "reason": "my own waiver"}
    )
    assert response.status_code == 403
    body = response.content.decode()
    assert "You proposed this upgrade, so another reviewer grants any exception" in body
    # No role would help: the page does not send them to an admin for one.
    assert "an admin can give your account the role" not in body
    assert not BackendException.objects.exists()


def test_the_rolled_out_state_is_capitalised_like_the_others(client, world, green):
    proposal_approve(proposal=green, by=world.reviewers[0], comment="ok")
    proposal_approve(proposal=green, by=world.reviewers[1], comment="ok")
    proposal_rollout(proposal=green, by=world.reviewers[2])
    client.force_login(world.reviewers[0])
    body = client.get(reverse("upgrades")).content.decode()
    assert '<span class="badge rolled_out">Rolled out</span>' in body


POLICY_POST = {
    "forbid_served_regressions": "on",
    "require_candidate_results": "on",
    "perf_budget": "0.05",
    "perf_budgets": "{}",
    "speed_budget": "0",
    "required_approvals": "2",
    "reviewer_group": "reviewer",
    "rollout_group": "reviewer",
    "backend_owners": "{}",
}


@pytest.mark.parametrize(
    "field,typed,error",
    [
        ("perf_budget", "-1", "must not be negative"),
        ("speed_budget", "-0.1", "must not be negative"),
        ("speed_budget", "fast", "Enter a number."),
        ("required_approvals", "0", "must be at least 1"),
        (
            "backend_owners",
            '{"zz": ["reviewer3"]}',
            "unknown backend zz; the backends are cuda, hip, metal, c, npu",
        ),
        ("backend_owners", '{"c": ["alice"]}', "no user named alice"),
        (
            "perf_budgets",
            '{"nope": 0.1}',
            "unknown operator nope; the operators are gemm, softmax",
        ),
        ("perf_budgets", '{"gemm": -0.1}', "the budget for gemm must be a number"),
        ("reviewer_group", "reviewers", "no group named reviewers; create it"),
    ],
)
def test_the_policy_form_says_what_is_wrong_with_a_field(
    client, admin_user, world, field, typed, error
):
    client.force_login(admin_user)
    response = client.post(reverse("upgrade-policy"), {**POLICY_POST, field: typed})
    assert response.status_code == 200
    body = response.content.decode()
    field_errors = body.split(f'id="id_{field}_error"', 1)[1].split("</ul>", 1)[0]
    assert error in field_errors
    assert "Constraint" not in body
    assert f'value="{escape(typed)}"' in body
    assert Policy.objects.count() == 1


@pytest.fixture
def many_missing(world):
    """120 more served shapes, none run on the candidate, and no runner
    online to run them: 122 served cells blocked as missing."""
    softmax = world.shapes["softmax"].operator
    for n in range(120):
        Shape.objects.create(
            operator=softmax,
            dims={"M": n + 1, "N": 512},
            dtype="float32",
            served=True,
            weight=1.0,
        )
    world.green(world.old)
    return proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )


def test_many_blocking_cells_are_summarised_above_the_decision_form(
    client, world, many_missing
):
    client.force_login(world.reviewers[0])
    body = client.get(url("upgrade", many_missing)).content.decode()
    reasons = body.split('id="blocking-reasons">')[1].split("</ul>")[0]
    assert reasons.count("<li>") == 3
    assert (
        "<li>122 served cells have no candidate result: gemm[M=64,N=64,K=64] "
        "float32 on x86-64 CPU · c; softmax[M=1,N=512] float32 on x86-64 CPU · c; "
        "softmax[M=10,N=512] float32 on x86-64 CPU · c and 119 more</li>"
    ) in reasons
    assert "no online runner can produce the missing results" in reasons
    assert "List the 122 blocking cells" in body
    # What a reviewer acts on comes before the diff's tables.
    assert body.index('id="decision-form"') < body.index('id="summary-heading"')


def pager_link(body: str, name: str) -> dict:
    """The query of the pager's ``name`` link (next, previous, first, last)."""
    found = re.search(rf'href="\?([^"#]*)#cells"[^>]*>{name}</a>', body)
    assert found, f"no {name} link"
    return dict(pair.split("=") for pair in found.group(1).split("&amp;"))


def test_the_blocking_cells_are_listed_a_page_at_a_time(client, world, many_missing):
    client.force_login(world.reviewers[0])
    page = url("upgrade", many_missing)
    htmx = {"HX-Request": "true", "HX-Target": "diff-rows"}
    first = client.get(page, {"blocking": "1"}).content.decode()
    assert first.count('data-blocking="missing"') == 50
    assert "Cells 1–50 of 122" in first
    second = client.get(page, pager_link(first, "next"), headers=htmx).content.decode()
    assert second.lstrip().startswith('<div id="diff-rows">')
    assert "Cells 51–100 of 122" in second
    third = client.get(page, pager_link(second, "next"), headers=htmx).content.decode()
    assert third.count('data-blocking="missing"') == 22
    assert "Cells 101–122 of 122" in third
    assert ">next</a>" not in third
    shown = [
        re.findall(r'data-cell="([^"]+)"', body) for body in (first, second, third)
    ]
    assert len({cell for rows in shown for cell in rows}) == 122
    # Back from the last page, and straight to it: the same rows.
    back = client.get(
        page, pager_link(third, "previous"), headers=htmx
    ).content.decode()
    assert re.findall(r'data-cell="([^"]+)"', back) == shown[1]
    last = client.get(page, pager_link(first, "last"), headers=htmx).content.decode()
    assert re.findall(r'data-cell="([^"]+)"', last)[-22:] == shown[2]


def test_the_proposal_page_runs_a_fixed_number_of_queries(
    client, world, many_missing, django_assert_max_num_queries
):
    client.force_login(world.reviewers[0])
    # However many rows: the page's, 6 for its stalled jobs, the layout's,
    # 3 for its rows and the speeds kept at the power cap, and with a cold
    # cache 3 catalogue reads cached for the next page.
    with django_assert_max_num_queries(23):
        response = client.get(url("upgrade", many_missing))
    assert response.status_code == 200
    # The next view reads its rows and its open jobs' counts from the cache.
    with django_assert_max_num_queries(15) as again:
        assert client.get(url("upgrade", many_missing)).status_code == 200
    sqls = [q["sql"] for q in again.captured_queries]
    assert [q for q in sqls if "matrix_validationjob" in q] == [
        'SELECT (SELECT MAX(id) FROM "matrix_validationjob"), '
        '(SELECT MAX(id) FROM "matrix_result")'
    ]
    assert not any("matrix_diffrow" in q for q in sqls)


def test_the_form_says_why_its_choices_are_empty(client, people):
    owner, _ = people
    client.force_login(owner)
    body = client.get(reverse("upgrade-new")).content.decode()
    note = body.split('id="cannot-propose">')[1].split("</div>")[0]
    assert "No toolchains yet" in note and "No device types yet" in note


def test_the_form_with_choices_to_make_has_no_empty_note(client, world):
    client.force_login(world.owner)
    assert (
        'id="cannot-propose"' not in client.get(reverse("upgrade-new")).content.decode()
    )


def test_re_evaluate_now_asks_the_control_worker_and_the_page_follows(
    client, world, green, django_capture_on_commit_callbacks, control_worker
):
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    client.force_login(world.reviewers[0])
    page = url("upgrade", green)
    with django_capture_on_commit_callbacks() as enqueued:
        response = client.post(url("upgrade-reevaluate", green), follow=True)
    body = response.content.decode()
    assert "Re-evaluation requested" in body
    assert 'id="reevaluation-pending"' in body and 'data-state="ready"' in body
    assert len(enqueued) == 1
    evaluated = re.search(r"\?evaluated=([^\"]*)\"", body).group(1)
    poll = {"evaluated": unquote(evaluated)}
    htmx = {"HX-Request": "true"}
    assert "HX-Refresh" not in client.get(page, poll, headers=htmx)

    control_worker(enqueued[0])
    assert client.get(page, poll, headers=htmx)["HX-Refresh"] == "true"
    assert 'data-state="blocked"' in client.get(page).content.decode()


def test_a_reader_who_cannot_act_gets_the_kept_page_with_their_own_name(
    client, world, green, outsider, django_user_model
):
    from django.test import Client

    from tests.conftest import _viewer

    client.force_login(outsider)
    assert client.get(url("upgrade", green)).templates, "the first view renders"
    other = Client()
    other.force_login(_viewer(django_user_model.objects.create_user("onlooker")))
    kept = other.get(url("upgrade", green))
    assert kept.status_code == 200
    assert not kept.templates, "the second reader's view runs no template"
    body = kept.content.decode()
    assert "onlooker ·" in body and "outsider ·" not in body
    assert 'id="decision-form"' not in body


def test_a_decision_shows_on_the_next_kept_view(client, world, green, outsider):
    client.force_login(outsider)
    client.get(url("upgrade", green))
    proposal_approve(proposal=green, by=world.reviewers[0], comment="clean diff")
    body = client.get(url("upgrade", green)).content.decode()
    assert "<strong>reviewer</strong> approved: “clean diff”" in body


def test_a_reviewer_never_gets_a_readers_kept_page(client, world, green, outsider):
    client.force_login(outsider)
    client.get(url("upgrade", green))
    client.force_login(world.reviewers[0])
    response = client.get(url("upgrade", green))
    assert response.templates, "a reviewer's page is rendered for them"
    assert 'id="decision-form"' in response.content.decode()


def test_an_audited_edit_elsewhere_shows_on_the_next_kept_view(
    client, world, green, outsider, admin_user
):
    from matrix.models import AuditEvent

    client.force_login(outsider)
    assert (
        "Proposed by <strong>owner</strong>"
        in client.get(url("upgrade", green)).content.decode()
    )
    # A rename in the admin site, which records every change it makes.
    world.owner.username = "owner-renamed"
    world.owner.save()
    AuditEvent.record(actor=admin_user, verb="change", obj=world.owner)
    body = client.get(url("upgrade", green)).content.decode()
    assert "Proposed by <strong>owner-renamed</strong>" in body


def test_a_reader_arriving_while_another_renders_the_new_page_gets_the_one_before(
    client, world, green, outsider, django_user_model, monkeypatch
):
    from django.test import Client

    from tests.conftest import _viewer
    from tests.ui.test_page_cache import _another_reader_computes_every_answer

    client.force_login(outsider)
    client.get(url("upgrade", green))
    proposal_approve(proposal=green, by=world.reviewers[0], comment="clean diff")
    _another_reader_computes_every_answer(monkeypatch)
    other = Client()
    other.force_login(_viewer(django_user_model.objects.create_user("onlooker")))
    earlier = other.get(url("upgrade", green))
    assert earlier.status_code == 200 and not earlier.templates
    assert "clean diff" not in earlier.content.decode(), "the page before"
    monkeypatch.undo()
    assert "clean diff" in other.get(url("upgrade", green)).content.decode()


def test_an_approval_says_what_it_did(client, world, green):
    proposal_approve(proposal=green, by=world.reviewers[0], comment="ok")
    client.force_login(world.reviewers[1])
    response = client.post(
        url("upgrade-decide", green),
        {"decision": "approve", "comment": "ok", "confirm": "on"},
        follow=True,
    )
    green.refresh_from_db()
    entries = green.manifest_entries.count()
    assert entries and green.state == UpgradeProposal.State.APPROVED
    assert f"Approved. The manifest for {world.new.name} has {entries} entries" in (
        response.content.decode()
    )


def test_rejecting_an_approved_proposal_shows_what_production_loses_and_asks_first(
    client, world, green
):
    proposal_approve(proposal=green, by=world.reviewers[0], comment="ok")
    proposal_approve(proposal=green, by=world.reviewers[1], comment="ok")
    entries = green.manifest_entries.count()
    assert entries
    client.force_login(world.reviewers[2])
    preview = f"{world.new.name} goes from {entries} entries to 0"
    page = client.get(url("upgrade", green)).content.decode()
    assert preview in page.split('id="reject-preview"')[1]
    decide = url("upgrade-decide", green)
    refused = client.post(decide, {"decision": "reject", "comment": "wait"})
    assert preview in refused.content.decode() and "Tick the box" in (
        refused.content.decode()
    )
    green.refresh_from_db()
    assert green.state == UpgradeProposal.State.APPROVED
    assert green.manifest_entries.count() == entries
    done = client.post(
        decide, {"decision": "reject", "comment": "wait", "confirm": "on"}, follow=True
    )
    green.refresh_from_db()
    assert green.state == UpgradeProposal.State.REJECTED
    assert f"The manifest for {world.new.name} is withdrawn" in done.content.decode()


def test_a_roll_out_needs_its_confirmation(client, world, green):
    from matrix.models import AuditEvent

    proposal_approve(proposal=green, by=world.reviewers[0], comment="ok")
    proposal_approve(proposal=green, by=world.reviewers[1], comment="ok")
    client.force_login(world.reviewers[2])
    page = client.get(url("upgrade", green)).content.decode()
    form = page.split('id="rollout-form"')[1].split("</form>")[0]
    assert 'name="confirm" required' in form and "This is final" in form
    assert 'name="comment" required' in form
    for refused in ({}, {"confirm": "on"}, {"comment": "release day"}):
        response = client.post(url("upgrade-rollout", green), refused, follow=True)
        assert "Not rolled out: write why, and tick the box" in (
            response.content.decode()
        )
    green.refresh_from_db()
    assert green.state == UpgradeProposal.State.APPROVED
    response = client.post(
        url("upgrade-rollout", green),
        {"confirm": "on", "comment": "release day"},
        follow=True,
    )
    green.refresh_from_db()
    assert green.state == UpgradeProposal.State.ROLLED_OUT
    assert f"Rolled out: {world.new.name} is the current toolchain" in (
        response.content.decode()
    )
    event = AuditEvent.objects.get(verb="proposal.rollout")
    assert event.after["comment"] == "release day"
