"""policy_evaluate, one row per rule: what blocks, in words, naming the cell."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError

from matrix.gate.services import (
    exception_grant,
    exception_sign_off,
    policy_evaluate,
    policy_save,
    proposal_approve,
    proposal_open,
)
from matrix.models import Status
from matrix.models.gate import Policy, UpgradeProposal

SOFTMAX = "served cell softmax[M=64,N=256] float32 on x86-64 CPU · c"
GEMM = "served cell gemm[M=64,N=64,K=64] float32 on x86-64 CPU · c"
TIGHT = [1.0, 1.01, 0.99]  # a 1.5% robust spread each side


def tight(ms):
    return [ms * s for s in TIGHT]


CASES = [
    # id, baseline {shape: (status, ms, samples)}, candidate {...}, policy, expected
    ("all green", {}, {}, {}, []),
    (
        "served pass to compile_error",
        {},
        {"softmax": (Status.COMPILE_ERROR, None, None)},
        {},
        [f"{SOFTMAX} went from pass to compile_error"],
    ),
    (
        "served pass to unsupported is a regression too",
        {},
        {"gemm": (Status.UNSUPPORTED, None, None)},
        {},
        [f"{GEMM} went from pass to unsupported"],
    ),
    (
        "regression allowed when the rule is off",
        {},
        {"softmax": (Status.MISMATCH, None, None)},
        {"forbid_served_regressions": False},
        [],
    ),
    (
        "unserved regression does not block",
        {"unserved": (Status.PASS, 1.0, None)},
        {"unserved": (Status.COMPILE_ERROR, None, None)},
        {},
        [],
    ),
    (
        "red to green does not block",
        {"softmax": (Status.COMPILE_ERROR, None, None)},
        {},
        {},
        [],
    ),
    (
        "missing candidate result",
        {},
        {"gemm": None},
        {},
        [f"{GEMM} has no candidate result"],
    ),
    (
        "missing allowed when the rule is off",
        {},
        {"gemm": None},
        {"require_candidate_results": False},
        [],
    ),
    (
        "20% slower over the 5% default budget",
        {"gemm": (Status.PASS, 1.0, tight(1.0))},
        {"gemm": (Status.PASS, 1.2, tight(1.2))},
        {},
        [f"{GEMM} is 20% slower (ratio 1.20 ± 0.02), over the 5% budget for gemm"],
    ),
    (
        "3% slower is within the budget",
        {"gemm": (Status.PASS, 1.0, tight(1.0))},
        {"gemm": (Status.PASS, 1.03, tight(1.03))},
        {},
        [],
    ),
    (
        "20% slower inside a wide noise band does not block",
        {"gemm": (Status.PASS, 1.0, [0.7, 1.0, 1.3])},
        {"gemm": (Status.PASS, 1.2, [0.9, 1.2, 1.5])},
        {},
        [],
    ),
    (
        "one sample each takes the default band",
        {"gemm": (Status.PASS, 1.0, None)},
        {"gemm": (Status.PASS, 1.2, None)},
        {},
        [f"{GEMM} is 20% slower (ratio 1.20 ± 0.07), over the 5% budget for gemm"],
    ),
    (
        "per-operator budget",
        {"gemm": (Status.PASS, 1.0, tight(1.0))},
        {"gemm": (Status.PASS, 1.2, tight(1.2))},
        {"perf_budgets": {"gemm": 0.25}},
        [],
    ),
    (
        "per-operator budget tighter than the default",
        {"softmax": (Status.PASS, 1.0, tight(1.0))},
        {"softmax": (Status.PASS, 1.04, tight(1.04))},
        {"perf_budgets": {"softmax": 0.01}},
        [f"{SOFTMAX} is 4% slower (ratio 1.04 ± 0.02), over the 1% budget for softmax"],
    ),
    (
        "a candidate infra_error is a missing result, not a regression",
        {},
        {"gemm": (Status.INFRA_ERROR, None, None)},
        {},
        [
            f"{GEMM} has no candidate result (its run hit runner trouble: "
            "infra_error, not the kernel)"
        ],
    ),
]


def put(world, toolchain, cells):
    for shape in ("softmax", "gemm"):
        cells.setdefault(shape, (Status.PASS, 1.0, None))
    for shape, cell in cells.items():
        if cell is not None:
            status, ms, samples = cell
            world.record(shape, world.cpu, toolchain, status, ms, samples)


@pytest.mark.parametrize(
    "baseline,candidate,policy,expected",
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_policy_rules(world, admin_user, baseline, candidate, policy, expected):
    if policy:
        policy_save(by=admin_user, **policy)
    put(world, world.old, dict(baseline))
    put(world, world.new, dict(candidate))
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    reasons = policy_evaluate(proposal=proposal)
    assert reasons[:-1] == expected
    assert reasons[-1] == "needs 2 approvals from the reviewer group, has 0"


def green_proposal(world):
    world.green(world.old)
    world.green(world.new)
    return proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )


def test_it_needs_the_required_number_of_reviewer_approvals(world):
    proposal = green_proposal(world)
    assert proposal.state == UpgradeProposal.State.READY
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="diff is clean")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.READY
    assert policy_evaluate(proposal=proposal) == [
        "needs 2 approvals from the reviewer group, has 1"
    ]
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.APPROVED
    assert policy_evaluate(proposal=proposal) == []


def test_a_lower_required_count_approves_with_one(world, admin_user):
    policy_save(by=admin_user, required_approvals=1)
    proposal = green_proposal(world)
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="fine")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.APPROVED


def test_an_approval_from_outside_the_reviewer_group_does_not_count(world, admin_user):
    proposal = green_proposal(world)
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="fine")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="fine")
    Group.objects.create(name="release-reviewers")
    policy_save(by=admin_user, reviewer_group="release-reviewers")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.READY
    assert policy_evaluate(proposal=proposal) == [
        "needs 2 approvals from the release-reviewers group, has 0"
    ]


def test_a_backend_exception_counts_only_once_its_owner_signs(world, admin_user):
    owner_of_c = world.reviewers[2]
    policy_save(by=admin_user, backend_owners={"c": [owner_of_c.username]})
    world.record("gemm", world.cpu, world.old, Status.PASS, 1.0, tight(1.0))
    world.record("softmax", world.cpu, world.old, Status.PASS, 1.0, None)
    world.record("gemm", world.cpu, world.new, Status.PASS, 1.3, tight(1.3))
    world.record("softmax", world.cpu, world.new, Status.PASS, 1.0, None)
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    exception = exception_grant(
        proposal=proposal,
        backend="c",
        reason="CPU gemm is not served in production",
        by=world.reviewers[0],
    )
    assert policy_evaluate(proposal=proposal)[0] == (
        f"{GEMM} is 30% slower (ratio 1.30 ± 0.02), over the 5% budget for gemm; "
        f"the c exception awaits sign-off by its owner ({owner_of_c.username})"
    )
    with pytest.raises(Exception, match="only an owner of the c backend"):
        exception_sign_off(exception=exception, by=world.reviewers[1])
    exception_sign_off(exception=exception, by=owner_of_c)
    assert policy_evaluate(proposal=proposal) == [
        "needs 2 approvals from the reviewer group, has 0"
    ]


def test_policy_edits_write_new_versions_and_only_admins_edit(world, admin_user):
    first = Policy.current()
    second = policy_save(by=admin_user, perf_budget=0.1)
    assert (first.version, second.version) == (1, 2)
    assert Policy.current().perf_budget == 0.1
    first.refresh_from_db()
    assert first.perf_budget == 0.05
    with pytest.raises(PermissionError):
        second.save()
    with pytest.raises(Exception, match="only admins"):
        policy_save(by=world.reviewers[0], perf_budget=0.5)


def test_infra_errors_count_as_missing_evidence_in_the_diff(world):
    for shape in ("softmax", "gemm"):
        world.record(shape, world.cpu, world.old, Status.INFRA_ERROR)
    world.record("softmax", world.cpu, world.new, Status.PASS)
    world.record("gemm", world.cpu, world.new, Status.INFRA_ERROR)
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    summary = proposal.summary
    assert (summary["red_to_green"], summary["still_red"]) == (0, 0)
    assert (summary["new"], summary["missing"]) == (1, 1)
    assert proposal.state == UpgradeProposal.State.BLOCKED


def test_policy_save_refuses_unknown_backends_users_and_operators(world, admin_user):
    current = Policy.current()
    with pytest.raises(ValidationError) as refused:
        policy_save(
            by=admin_user,
            backend_owners={"zz": ["alice"]},
            perf_budgets={"nope": 0.1},
        )
    assert refused.value.message_dict == {
        "backend_owners": [
            "unknown backend zz; the backends are cuda, hip, metal, c, npu",
            "no user named alice",
        ],
        "perf_budgets": ["unknown operator nope; the operators are gemm, softmax"],
    }
    assert list(Policy.objects.all()) == [current]


def test_a_candidate_thousands_of_times_slower_is_stored_as_slower(world):
    # 1,700x slower is 33,980 steps of 5%: past a smallint, it aborted the
    # diff's store on PostgreSQL and was stored wrapped, as a speed-up, on
    # SQLite.
    world.green(world.old, kernel_ms=1.0)
    world.green(world.new, kernel_ms=1700.0)
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    rows = list(proposal.diff_rows.all())
    assert len(rows) == 2
    for row in rows:
        assert row.ratio == pytest.approx(1700.0)
        assert row.perf_step == 33980
    assert proposal.summary["slower"] == 2
