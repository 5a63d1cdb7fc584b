"""Bisection workflows: start one (from a cell and a toolchain pair, or from
an upgrade's diff row), take it a step on when a step's result is stored,
and conclude it. Keyword-only and atomic; a refusal is a ValidationError
with the reason in words, and a start and an end are audit events.

A step runs through the planner like any other job (``sweep_plan``), so a
real runner worker executes it; the next step is decided when ingest
stores its result (``matrix.bisection.receivers``).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from matrix.bisection.releases import release_key, releases_between
from matrix.bisection.repro import repro_for, venv_dir
from matrix.bisection.search import UNANSWERING, Decision, decide, verdict_of
from matrix.events import bisection_concluded
from matrix.fleet.models import Runner
from matrix.fleet.services import capabilities_online, sweep_plan
from matrix.models import AuditEvent, Result, Toolchain, ValidationJob
from matrix.models.bisection import Bisection, BisectionStep, Verdict
from matrix.models.gate import DiffRow

logger = logging.getLogger(__name__)

State = Bisection.State
OPEN_STATES = (ValidationJob.State.QUEUED, ValidationJob.State.RUNNING)


def _refuse(message: str):
    raise ValidationError(message)


def _version_key(toolchain: Toolchain) -> tuple:
    key = release_key(toolchain.tilelang_version)
    if key is None:
        _refuse(
            f"{toolchain.name} has TileLang {toolchain.tilelang_version or '(unknown)'!s}, "
            "which is not a release: its place among the releases is unknown"
        )
    return key


@transaction.atomic
def bisection_start(
    *, shape, device_type, last_good, first_bad, by=None, proposal=None, revision=None
) -> Bisection:
    """Bisect the cell (its operator's current revision on the device
    type's backend, or ``revision``: an alert's, which may be older) over
    the TileLang releases between ``last_good`` and ``first_bad``, in either
    order of age. Results of an older revision answer rungs as any stored
    result does; a rung that needs a job stops it, since the planner runs
    the current revision. A bisection of the same already running is taken
    on, not started twice."""
    if last_good.pk == first_bad.pk:
        _refuse("the last good and the first bad toolchain are the same")
    good_key, bad_key = _version_key(last_good), _version_key(first_bad)
    if good_key == bad_key:
        _refuse(
            f"{last_good.name} and {first_bad.name} are both TileLang "
            f"{last_good.tilelang_version}: no release lies between them to bisect"
        )
    if revision is None:
        revision = shape.operator.current_revision(device_type.backend)
    if revision is None:
        _refuse(
            f"{shape.operator.name} has no current revision on {device_type.backend}: "
            "there is no kernel to bisect"
        )
    key = {
        "revision": revision,
        "shape": shape,
        "device_type": device_type,
        "last_good": last_good,
        "first_bad": first_bad,
    }
    running = Bisection.objects.filter(state=State.RUNNING, **key).first()
    if running is not None:
        return bisection_advance(bisection=running)
    older, newer = (
        (last_good, first_bad) if good_key < bad_key else (first_bad, last_good)
    )
    try:
        with transaction.atomic():
            bisection = Bisection.objects.create(
                **key,
                direction=Bisection.Direction.REGRESSION
                if older == last_good
                else Bisection.Direction.FIX,
                proposal=proposal,
                created_by=by,
                ladder=_ladder(
                    revision=revision,
                    shape=shape,
                    device_type=device_type,
                    older=older,
                    newer=newer,
                ),
            )
    except IntegrityError:
        # Started at the same moment by someone else: theirs is this one.
        return Bisection.objects.get(state=State.RUNNING, **key)
    AuditEvent.record(
        actor=by,
        verb="bisection.start",
        obj=bisection,
        after={
            "cell": f"{shape} on {device_type}",
            "last_good": last_good.name,
            "first_bad": first_bad.name,
            "rungs": [r["version"] for r in bisection.ladder],
        },
    )
    return bisection_advance(bisection=bisection)


def release_to_compare(*, toolchain, device_type):
    """For a cell failing on ``toolchain`` with nothing to compare it with
    (a kernel revision's failure): the newest release an online runner with
    ``device_type`` validates on, newer than ``toolchain``'s, to find the
    first that fixes it; else the oldest older one, to find where it broke.
    None where no other release is hosted, or ``toolchain`` is no release."""
    here = release_key(toolchain.tilelang_version)
    if here is None:
        return None
    validating = {t for d, t in capabilities_online().validate if d == device_type.pk}
    hosted = [
        (key, t.pk, t)
        for t in Toolchain.objects.filter(pk__in=validating)
        if (key := release_key(t.tilelang_version)) is not None and key != here
    ]
    newer = [h for h in hosted if h[0] > here]
    if newer:
        return max(newer)[2]
    return min(hosted)[2] if hosted else None


def bisection_from_diff_row(*, row: DiffRow, by=None) -> Bisection:
    """Bisect an upgrade diff's row that passes on one side and fails on the
    other: a regression (green to red) or a fix (red to green)."""
    proposal = row.proposal
    sides = {
        proposal.baseline: verdict_of(row.baseline_status),
        proposal.candidate: verdict_of(row.candidate_status),
    }
    good = [t for t, v in sides.items() if v == Verdict.GOOD]
    bad = [t for t, v in sides.items() if v == Verdict.BAD]
    if not (good and bad):
        _refuse(
            "only a row that passes on one toolchain and fails on the other can "
            f"be bisected; this one is {row.baseline_status or 'no result'} on "
            f"{proposal.baseline.name} and {row.candidate_status or 'no result'} "
            f"on {proposal.candidate.name}"
        )
    return bisection_start(
        shape=row.shape,
        device_type=row.device_type,
        last_good=good[0],
        first_bad=bad[0],
        by=by,
        proposal=proposal,
    )


def _answers(*, revision, shape, device_type, toolchain_ids) -> dict[int, Result]:
    """The newest result of the cell's revision on each toolchain that
    answers the question (pass or a kernel's failure)."""
    newest = {}
    results = (
        Result.objects.filter(
            revision=revision,
            shape=shape,
            device_type=device_type,
            toolchain_id__in=toolchain_ids,
        )
        .exclude(status__in=UNANSWERING)
        .order_by("toolchain_id", "-id")
        # A step keeps the result's id and status; its details stay unread.
        .only("id", "toolchain_id", "status")
    )
    for result in results:
        newest.setdefault(result.toolchain_id, result)
    return newest


def _ladder(*, revision, shape, device_type, older, newer) -> list[dict]:
    """The rungs, oldest first: the two ends and, for each release between,
    the toolchain of that release to test it with: one whose result is
    there already, else one an online runner with the device hosts, else
    none (and what would test it, in ``need``)."""
    versions = releases_between(
        older.tilelang_version,
        newer.tilelang_version,
        Toolchain.objects.values_list("tilelang_version", flat=True).distinct(),
    )
    of_version = defaultdict(list)
    for toolchain in Toolchain.objects.filter(tilelang_version__in=versions).order_by(
        "pk"
    ):
        of_version[toolchain.tilelang_version].append(toolchain)
    candidates = [older, newer, *(t for ts in of_version.values() for t in ts)]
    answered = _answers(
        revision=revision,
        shape=shape,
        device_type=device_type,
        toolchain_ids=[t.pk for t in candidates],
    )
    validating = {t for d, t in capabilities_online().validate if d == device_type.pk}

    def rank(toolchain):
        return (toolchain.pk not in answered, toolchain.pk not in validating)

    chosen = [older]
    chosen += [min(of_version[v], key=rank) if of_version[v] else v for v in versions]
    chosen.append(newer)
    rungs = []
    for item in chosen:
        if isinstance(item, str):
            rungs.append(
                {"version": item, "toolchain": None, "name": "", "hosted": False}
            )
            continue
        rungs.append(
            {
                "version": item.tilelang_version,
                "toolchain": item.pk,
                "name": item.name,
                "hosted": item.pk in validating,
            }
        )
    for rung in rungs:
        testable = rung["hosted"] or rung["toolchain"] in answered
        rung["need"] = "" if testable else _need(rung, device_type, ends=(older, newer))
    return rungs


def _need(rung: dict, device_type, *, ends) -> str:
    """What would test a rung no online runner can: who hosts it offline,
    or which runner would need the release, and how it is built."""
    version = rung["version"]
    runners = Runner.objects.routable().filter(device_types=device_type)
    if rung["toolchain"] is not None:
        hosts = list(
            runners.filter(toolchains=rung["toolchain"]).values_list("name", flat=True)
        )
        if hosts:
            return (
                f"TileLang {version} ({rung['name']}) is hosted by "
                f"{', '.join(hosts)}, offline now: start a bisection again once "
                "it is online."
            )
    # The runners that already test the ends are the ones to give it to;
    # where none may be given work, the lab hosts whose results came as
    # evidence files are the ones that have the device.
    testing_ends = Q(toolchains__in=[t.pk for t in ends])
    labs = Runner.objects.filter(
        device_types=device_type,
        health=Runner.Health.EVIDENCE,
        revoked_at__isnull=True,
    )
    names, lab = [], False
    for found, is_lab in ((runners, False), (labs, True)):
        names = list(
            found.annotate(ends=Count("toolchains", filter=testing_ends))
            .order_by("-ends", "name")
            .values_list("name", flat=True)[:3]
        )
        if names:
            lab = is_lab
            break
    if lab:
        who = (
            f"lab host {', '.join(names)} (its results came as evidence files) "
            "would need it"
        )
    elif names:
        who = f"runner {', '.join(names)} would need it"
    else:
        who = f"a runner with {device_type} would need it (none is registered)"
    directory = f"/opt/toolchains/tilelang-{version}"
    return (
        f"TileLang {version} is not hosted by any online runner with {device_type}: "
        f"{who}. Build it with `scripts/make-toolchain-venv {version} {directory}` "
        f"(`make toolchains` puts it in {venv_dir(version)}) and register that "
        f"host with `--python {directory}/bin/python`."
    )


def bisection_advance(*, bisection: Bisection) -> Bisection:
    """Take the search on as far as it goes now: record the results that
    exist for its rungs, plan the next rung's job, or conclude."""
    with transaction.atomic():
        bisection = (
            Bisection.objects.select_for_update()
            .select_related("revision__operator", "shape__operator", "device_type")
            .get(pk=bisection.pk)
        )
        while bisection.is_running:
            steps = list(bisection.steps.select_related("job"))
            for step in steps:
                step.bisection = bisection  # one row, one object: a stop sticks
            _steps_settle(steps)
            if not bisection.is_running or any(s.is_waiting for s in steps):
                break
            if _steps_reuse(bisection, steps):
                continue
            verdicts = {step.rung: step.verdict for step in steps}
            testable = {
                i for i, rung in enumerate(bisection.ladder) if rung["hosted"]
            } - set(verdicts)
            decision = decide(
                rungs=len(bisection.ladder), verdicts=verdicts, testable=testable
            )
            if decision.rung is None:
                _conclude(bisection, decision, steps)
                break
            _step_plan(bisection, decision.rung, steps)
    return bisection


def _steps_settle(steps) -> None:
    """A waiting step whose job ended without its result reaching the
    receiver (lost by the reaper, which stores its infra_error directly)
    takes the job's last result now."""
    for step in steps:
        job = step.job
        if not step.is_waiting or (job and job.state in OPEN_STATES):
            continue
        result = job.results.order_by("-attempt").first() if job else None
        if result is not None:
            _step_answer(step, result)
        else:
            step.verdict, step.finished_at = Verdict.SKIP, timezone.now()
            step.save(update_fields=["verdict", "finished_at"])


def _step_add(bisection, steps, rung: int, **fields) -> BisectionStep:
    step = BisectionStep.objects.create(
        bisection=bisection,
        number=len(steps) + 1,
        rung=rung,
        toolchain_id=bisection.ladder[rung]["toolchain"],
        **fields,
    )
    steps.append(step)
    return step


def _steps_reuse(bisection, steps) -> bool:
    """Record a step for every untested rung whose answer is stored already
    (a result is free; a job is not). True if any was recorded."""
    tested = {step.rung for step in steps}
    rungs = {
        rung["toolchain"]: i
        for i, rung in enumerate(bisection.ladder)
        if rung["toolchain"] is not None and i not in tested
    }
    if not rungs:
        return False
    answers = _answers(
        revision=bisection.revision,
        shape=bisection.shape,
        device_type=bisection.device_type,
        toolchain_ids=list(rungs),
    )
    now = timezone.now()
    for toolchain_id, result in sorted(answers.items(), key=lambda a: rungs[a[0]]):
        _step_add(
            bisection,
            steps,
            rungs[toolchain_id],
            result=result,
            reused=True,
            status=result.status,
            verdict=verdict_of(result.status),
            finished_at=now,
        )
    return bool(answers)


def _step_plan(bisection, rung: int, steps) -> None:
    """One job for the rung, through the planner: a runner with the device
    and the toolchain validates it. The step waits for its result."""
    toolchain = Toolchain.objects.get(pk=bisection.ladder[rung]["toolchain"])
    current = bisection.shape.operator.current_revision(bisection.device_type.backend)
    if current is None or current.pk != bisection.revision_id:
        _stop(
            bisection,
            f"{toolchain.name} needs a job, and the bisected revision "
            f"({bisection.revision}) is not the current one of "
            f"{bisection.shape.operator.name} on {bisection.device_type.backend} "
            "(it changed since, or the bisection began from an older result): "
            "the planner runs the current one; start it again for that revision",
        )
        return
    validating = capabilities_online().validate
    if (bisection.device_type_id, toolchain.pk) not in validating:
        # Its runner went offline since the ladder was laid out.
        bisection.ladder[rung]["hosted"] = False
        bisection.ladder[rung]["need"] = _need(
            bisection.ladder[rung],
            bisection.device_type,
            ends=Toolchain.objects.filter(
                pk__in=[bisection.last_good_id, bisection.first_bad_id]
            ),
        )
        bisection.save(update_fields=["ladder", "updated_at"])
        return
    cell = (bisection.shape_id, bisection.device_type_id, toolchain.pk)
    sweep = sweep_plan(
        cells=[cell],
        created_by=bisection.created_by,
        filters={"bisection": bisection.pk},
    )
    job = sweep.jobs.first() or (
        # The cell has a job in flight already (a sweep's): its result
        # answers the step as well.
        ValidationJob.objects.open()
        .filter(
            revision_id=bisection.revision_id,
            shape_id=cell[0],
            device_type_id=cell[1],
            toolchain_id=cell[2],
        )
        .first()
    )
    if job is None:
        _stop(bisection, f"no job could be planned for {toolchain.name}")
        return
    _step_add(bisection, steps, rung, job=job)


def _stop(bisection, reason: str) -> None:
    _finish(bisection, state=State.STOPPED, conclusion=f"Stopped: {reason}.")


def _finish(bisection, *, state, conclusion, release=None, repro=None, needs=()):
    bisection.state = state
    bisection.conclusion = conclusion
    bisection.release = release
    bisection.repro = repro or {}
    bisection.needs = list(needs)
    bisection.finished_at = timezone.now()
    bisection.save()
    AuditEvent.record(
        verb="bisection.conclude",
        obj=bisection,
        before={"state": State.RUNNING},
        after={
            "state": state,
            "release": release.name if release else "",
            "conclusion": conclusion,
        },
    )
    # Whoever cares (an alert of the cell) reads the conclusion once the
    # transaction commits: the sender never imports them.
    bisection_concluded.send(sender=Bisection, bisection=bisection)


def _conclude(bisection, decision: Decision, steps) -> None:
    ladder = bisection.ladder
    by_rung = {step.rung: step for step in steps}
    cell = f"{bisection.shape} on {bisection.device_type}"

    def named(i: int) -> str:
        rung = ladder[i]
        return f"TileLang {rung['version']}" + (
            f" ({rung['name']})" if rung["name"] else ""
        )

    def said(i: int) -> str:
        step = by_rung[i]
        how = f"reused result {step.result_id}" if step.reused else f"job {step.job_id}"
        return f"{step.status} ({how})"

    if decision.state == State.STOPPED:
        end = decision.end
        if end in by_rung:
            reason = (
                f"{named(end)}, an end of the range, gave {by_rung[end].status}, "
                f"which says neither pass nor fail for {cell}"
            )
            needs = []
        else:
            reason = f"{named(end)}, an end of the range, cannot be tested"
            needs = [ladder[end]["need"]]
        _finish(
            bisection,
            state=State.STOPPED,
            conclusion=f"Stopped: {reason}.",
            needs=needs,
        )
        return
    old, new = decision.old, decision.new
    if decision.state == State.NO_CHANGE:
        _finish(
            bisection,
            state=State.NO_CHANGE,
            conclusion=(
                f"No change on revision {bisection.revision}: {cell} gives "
                f"{said(old)} on {named(old)} and {said(new)} on {named(new)}."
            ),
        )
        return
    # The ends' verdicts on this revision decide which way the change goes,
    # whatever the pair it was started from said.
    fix = by_rung[0].verdict == Verdict.BAD
    bisection.direction = (
        Bisection.Direction.FIX if fix else Bisection.Direction.REGRESSION
    )
    toolchains = Toolchain.objects.in_bulk(
        [ladder[old]["toolchain"], ladder[new]["toolchain"]]
    )
    before, after = (toolchains[ladder[i]["toolchain"]] for i in (old, new))
    repro = repro_for(
        bisection=bisection,
        sides=[(after, by_rung[new].status), (before, by_rung[old].status)],
    )
    tested = sum(1 for s in steps if not s.reused)
    tally = (
        f"{len(steps)} rungs answered: {tested} by a job, "
        f"{len(steps) - tested} by results already stored."
    )
    if decision.state == State.FOUND:
        first, last = ("good", "bad") if fix else ("bad", "good")
        _finish(
            bisection,
            state=State.FOUND,
            release=after,
            repro=repro,
            conclusion=(
                f"First {first} release: {named(new)}. {cell} gives {said(new)} "
                f"there and {said(old)} on {named(old)}, the last {last} release. "
                f"{tally}"
            ),
        )
        return
    untested = range(old + 1, new)
    needs = [ladder[i]["need"] for i in untested if ladder[i]["need"]]
    skipped = [f"{named(i)} gave {by_rung[i].status}" for i in untested if i in by_rung]
    not_tested = [named(i) for i in untested if i not in by_rung]
    gaps = "; ".join(
        part
        for part in (
            f"not tested: {', '.join(not_tested)}" if not_tested else "",
            f"no verdict: {', '.join(skipped)}" if skipped else "",
        )
        if part
    )
    _finish(
        bisection,
        state=State.NARROWED,
        repro=repro,
        needs=needs,
        conclusion=(
            f"The change lies after {named(old)}, which gives {said(old)}, and "
            f"up to {named(new)}, which gives {said(new)}. "
            f"{gaps[0].upper()}{gaps[1:]}. {tally}"
        ),
    )


def bisection_results_record(*, results) -> None:
    """Ingest stored ``results``: the steps waiting on their jobs take their
    verdicts, and each bisection goes on. Called in ingest's transaction; a
    bisection's trouble stops that bisection, never the ingest."""
    by_job = {}
    for result in results:
        by_job[result.job_id] = result
    waiting = BisectionStep.objects.filter(job_id__in=list(by_job), verdict="")
    for step in waiting.select_related("bisection"):
        result = by_job[step.job_id]
        try:
            with transaction.atomic():
                _step_answer(step, result)
                bisection_advance(bisection=step.bisection)
        except Exception:
            logger.exception("bisection %s could not go on", step.bisection_id)
            with transaction.atomic():
                bisection = Bisection.objects.select_for_update().get(
                    pk=step.bisection_id
                )
                if bisection.is_running:
                    _stop(
                        bisection,
                        f"an error while recording result {result.pk}; "
                        "see the control worker's log",
                    )


def _step_answer(step: BisectionStep, result: Result) -> None:
    bisection = step.bisection
    step.result = result
    step.status = result.status
    step.finished_at = timezone.now()
    if result.revision_id != bisection.revision_id:
        step.verdict = Verdict.SKIP
        step.save()
        _stop(
            bisection,
            f"job {step.job_id} ran revision {result.revision}, not the bisected "
            f"{bisection.revision}: the current revision changed; start it again",
        )
        return
    step.verdict = verdict_of(result.status)
    step.save()
