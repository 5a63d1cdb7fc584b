"""Alerts from stored results: which cells' confirmed verdicts turned worse,
grouped by cause, and which alerted cells pass again. Besides a change for
the worse, a served cell failing on the current toolchain, where it never
passed, opens one when a newer release passes it (kind ``current``): what
production runs is broken and an upgrade is known to fix it. A cell that
never passed anywhere is a gap (the Gaps page), not an alert.

Ingest holds a failure on a green cell until a rerun confirms it, so a cell
row is always a confirmed verdict: these functions read the cells a batch
wrote, never the raw results. The work is set-based: a fixed number of
statements per batch whatever its size (500 cells broken by one release
cost what one does), and one alert per cause."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from matrix.alerts.reads import fixed_on_candidate
from matrix.bisection.releases import release_key
from matrix.gate import significance
from matrix.models import (
    AuditEvent,
    Cell,
    Result,
    Shape,
    Status,
    Toolchain,
    ValidationJob,
)
from matrix.models.alerts import (
    SLOWER,
    Alert,
    AlertCell,
    AlertState,
    CauseKind,
)
from matrix.models.gate import Policy

# Confirmed verdicts that open an alert where the cell passed before. Not
# infra_error (the runner's trouble) nor unsupported (the kernel declining
# a shape, which production serves with the reference by design).
ALERTING = frozenset(
    {
        Status.COMPILE_ERROR,
        Status.MISMATCH,
        Status.UNSTABLE,
        Status.RUNTIME_ERROR,
        Status.TIMEOUT,
    }
)

Key = tuple[int, int, int]  # shape, device type, toolchain
# toolchain id -> (the order key of its TileLang release, or None where its
# version is no release; whether it is the current toolchain)
Toolchains = dict[int, tuple[tuple | None, bool]]


@dataclass
class Written:
    """A cell as this batch left it."""

    key: Key
    revision_id: int
    result_id: int
    status: str
    signature: str


@dataclass
class Good:
    """The last pass a cell's verdict is compared with."""

    result_id: int
    revision_id: int
    toolchain_id: int


@dataclass
class Finding:
    cell: Written
    good: Good
    kind: str
    status: str
    signature: str

    @property
    def cause(self) -> str:
        changed_to = (
            self.cell.revision_id
            if self.kind == CauseKind.REVISION
            else self.cell.key[2]
        )
        return f"{self.kind}:{changed_to}:{self.status}:{self.signature}"[:200]


@dataclass
class Changes:
    """What one batch did to the alerts, for the signal and the tests."""

    opened: list[Alert] = field(default_factory=list)
    reopened: list[Alert] = field(default_factory=list)
    grown: list[Alert] = field(default_factory=list)
    fixed: list[Alert] = field(default_factory=list)


# What detection reads of a cell, in this order.
CELL_FIELDS = (
    "shape_id",
    "device_type_id",
    "toolchain_id",
    "revision_id",
    "result_id",
    "status",
    "error_signature",
)


def alerts_from_results(*, results) -> Changes:
    """Open, grow, reopen and close alerts for the cells ``results`` wrote
    (ingest's batch, inside its transaction)."""
    changes = Changes()
    if not results:
        return changes
    written = _cells_written(results)
    if not written:
        return changes
    now = timezone.now()
    batch = {r.pk for r in results}
    bad = [c for c in written if c.status in ALERTING]
    passing = [c for c in written if c.status == Status.PASS]
    toolchains = _toolchains() if bad or passing else {}
    goods = _last_passes([*bad, *passing], exclude=batch)
    findings = [f for c in bad if (f := _failure(c, goods, toolchains)) is not None]
    slower = _slowdowns(passing, goods, toolchains)
    findings += _current_failures(
        bad, passing, toolchains, known={f.cell.key for f in findings}
    )
    findings += slower
    slow_keys = {f.cell.key for f in slower}
    if findings:
        _record(findings, now, changes)
    if passing:
        # A pass ends the failures alerted on its cell, slow or not; only a
        # slowdown alert waits for a pass that is not slower.
        _passing_again(passing, now, changes, still_slower=slow_keys)
    return changes


