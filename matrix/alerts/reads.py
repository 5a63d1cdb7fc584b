"""What the alerts page, an alert's page and ``GET /api/v1/alerts`` read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.db.models import Exists, OuterRef

from matrix import revisions
from matrix.bisection.releases import release_key
from matrix.models import AuditEvent, Backend, Cell, Status, Toolchain
from matrix.models.alerts import Alert, AlertCell, AlertState
from matrix.models.gate import ProposalState, UpgradeProposal

CELLS_SHOWN = 200


def alert_list(*, state: str = "", backend: str = ""):
    """Alerts by the served weight they touch, open ones first. ``state``:
    one of the states, or "open"; ``backend``: one of the backends."""
    alerts = Alert.objects.select_related(
        "toolchain", "good_toolchain", "revision__operator", "good_revision"
    )
    if state == "open":
        alerts = alerts.open()
    elif state:
        alerts = alerts.filter(state=state)
    if backend:
        alerts = alerts.filter(
            Exists(
                AlertCell.objects.filter(
                    alert=OuterRef("pk"), device_type__backend=backend
                )
            )
        )
    return alerts.by_weight()


def filters_check(*, state: str, backend: str) -> list[str]:
    """Words for each filter value that names nothing."""
    problems = []
    if state and state != "open" and state not in AlertState.values:
        problems.append(
            f"state must be open or one of {', '.join(AlertState.values)}, "
            f"got {state!r}"
        )
    if backend and backend not in Backend.values:
        problems.append(
            f"backend must be one of {', '.join(Backend.values)}, got {backend!r}"
        )
    return problems


@dataclass(frozen=True)
class Candidate:
    """Every still-failing cell of an alert passes on a newer toolchain,
    with the kernel revision that failed or the current one: a run on the
    alert's toolchain fails the same way; the upgrade closes it."""

    toolchain: str
    proposal: int | None


def _newer(toolchain: int, than: int, releases: dict) -> bool:
    """By TileLang release where both are releases, else by registration
    (two builds of one release, a local build)."""
    mine, theirs = releases.get(toolchain), releases.get(than)
    if mine is not None and theirs is not None and mine != theirs:
        return mine > theirs
    return toolchain > than


def fixed_on_candidate(alerts: list[Alert]) -> dict[int, Candidate]:
    """alert id -> Candidate, for the open ones so fixed. Four statements
    for any number of alerts."""
    open_ids = [a.pk for a in alerts if a.state != AlertState.FIXED]
    if not open_ids:
        return {}
    bad = list(
        AlertCell.objects.filter(
            alert_id__in=open_ids, passing_since__isnull=True
        ).values_list(
            "alert_id",
            "shape_id",
            "device_type_id",
            "toolchain_id",
            "first_bad_result__revision_id",
        )
    )
    if not bad:
        return {}
    passes: dict[tuple[int, int], list[tuple[int, str, int, bool]]] = {}
    for s, d, t, name, revision, current in (
        Cell.objects.filter(
            shape_id__in={row[1] for row in bad},
            device_type_id__in={row[2] for row in bad},
            status=Status.PASS,
        )
        .annotate(current=revisions.is_current_cell())
        .values_list(
            "shape_id",
            "device_type_id",
            "toolchain_id",
            "toolchain__name",
            "revision_id",
            "current",
        )
    ):
        passes.setdefault((s, d), []).append((t, name, revision, current))
    releases = {
        pk: release_key(version)
        for pk, version in Toolchain.objects.filter(
            pk__in={row[3] for row in bad}
            | {t for rows in passes.values() for t, *_ in rows}
        ).values_list("pk", "tilelang_version")
    }
    by_alert: dict[int, list] = {}
    for alert_id, s, d, t, failed in bad:
        newer = [
            (t2, name)
            for t2, name, revision, current in passes.get((s, d), [])
            if (current or revision == failed) and _newer(t2, t, releases)
        ]
        by_alert.setdefault(alert_id, []).append((t, newer))
    found = {}
    for alert_id, cells in by_alert.items():
        if not all(newer for _, newer in cells):
            continue
        # The toolchains most of the cells pass on name the candidate.
        counts = Counter(pair for _, newer in cells for pair in newer)
        most = max(counts.values())
        found[alert_id] = (cells[0][0], [p for p, n in counts.items() if n == most])
    proposals = {
        (b, c): pk
        for b, c, pk in UpgradeProposal.objects.filter(
            candidate_id__in={t for _, pairs in found.values() for t, _ in pairs}
        )
        .exclude(state__in=[ProposalState.REJECTED])
        .order_by("pk")
        .values_list("baseline_id", "candidate_id", "pk")
    }
    chosen = {}
    for alert_id, (baseline, pairs) in found.items():
        # Of those, a proposal's candidate first, then the nearest release.
        toolchain_id, name = min(
            pairs,
            key=lambda p: (
                (baseline, p[0]) not in proposals,
                releases.get(p[0]) or (),
                p[0],
            ),
        )
        chosen[alert_id] = Candidate(name, proposals.get((baseline, toolchain_id)))
    return chosen


@dataclass
class CellRow:
    cell: AlertCell
    status: str  # the cell's status now


def alert_cells(alert: Alert, *, limit: int = CELLS_SHOWN) -> tuple[list, int]:
    """The alert's cells, the most served weight first, with each cell's
    status now; and how many there are."""
    rows = list(
        AlertCell.objects.filter(alert=alert)
        .select_related("shape__operator", "device_type", "toolchain")
        .order_by("-shape__served", "-shape__weight", "shape__operator__name", "pk")[
            :limit
        ]
    )
    now = {
        (s, d, t): status
        for s, d, t, status in Cell.objects.filter(
            shape_id__in={r.shape_id for r in rows},
            device_type_id__in={r.device_type_id for r in rows},
            toolchain_id__in={r.toolchain_id for r in rows},
        ).values_list("shape_id", "device_type_id", "toolchain_id", "status")
    }
    return (
        [
            CellRow(r, now.get((r.shape_id, r.device_type_id, r.toolchain_id), ""))
            for r in rows
        ],
        alert.cell_count,
    )


def alert_history(alert: Alert):
    return AuditEvent.objects.filter(
        object_type=Alert._meta.label_lower, object_id=str(alert.pk)
    ).order_by("-created_at", "-pk")
