"""What a proposal waits for: the jobs no online runner can take, named by
the runner they lack, on the page and in a refused approval; and, once
nothing more can arrive, a decision on the evidence there is."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from matrix.fleet.models import compile_queue, validate_queue
from matrix.gate.manifest import manifest_for
from matrix.gate.services import (
    policy_save,
    proposal_approve,
    proposal_jobs_in_flight,
    proposal_open,
    proposal_reject,
)
from matrix.models import JobStage, Status, ValidationJob
from matrix.models.gate import UpgradeProposal
from tests.gate.conftest import online_runner


@pytest.fixture
def unhosted_baseline(world):
    """A CPU runner hosts only the candidate: the cuda cells of the baseline,
    which has no result there, can run nowhere."""
    online_runner("cpu-host", device_types=[world.cpu], toolchains=[world.new])
    world.green(world.old)
    return proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu, world.h200],
        by=world.owner,
    )


STALLED = (
    "2 validation jobs on tilelang-0.1.13 for NVIDIA H200 · sm_90a · cuda "
    "(no online runner hosts tilelang-0.1.13)"
)


def test_the_page_names_the_jobs_no_online_runner_can_take(
    client, world, unhosted_baseline
):
    client.force_login(world.reviewers[0])
    body = client.get(reverse("upgrade", args=[unhosted_baseline.pk])).content.decode()
    assert 'data-state="collecting"' in body
    assert "6 validation jobs on its served cells are queued or running" in body
    stalled = body.split('id="stalled-jobs"', 1)[1].split("</div>", 1)[0]
    assert "2 of them wait on queues no online" in stalled
    assert (
        f"<li>{STALLED} would run on a runner that hosts tilelang-0.1.13, "
        "compile-only (lower); a pass needs a runner with NVIDIA H200 · sm_90a · "
        "cuda that hosts tilelang-0.1.13</li>"
    ) in stalled
    assert "Online runners host tilelang-0.1.15." in stalled


def jobs_panel(client, proposal) -> tuple[int, str]:
    """The open jobs the page counts, and its note on the stalled ones."""
    body = client.get(reverse("upgrade", args=[proposal.pk])).content.decode()
    count = re.search(r"(\d+) validation jobs? on its served cells are queued", body)
    stalled = body.partition('id="stalled-jobs"')[2].split("</div>", 1)[0]
    return int(count[1]), stalled


def test_the_page_follows_its_jobs_and_runners_from_one_view_to_the_next(
    client, world, unhosted_baseline
):
    """The counts are kept between views: a runner coming online, a result
    and a new job each show on the next view."""
    client.force_login(world.reviewers[0])
    count, stalled = jobs_panel(client, unhosted_baseline)
    assert count == 6 and "2 of them wait on queues no online" in stalled
    online_runner("h200-old", device_types=[world.h200], toolchains=[world.old])
    assert jobs_panel(client, unhosted_baseline) == (6, "")
    job = ValidationJob.objects.open().filter(toolchain=world.new).first()
    job.state = ValidationJob.State.DONE
    job.save()
    world.record(job.shape, job.device_type, job.toolchain, Status.PASS)
    assert jobs_panel(client, unhosted_baseline) == (5, "")
    queued(
        world, "gemm", world.h200, world.old, stage=JobStage.VALIDATE, queue="nowhere"
    )
    count, stalled = jobs_panel(client, unhosted_baseline)
    assert count == 6 and "1 of them wait" in stalled


def test_approving_while_collecting_says_what_to_wait_for(world, unhosted_baseline):
    with pytest.raises(ValidationError) as refused:
        proposal_approve(
            proposal=unhosted_baseline, by=world.reviewers[0], comment="ship it"
        )
    assert refused.value.messages == [
        "cannot approve while collecting: wait for the 6 validation jobs still "
        "queued or running on its served cells and approve once their results are "
        f"in; 2 of them wait on queues no online runner reads: {STALLED}"
    ]


def queued(world, shape, device_type, toolchain, *, stage, queue):
    return ValidationJob.objects.create(
        revision=world.shapes[shape].operator.current_revision(device_type.backend),
        shape=world.shapes[shape],
        device_type=device_type,
        toolchain=toolchain,
        stage=stage,
        queue=queue,
    )


def test_each_stalled_group_names_the_runner_it_lacks(world):
    # Reruns routed while other runners were online; now only these two are.
    online_runner("cpu-host", device_types=[world.cpu], toolchains=[world.old])
    online_runner("cpu-new", device_types=[world.cpu], toolchains=[world.new])
    world.green(world.old, [world.cpu, world.h200])
    world.green(world.new, [world.cpu, world.h200])
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu, world.h200],
        by=world.owner,
    )
    h200, old, new = world.h200, world.old, world.new
    validate_old = validate_queue(device_type_id=h200.pk, toolchain_id=old.pk)
    build_new = compile_queue(toolchain_id=new.pk, nvcc=True)
    lower_new = compile_queue(toolchain_id=new.pk)
    queued(world, "softmax", h200, old, stage=JobStage.VALIDATE, queue=validate_old)
    queued(world, "softmax", h200, new, stage=JobStage.BUILD, queue=build_new)
    # cpu-new reads this one: it waits its turn, it is not stalled.
    queued(world, "gemm", h200, new, stage=JobStage.LOWER, queue=lower_new)
    jobs = proposal_jobs_in_flight(proposal=proposal)
    assert jobs.open == 3
    assert [str(group) for group in jobs.stalled] == [
        "1 validation job on tilelang-0.1.13 for NVIDIA H200 · sm_90a · cuda "
        "(no online runner with NVIDIA H200 · sm_90a · cuda hosts tilelang-0.1.13)",
        "1 validation job on tilelang-0.1.15 for NVIDIA H200 · sm_90a · cuda "
        "(no online runner that hosts tilelang-0.1.15 has nvcc)",
    ]


@pytest.fixture
def unrunnable_candidate(world):
    """No runner online: the candidate's softmax cell was planned where no
    one reads, and nothing more can arrive for it."""
    world.green(world.old)
    world.record("gemm", world.cpu, world.new, Status.PASS)
    return proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )


MISSING = "served cell softmax[M=64,N=256] float32 on x86-64 CPU · c"
UNBLOCK = (
    "no online runner can produce the missing results, so nothing more can "
    "arrive until one comes online: 1 validation job on tilelang-0.1.15 for "
    "x86-64 CPU · c (no online runner hosts tilelang-0.1.15) would run on a "
    "runner that hosts tilelang-0.1.15, compile-only (lower); a pass needs a "
    "runner with x86-64 CPU · c that hosts tilelang-0.1.15"
)


def test_a_proposal_nothing_more_can_reach_is_judged_on_its_evidence(
    client, world, unrunnable_candidate
):
    proposal = unrunnable_candidate
    assert proposal.state == UpgradeProposal.State.BLOCKED
    assert proposal.blocking_reasons == [
        f"{MISSING} has no candidate result",
        UNBLOCK,
        "needs 2 approvals from the reviewer group, has 0",
    ]
    client.force_login(world.reviewers[0])
    body = client.get(reverse("upgrade", args=[proposal.pk])).content.decode()
    assert 'data-state="blocked"' in body
    assert "Nothing more can arrive until then" in body
    assert 'hx-trigger="every 2s"' not in body


def test_reviewers_decide_on_the_evidence_there_is(world, unrunnable_candidate):
    proposal = unrunnable_candidate
    with pytest.raises(ValidationError) as refused:
        proposal_approve(proposal=proposal, by=world.reviewers[0], comment="ship it")
    assert refused.value.messages == [
        f"cannot approve while blocked: {MISSING} has no candidate result; {UNBLOCK}"
    ]
    proposal_reject(proposal=proposal, by=world.reviewers[0], comment="not without it")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.REJECTED


def test_a_policy_that_does_not_require_every_result_lets_it_through(
    client, world, admin_user, unrunnable_candidate
):
    policy_save(by=admin_user, require_candidate_results=False)
    proposal = unrunnable_candidate
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.READY
    client.force_login(world.reviewers[0])
    body = client.get(reverse("upgrade", args=[proposal.pk])).content.decode()
    note = body.split('id="missing-not-required">')[1].split("</p>")[0]
    assert note == (
        "1 served cell has no candidate result; the policy does not require one, "
        "so the manifest serves the PyTorch reference there."
    )
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="gemm is fine")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.APPROVED
    choices = {
        (e["operator"], e["choice"], e["reason"])
        for e in manifest_for(toolchain=world.new)["entries"]
        if e["operator"] in ("gemm", "softmax") and e["shape_rule"]["dims"]["M"] == 64
    }
    assert choices == {
        (
            "gemm",
            "tilelang",
            "validated: pass on tilelang-0.1.15, 1.00× of the reference",
        ),
        ("softmax", "reference", "not validated on tilelang-0.1.15"),
    }