def _cells_written(results) -> list[Written]:
    """The cells this batch wrote: those now pointing at one of its results,
    or, for a rerun that contradicted a failure (the cell is unstable, see
    ingest), at the failure it reran. A held failure, or an infra_error
    beside an answer, wrote none."""
    keys = {(r.shape_id, r.device_type_id, r.toolchain_id) for r in results}
    pointed = {r.pk for r in results}
    pointed |= set(
        ValidationJob.objects.filter(
            pk__in={r.job_id for r in results}, confirms__isnull=False
        ).values_list("confirms_id", flat=True)
    )
    rows = Cell.objects.filter(
        shape_id__in={k[0] for k in keys},
        device_type_id__in={k[1] for k in keys},
        toolchain_id__in={k[2] for k in keys},
        result_id__in=pointed,
    ).values_list(*CELL_FIELDS)
    return [
        Written((s, d, t), revision, result, status, signature or "")
        for s, d, t, revision, result, status, signature in rows
        if (s, d, t) in keys
    ]


def _last_passes(cells: list[Written], *, exclude: set[int]) -> dict:
    """(shape, device type, toolchain) -> the newest pass stored there
    before this batch, for every toolchain of these cells' shapes and device
    types: two statements."""
    if not cells:
        return {}
    newest = (
        Result.objects.filter(
            shape_id__in={c.key[0] for c in cells},
            device_type_id__in={c.key[1] for c in cells},
            status=Status.PASS,
        )
        .exclude(pk__in=exclude | {c.result_id for c in cells})
        .values("shape_id", "device_type_id", "toolchain_id")
        .annotate(newest=Max("pk"))
        .values_list("newest", flat=True)
    )
    return {
        (s, d, t): Good(pk, revision, t)
        for pk, s, d, t, revision in Result.objects.filter(
            pk__in=list(newest)
        ).values_list("pk", "shape_id", "device_type_id", "toolchain_id", "revision_id")
    }


def _toolchains() -> Toolchains:
    """Every toolchain's release order and currency: one statement (a
    server knows tens of toolchains, not thousands)."""
    return {
        pk: (release_key(version), is_current)
        for pk, version, is_current in Toolchain.objects.values_list(
            "pk", "tilelang_version", "is_current"
        )
    }


def _older(toolchain: int, than: int, toolchains: Toolchains) -> bool:
    """By TileLang release where both are releases (a lab may register
    0.1.15 before 0.1.13); else, or between two builds of one release, by
    which was registered first."""
    mine = toolchains.get(toolchain, (None, False))[0]
    theirs = toolchains.get(than, (None, False))[0]
    if mine is not None and theirs is not None and mine != theirs:
        return mine < theirs
    return toolchain < than


def _reference(
    cell: Written, goods: dict, toolchains: Toolchains
) -> tuple[Good, str] | None:
    """The pass ``cell`` is compared with, and what changed since: the
    newest pass of the same cell (the revision changed, or nothing did);
    else, where the cell never passed on its toolchain, the newest pass of
    its shape and device type on an older toolchain with the same kernel
    revision (the toolchain changed, and nothing else: a bisection's step
    of a new revision on an old release is no toolchain change). A failure on an older toolchain than a passing one is no
    regression: the newer one fixed it."""
    same = goods.get(cell.key)
    if same is not None:
        kind = (
            CauseKind.UNCHANGED
            if same.revision_id == cell.revision_id
            else CauseKind.REVISION
        )
        return same, kind
    shape, device_type, toolchain = cell.key
    older = [
        g
        for (s, d, t), g in goods.items()
        if (s, d) == (shape, device_type)
        and g.revision_id == cell.revision_id
        and _older(t, toolchain, toolchains)
    ]
    if not older:
        return None
    return max(older, key=lambda g: g.result_id), CauseKind.TOOLCHAIN


def _failure(cell: Written, goods: dict, toolchains: Toolchains) -> Finding | None:
    found = _reference(cell, goods, toolchains)
    if found is None:
        return None
    good, kind = found
    return Finding(cell, good, kind, cell.status, cell.signature or cell.status)


