"""What the policy says of a proposal, read from its stored diff: every
reason in words, the state they put it in, and what it waits for (its jobs
in flight, and those no online runner can take, with the runner that would).

Nothing here writes; ``matrix.gate.services`` stores what it finds."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.db.models import Count

from matrix.cache import cache_seconds, cached_read, jobs_version, read_key
from matrix.fleet.models import Runner
from matrix.gate.diff import CellDiff, Change
from matrix.models import DeviceType, JobStage, Status, Toolchain, ValidationJob
from matrix.models.gate import Approval, Policy, ProposalState, UpgradeProposal
from matrix.queries import toolchains_online

# A rule failing on more cells than this is said once, with a count and the
# first of them; the proposal page lists every one.
REASONS_PER_RULE = 3
RULES = ("regression", "missing", "slower")


# -- jobs in flight -------------------------------------------------------------


def open_jobs(proposal: UpgradeProposal):
    """Jobs still queued or running on the proposal's served cells, whoever
    planned them: a cell already in flight when the proposal opened is not
    planned twice, but its result is awaited all the same."""
    return ValidationJob.objects.open().filter(
        shape__served=True,
        device_type__in=proposal.device_types.all(),
        toolchain__in=[proposal.baseline_id, proposal.candidate_id],
    )


@dataclass
class StalledJobs:
    """Queued jobs of one toolchain on one device type that sit on a queue no
    online runner reads: they run only once a runner that can take them
    comes online."""

    toolchain: Toolchain
    device_type: DeviceType
    count: int
    missing_runner: str
    stage: str = JobStage.VALIDATE

    def __str__(self) -> str:
        return (
            f"{jobs_phrase(self.count)} on {self.toolchain} for {self.device_type} "
            f"({self.missing_runner})"
        )

    @property
    def wanted(self) -> str:
        """The runner that would take them (a job's queue follows from its
        stage: matrix.fleet.services.routes_for), and, for compile-only jobs,
        the one a pass needs."""
        validating = f"a runner with {self.device_type} that hosts {self.toolchain}"
        if self.stage == JobStage.VALIDATE:
            return validating
        compiling = (
            f"a runner with nvcc that hosts {self.toolchain}"
            if self.stage == JobStage.BUILD
            else f"a runner that hosts {self.toolchain}"
        )
        return f"{compiling}, compile-only ({self.stage}); a pass needs {validating}"


def jobs_phrase(count: int) -> str:
    return f"{count} validation job{'s' if count != 1 else ''}"


@dataclass
class JobsInFlight:
    open: int
    stalled: list[StalledJobs]
    # The toolchains online runners host, read where some jobs are stalled.
    hosted: list[Toolchain] = field(default_factory=list)

    @property
    def stalled_count(self) -> int:
        return sum(group.count for group in self.stalled)

    @property
    def arriving(self) -> int:
        """Open jobs whose results can still come: running, or queued where
        an online runner reads."""
        return self.open - self.stalled_count


def online_runners() -> tuple[set[str], list[Toolchain]]:
    """The queues the online runners read and the toolchains they host."""
    return Runner.objects.online().queues_read(), list(toolchains_online())


def proposal_jobs_in_flight(
    *, proposal: UpgradeProposal, runners: tuple | None = None
) -> JobsInFlight:
    """What a proposal waits for: its open jobs, and those of them that no
    online runner can take (the rule of ``manage.py sweep``'s warning),
    with the runner each group lacks. ``runners``: ``online_runners()``
    when already read."""
    jobs = open_jobs(proposal)
    total = jobs.count()
    if not total:
        return JobsInFlight(open=0, stalled=[])
    read, online = runners or online_runners()
    hosted = {toolchain.pk for toolchain in online}
    groups = (
        jobs.filter(state=ValidationJob.State.QUEUED)
        .exclude(queue__in=read)
        .values("toolchain", "device_type", "stage")
        .annotate(count=Count("pk"))
        .order_by("toolchain", "device_type", "stage")
    )
    toolchains = Toolchain.objects.in_bulk({g["toolchain"] for g in groups})
    device_types = DeviceType.objects.in_bulk({g["device_type"] for g in groups})
    stalled = []
    for group in groups:
        toolchain = toolchains[group["toolchain"]]
        device_type = device_types[group["device_type"]]
        if toolchain.pk not in hosted:
            missing = f"no online runner hosts {toolchain}"
        elif group["stage"] == JobStage.VALIDATE:
            missing = f"no online runner with {device_type} hosts {toolchain}"
        else:
            missing = f"no online runner that hosts {toolchain} has nvcc"
        stalled.append(
            StalledJobs(toolchain, device_type, group["count"], missing, group["stage"])
        )
    return JobsInFlight(open=total, stalled=stalled, hosted=online)


def proposal_jobs_in_flight_read(*, proposal: UpgradeProposal) -> JobsInFlight:
    """``proposal_jobs_in_flight`` for the proposal's page, kept until a job
    is planned, a result is stored or the online runners change what they
    read: counting the open jobs reads every one of them (26 ms of
    PostgreSQL at 16,000 open jobs), on every view and every poll. A claim
    changes nothing here: the runner that claims a job reads its queue, so
    the job was not stalled."""
    key, runners = proposal_jobs_key(proposal=proposal)
    return cached_read(
        key,
        lambda: proposal_jobs_in_flight(proposal=proposal, runners=runners),
        cache_seconds(),
    )


def proposal_jobs_key(*, proposal: UpgradeProposal) -> tuple[str, tuple]:
    """The key its jobs in flight are kept under, and the online runners
    they are counted against."""
    runners = online_runners()
    read, online = runners
    key = read_key(
        "proposal-jobs",
        proposal.pk,
        jobs_version(),
        sorted(read),
        [toolchain.pk for toolchain in online],
    )
    return key, runners


# -- the policy over the stored diff --------------------------------------------


@dataclass
class Blocker:
    """One served cell a rule of the policy fails on."""

    rule: str
    row_pk: int
    row: CellDiff
    reason: str


@dataclass
class Evaluation:
    """Why a proposal cannot pass yet, split by what would clear it."""

    policy: Policy
    digest: str
    jobs: JobsInFlight
    candidate_id: int
    blockers: list[Blocker] = field(default_factory=list)  # new results clear these
    approvals_needed: list[str] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    rejected_by: list[str] = field(default_factory=list)
    approvals: int = 0

    @property
    def blocking(self) -> list[str]:
        return [blocker.reason for blocker in self.blockers]

    @property
    def reasons(self) -> list[str]:
        """Every reason, one a cell."""
        return self.rejections + self.blocking + self.approvals_needed

    @property
    def reasons_summarised(self) -> list[str]:
        """The reasons with each rule that fails on many cells said once:
        what the page shows above the decision form and a refusal says."""
        return self.rejections + self.blocking_summarised + self.approvals_needed

    @property
    def blocking_summarised(self) -> list[str]:
        lines = []
        for rule in RULES:
            blockers = [b for b in self.blockers if b.rule == rule]
            if len(blockers) <= REASONS_PER_RULE:
                lines.extend(b.reason for b in blockers)
            else:
                lines.append(_folded(rule, blockers))
        if self.unblocking:
            lines.append(self.unblocking)
        return lines

    @property
    def unblocking(self) -> str:
        """What would let the missing results come, when nothing more can
        arrive for them: the runner each group of stalled jobs needs."""
        missing = any(b.rule == "missing" for b in self.blockers)
        stalled = [g for g in self.jobs.stalled if g.toolchain.pk == self.candidate_id]
        if not missing or not stalled or self.jobs.arriving:
            return ""
        groups = "; ".join(f"{g} would run on {g.wanted}" for g in stalled)
        return (
            "no online runner can produce the missing results, so nothing more "
            f"can arrive until one comes online: {groups}"
        )

    @property
    def state(self) -> str:
        """The state this evaluation puts the proposal in: a failing rule
        while results can still arrive may yet be cleared by them."""
        if self.rejections:
            return ProposalState.REJECTED
        if self.jobs.arriving:
            return ProposalState.COLLECTING
        if self.blockers:
            return ProposalState.BLOCKED
        if self.approvals_needed:
            return ProposalState.READY
        return ProposalState.APPROVED


def _folded(rule: str, blockers: list[Blocker]) -> str:
    shown = blockers[:REASONS_PER_RULE]
    count = len(blockers)
    if rule == "regression":
        cells = [f"{b.row.label} (now {b.row.candidate_status})" for b in shown]
        said = f"{count} served cells went from pass to another status"
    elif rule == "missing":
        cells = [b.row.label for b in shown]
        said = f"{count} served cells have no candidate result"
    else:
        cells = [f"{b.row.label} ({b.row.ratio - 1:.0%} slower)" for b in shown]
        said = f"{count} served cells are slower than their perf budget allows"
    return f"{said}: {'; '.join(cells)} and {count - len(shown)} more"


def evaluate(
    *,
    proposal: UpgradeProposal,
    policy: Policy | None = None,
    ignoring=None,
) -> Evaluation:
    """The policy over the proposal's stored diff and its standing decisions.
    ``ignoring``: a reviewer whose standing decision is left out, as it will
    be once their next decision replaces it."""
    policy = policy or Policy.current()
    ev = Evaluation(
        policy=policy,
        digest=proposal.diff_digest,
        jobs=proposal_jobs_in_flight(proposal=proposal),
        candidate_id=proposal.candidate_id,
    )
    exceptions = {
        e.backend: e for e in proposal.exceptions.select_related("signed_off_by")
    }
    for stored in proposal.diff_rows.may_block().order_by("position"):
        row = CellDiff.from_row(stored)
        found = _rule_failed(row, policy, exceptions)
        if found:
            ev.blockers.append(Blocker(found[0], stored.pk, row, found[1]))
    _decisions_count(ev, proposal, ignoring)
    return ev


def _rule_failed(row: CellDiff, policy: Policy, exceptions) -> tuple[str, str] | None:
    """The rule a served row fails and the reason in words, or None."""
    if policy.forbid_served_regressions and row.change == Change.GREEN_TO_RED:
        return (
            "regression",
            f"served cell {row.label} went from pass to {row.candidate_status}",
        )
    if policy.require_candidate_results and row.change == Change.MISSING:
        reason = f"served cell {row.label} has no candidate result"
        if row.candidate_status == Status.INFRA_ERROR:
            reason += " (its run hit runner trouble: infra_error, not the kernel)"
        return "missing", reason
    budget = policy.budget_for(row.operator)
    if not row.slower_than(budget):
        return None
    exception = exceptions.get(row.backend)
    if exception is not None and exception.signed:
        return None
    reason = (
        f"served cell {row.label} is {row.ratio - 1:.0%} slower "
        f"(ratio {row.ratio:.2f} ± {row.band:.2f}), over the {budget:.0%} "
        f"budget for {row.operator}"
    )
    if exception is not None:
        owners = ", ".join(policy.owners_of(row.backend)) or "none named"
        reason += (
            f"; the {row.backend} exception awaits sign-off by its owner ({owners})"
        )
    return "slower", reason


def _decisions_count(ev: Evaluation, proposal: UpgradeProposal, ignoring) -> None:
    """Standing decisions on the stored diff by members of the reviewer
    group; the proposer's never count."""
    policy = ev.policy
    standing = proposal.approvals.filter(voided=False).select_related("reviewer")
    reviewers = set(
        get_user_model()
        .objects.filter(groups__name=policy.reviewer_group)
        .values_list("pk", flat=True)
    )
    if ignoring is not None:
        standing = standing.exclude(reviewer=ignoring)
    for approval in standing:
        if approval.diff_digest != ev.digest or approval.reviewer_id not in reviewers:
            continue
        if approval.decision == Approval.Decision.REJECT:
            name = approval.reviewer.get_username()
            ev.rejections.append(f"rejected by {name}: {approval.comment}")
            ev.rejected_by.append(name)
        elif approval.reviewer_id != proposal.proposer_id:
            ev.approvals += 1
    if ev.approvals < policy.required_approvals:
        ev.approvals_needed.append(
            f"needs {policy.required_approvals} approvals from the "
            f"{policy.reviewer_group} group, has {ev.approvals}"
        )