def _slowdowns(
    passing: list[Written], goods: dict, toolchains: Toolchains
) -> list[Finding]:
    """Passes significantly slower than the pass before them: the rank test
    on their timing samples says slower, by more than the policy's budget
    for the operator. Results without samples are not judged."""
    pairs = []
    for cell in passing:
        found = _reference(cell, goods, toolchains)
        if found is not None:
            pairs.append((cell, *found))
    if not pairs:
        return []
    samples = dict(
        Result.objects.filter(
            pk__in={c.result_id for c, _, _ in pairs}
            | {g.result_id for _, g, _ in pairs}
        ).values_list("pk", "details__kernel_ms_samples")
    )
    operators = dict(
        Shape.objects.filter(pk__in={c.key[0] for c, _, _ in pairs}).values_list(
            "pk", "operator__name"
        )
    )
    policy = Policy.current()
    found = []
    for cell, good, kind in pairs:
        change = significance.compare(
            samples.get(good.result_id) or [], samples.get(cell.result_id) or []
        )
        budget = max(policy.budget_for(operators[cell.key[0]]), 0.0)
        if (
            change is not None
            and change.verdict == significance.SLOWER
            and change.ratio > 1 + budget
        ):
            found.append(Finding(cell, good, kind, SLOWER, ""))
    return found


def _current_failures(
    bad: list[Written],
    passing: list[Written],
    toolchains: Toolchains,
    *,
    known: set[Key],
) -> list[Finding]:
    """Served cells failing on the current toolchain, where they never
    passed, whose kernel revision passes on a newer release: from either
    side, the failure written now (the pass stored before) or the pass
    written now (the failure stored before), so the order results arrive in
    does not matter. The nearest newer release that passes is the good side
    (the narrowest range to bisect). At most four statements, none where
    neither side is in the batch."""
    current = next((pk for pk, (_, now) in toolchains.items() if now), None)
    if current is None or toolchains[current][0] is None:
        return []
    newer = {
        pk
        for pk, (key, _) in toolchains.items()
        if key is not None and key > toolchains[current][0]
    }
    keys = {c.key for c in bad if c.key[2] == current and c.key not in known}
    keys |= {(c.key[0], c.key[1], current) for c in passing if c.key[2] in newer}
    if not keys or not newer:
        return []
    shapes, devices = {k[0] for k in keys}, {k[1] for k in keys}
    failing = [
        Written((s, d, t), revision, result, status, signature or "")
        for s, d, t, revision, result, status, signature in Cell.objects.filter(
            shape_id__in=shapes,
            device_type_id__in=devices,
            toolchain_id=current,
            status__in=ALERTING,
            shape__served=True,
        ).values_list(*CELL_FIELDS)
        if (s, d, t) in keys
    ]
    if not failing:
        return []
    # A cell an alert holds already is that alert's (a regression, or this
    # rule's a batch ago); one that ever passed here is the other rules'.
    held = set(
        AlertCell.objects.filter(
            shape_id__in=shapes, device_type_id__in=devices, toolchain_id=current
        ).values_list("shape_id", "device_type_id")
    )
    passed = set(
        Result.objects.filter(
            shape_id__in=shapes,
            device_type_id__in=devices,
            toolchain_id=current,
            status=Status.PASS,
        )
        # Not the model's ordering: it would add created_at to DISTINCT.
        .order_by()
        .values_list("shape_id", "device_type_id")
        .distinct()
    )
    failing = [c for c in failing if c.key[:2] not in held and c.key[:2] not in passed]
    if not failing:
        return []
    nearest: dict[tuple[int, int, int], Good] = {}
    for s, d, t, revision, result in Cell.objects.filter(
        shape_id__in={c.key[0] for c in failing},
        device_type_id__in={c.key[1] for c in failing},
        toolchain_id__in=newer,
        revision_id__in={c.revision_id for c in failing},
        status=Status.PASS,
    ).values_list(
        "shape_id", "device_type_id", "toolchain_id", "revision_id", "result_id"
    ):
        found = nearest.get((s, d, revision))
        if found is None or toolchains[t][0] < toolchains[found.toolchain_id][0]:
            nearest[(s, d, revision)] = Good(result, revision, t)
    return [
        Finding(
            cell, good, CauseKind.CURRENT, cell.status, cell.signature or cell.status
        )
        for cell in failing
        if (good := nearest.get((cell.key[0], cell.key[1], cell.revision_id)))
    ]


def _record(findings: list[Finding], now, changes: Changes) -> None:
    """One alert per cause (made where none exists, reopened where fixed),
    with its cells; the statements do not grow with the cells."""
    by_cause: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_cause[f.cause].append(f)
    first = {
        cause: min(group, key=lambda f: f.cell.result_id)
        for cause, group in by_cause.items()
    }
    # ON CONFLICT DO NOTHING: two ingests meeting one new cause make one
    # alert, and neither batch fails.
    Alert.objects.bulk_create(
        [
            Alert(
                cause=cause,
                kind=f.kind,
                status=f.status,
                signature="" if f.status == SLOWER else f.signature,
                toolchain_id=f.cell.key[2],
                good_toolchain_id=f.good.toolchain_id,
                revision_id=f.cell.revision_id,
                good_revision_id=f.good.revision_id,
                first_bad_result_id=f.cell.result_id,
            )
            for cause, f in first.items()
        ],
        ignore_conflicts=True,
    )
    alerts = {a.cause: a for a in Alert.objects.filter(cause__in=list(by_cause))}
    # Made by this batch: its first bad result is one of the batch's.
    made = {
        a.pk
        for cause, a in alerts.items()
        if a.first_bad_result_id == first[cause].cell.result_id and not a.cell_count
    }
    AlertCell.objects.bulk_create(
        [
            AlertCell(
                alert=alerts[cause],
                shape_id=f.cell.key[0],
                device_type_id=f.cell.key[1],
                toolchain_id=f.cell.key[2],
                first_bad_result_id=f.cell.result_id,
                good_result_id=f.good.result_id,
            )
            for cause, group in by_cause.items()
            for f in group
        ],
        ignore_conflicts=True,
    )
    # Cells of these alerts that had passed again are bad again.
    keys = {(alerts[f.cause].pk, *f.cell.key) for f in findings}
    again = [
        pk
        for pk, a, s, d, t in AlertCell.objects.filter(
            alert_id__in={a.pk for a in alerts.values()},
            passing_since__isnull=False,
        ).values_list("pk", "alert_id", "shape_id", "device_type_id", "toolchain_id")
        if (a, s, d, t) in keys
    ]
    if again:
        AlertCell.objects.filter(pk__in=again).update(passing_since=None)
    touched = list(alerts.values())
    _tallies_update(touched)
    for alert in touched:
        before = alert.snapshot()
        if alert.pk in made:
            changes.opened.append(alert)
            AuditEvent.record(verb="alert.open", obj=alert, after=alert.snapshot())
        elif alert.state == AlertState.FIXED:
            alert.state = AlertState.NEW
            alert.fixed_at = None
            alert.reopened += 1
            alert.save(update_fields=["state", "fixed_at", "reopened", "changed_at"])
            changes.reopened.append(alert)
            AuditEvent.record(
                verb="alert.reopen", obj=alert, before=before, after=alert.snapshot()
            )
        else:
            changes.grown.append(alert)


def _tallies_update(alerts: list[Alert]) -> None:
    """Recount the cells, the still-bad cells, the served weight, the
    backends and their owners of ``alerts``: one aggregate for all, one
    UPDATE each (a batch touches a few alerts, not a few hundred)."""
    if not alerts:
        return
    ids = [a.pk for a in alerts]
    tallies = {
        row["alert_id"]: row
        for row in AlertCell.objects.filter(alert_id__in=ids)
        .values("alert_id")
        .annotate(
            cells=Count("pk"),
            still_bad=Count("pk", filter=Q(passing_since__isnull=True)),
            weight=Sum("shape__weight", filter=Q(shape__served=True)),
        )
    }
    backends = defaultdict(set)
    for alert_id, backend in (
        AlertCell.objects.filter(alert_id__in=ids)
        .values_list("alert_id", "device_type__backend")
        .distinct()
    ):
        backends[alert_id].add(backend)
    policy = Policy.current()
    for alert in alerts:
        row = tallies.get(alert.pk, {})
        alert.cell_count = row.get("cells", 0)
        alert.open_cells = row.get("still_bad", 0)
        alert.served_weight = row.get("weight") or 0.0
        alert.backends = sorted(backends[alert.pk])
        alert.owners = sorted(
            {name for b in alert.backends for name in policy.owners_of(b)}
        )
        Alert.objects.filter(pk=alert.pk).update(
            cell_count=alert.cell_count,
            open_cells=alert.open_cells,
            served_weight=alert.served_weight,
            backends=alert.backends,
            owners=alert.owners,
            changed_at=timezone.now(),
        )


def _passing_again(
    cells: list[Written], now, changes: Changes, *, still_slower: set = frozenset()
) -> None:
    """Mark the alerted cells that pass again (for a slowdown alert: pass
    and are no longer slower, not in ``still_slower``); an alert none of
    whose cells still fails is fixed, by the system, audited."""
    keys = {c.key for c in cells}
    rows = [
        (pk, alert_id)
        for pk, alert_id, status, s, d, t in AlertCell.objects.filter(
            shape_id__in={k[0] for k in keys},
            device_type_id__in={k[1] for k in keys},
            toolchain_id__in={k[2] for k in keys},
            passing_since__isnull=True,
        ).values_list(
            "pk",
            "alert_id",
            "alert__status",
            "shape_id",
            "device_type_id",
            "toolchain_id",
        )
        if (s, d, t) in keys and not (status == SLOWER and (s, d, t) in still_slower)
    ]
    if not rows:
        return
    AlertCell.objects.filter(pk__in=[pk for pk, _ in rows]).update(passing_since=now)
    alerts = list(Alert.objects.filter(pk__in={a for _, a in rows}))
    _tallies_update(alerts)
    for alert in alerts:
        if alert.open_cells or alert.state == AlertState.FIXED:
            continue
        before = alert.snapshot()
        alert.state = AlertState.FIXED
        alert.fixed_at = now
        alert.save(update_fields=["state", "fixed_at", "changed_at"])
        changes.fixed.append(alert)
        AuditEvent.record(
            verb="alert.fixed",
            obj=alert,
            before=before,
            after={**alert.snapshot(), "why": "every cell passes again"},
        )


def alerts_rolled_out(*, proposal, now=None) -> list[Alert]:
    """An upgrade rolled out: the open alerts of its baseline failing where
    its candidate passes (kind current, every failing cell on a device type
    it covers passing on the candidate) are fixed, by the system, audited.
    Production now runs the toolchain that passes."""
    now = now or timezone.now()
    device_types = set(proposal.device_types.values_list("pk", flat=True))
    alerts = list(
        Alert.objects.open().filter(
            kind=CauseKind.CURRENT, toolchain_id=proposal.baseline_id
        )
    )
    outside = set(
        AlertCell.objects.filter(alert__in=alerts, passing_since__isnull=True)
        .exclude(device_type_id__in=device_types)
        .values_list("alert_id", flat=True)
    )
    candidates = fixed_on_candidate([a for a in alerts if a.pk not in outside])
    fixed = [
        a
        for a in alerts
        if a.pk in candidates and candidates[a.pk].proposal == proposal.pk
    ]
    if not fixed:
        return []
    AlertCell.objects.filter(alert__in=fixed, passing_since__isnull=True).update(
        passing_since=now
    )
    _tallies_update(fixed)
    for alert in fixed:
        before = alert.snapshot()
        alert.state = AlertState.FIXED
        alert.fixed_at = now
        alert.save(update_fields=["state", "fixed_at", "changed_at"])
        AuditEvent.record(
            verb="alert.fixed",
            obj=alert,
            before=before,
            after={
                **alert.snapshot(),
                "why": f"upgrade #{proposal.pk} rolled out: every cell passes on "
                f"{proposal.candidate.name}",
            },
        )
    return fixed
