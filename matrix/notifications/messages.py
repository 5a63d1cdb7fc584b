"""What each message says, and what it touches (its scope: the backends,
device types, operators and served models a subscription may narrow to).
One message per happening: an alert opened or reopened (however many cells
it has), a proposal's state, a runner's silence, a sweep's end."""

from __future__ import annotations

from django.conf import settings
from django.db.models import Count, Q
from django.urls import reverse

from matrix.models import FAILURES, AlertCell, Result, ServedCall, ValidationJob
from matrix.models.alerts import SLOWER, Alert
from matrix.models.gate import ProposalState, UpgradeProposal
from matrix.models.notifications import Topic
from matrix.notifications.services import notification_publish


def absolute(path: str) -> str:
    return settings.TILEMATRIX_BASE_URL.rstrip("/") + path


def alert_scope(alert: Alert) -> dict:
    """The backends, device types, operators and served models of the
    alert's cells: three statements, however many cells."""
    cells = AlertCell.objects.filter(alert=alert)
    rows = set(
        cells.values_list(
            "device_type_id", "device_type__backend", "shape__operator__name"
        )
    )
    models = set(
        ServedCall.objects.filter(shape_id__in=cells.values("shape_id")).values_list(
            "source", flat=True
        )
    )
    return {
        "backends": sorted({b for _, b, _ in rows}),
        "device_types": sorted({d for d, _, _ in rows}),
        "operators": sorted({o for _, _, o in rows}),
        "models": sorted(models),
    }


def alert_publish(alert: Alert, *, reopened: bool) -> None:
    """One message for the alert, whatever the number of its cells."""
    alert = Alert.objects.select_related(
        "toolchain", "good_toolchain", "revision__operator", "first_bad_result"
    ).get(pk=alert.pk)
    scope = alert_scope(alert)
    word = "Reopened" if reopened else "New"
    what = (
        "significantly slower"
        if alert.status == SLOWER
        else alert.status.replace("_", " ")
    )
    cells = f"{alert.cell_count} cell{'s' if alert.cell_count != 1 else ''}"
    subject = (
        f"[TileMatrix] {word} alert #{alert.pk}: {what} on {alert.toolchain.name}, "
        f"{cells}"
    )
    change = alert.get_kind_display()
    if alert.good_toolchain_id and alert.good_toolchain_id != alert.toolchain_id:
        change += f" ({alert.good_toolchain.name} → {alert.toolchain.name})"
    lines = [
        f"{cells} turned {what} after a {change}.",
        f"Signature: {alert.signature or '—'}",
        f"Operators: {', '.join(scope['operators'])}; backends: "
        f"{', '.join(scope['backends'])}",
        f"Served weight touched: {alert.served_weight:g}",
        f"Owners: {', '.join(alert.owners) or 'none named in the policy'}",
        f"First bad result: #{alert.first_bad_result_id}",
    ]
    notification_publish(
        topic=Topic.ALERT,
        key=f"alert:{alert.pk}:opened:{alert.reopened}",
        subject=subject,
        text="\n".join(lines),
        link=absolute(reverse("alert", args=[alert.pk])),
        scope=scope,
        data={
            "alert": alert.pk,
            "state": alert.state,
            "status": alert.status,
            "signature": alert.signature,
            "cells": alert.cell_count,
            "served_weight": alert.served_weight,
            "owners": alert.owners,
            "reopened": reopened,
        },
        alert=alert,
    )


# Proposal states worth a message: ready for a decision, and the outcomes.
PROPOSAL_WORDS = {
    ProposalState.READY: "is ready for your decision",
    ProposalState.APPROVED: "was approved",
    ProposalState.REJECTED: "was rejected",
    ProposalState.ROLLED_OUT: "was rolled out",
}


def proposal_publish(proposal: UpgradeProposal, *, before: str) -> None:
    words = PROPOSAL_WORDS.get(proposal.state)
    if words is None:
        return
    device_types = list(proposal.device_types.all())
    notification_publish(
        topic=Topic.PROPOSAL,
        key=f"proposal:{proposal.pk}:{proposal.state}:{proposal.evaluated_at}",
        subject=f"[TileMatrix] Upgrade #{proposal.pk} {words}: "
        f"{proposal.baseline.name} → {proposal.candidate.name}",
        text=f"Upgrade #{proposal.pk} ({proposal.baseline.name} → "
        f"{proposal.candidate.name}) on "
        f"{', '.join(str(d) for d in device_types)} {words} "
        f"(it was {before.replace('_', ' ')}).",
        link=absolute(reverse("upgrade", args=[proposal.pk])),
        # Every operator: a proposal changes the toolchain under all of them.
        scope={
            "backends": sorted({d.backend for d in device_types}),
            "device_types": sorted(d.pk for d in device_types),
        },
        data={"proposal": proposal.pk, "state": proposal.state, "before": before},
    )


def runner_publish(runner, *, why: str, key: str) -> None:
    device_types = list(runner.device_types.all())
    notification_publish(
        topic=Topic.RUNNER,
        key=key,
        subject=f"[TileMatrix] Runner {runner.name} {why}",
        text=f"Runner {runner.name} {why}. Its device types: "
        f"{', '.join(str(d) for d in device_types) or 'none recorded'}.",
        link=absolute(reverse("runners")),
        scope={
            "backends": sorted({d.backend for d in device_types}),
            "device_types": sorted(d.pk for d in device_types),
        },
        data={"runner": runner.name, "why": why},
    )


def sweeps_finished_publish(sweep_ids: set[int]) -> list[int]:
    """A message for each of these sweeps that has no job left open and
    some failing result; the ids told. Two statements, and the messages."""
    if not sweep_ids:
        return []
    counts = (
        ValidationJob.objects.filter(sweep_id__in=sweep_ids)
        .values("sweep_id")
        .annotate(
            total=Count("pk"),
            open=Count("pk", filter=Q(state__in=["queued", "running"])),
        )
    )
    finished = {row["sweep_id"]: row["total"] for row in counts if not row["open"]}
    if not finished:
        return []
    failing = {}
    for sweep_id, status, backend, device_type, operator in Result.objects.filter(
        job__sweep_id__in=finished, status__in=FAILURES
    ).values_list(
        "job__sweep_id",
        "status",
        "device_type__backend",
        "device_type_id",
        "shape__operator__name",
    ):
        entry = failing.setdefault(
            sweep_id, {"n": 0, "statuses": {}, "scope": (set(), set(), set())}
        )
        entry["n"] += 1
        entry["statuses"][status] = entry["statuses"].get(status, 0) + 1
        entry["scope"][0].add(backend)
        entry["scope"][1].add(device_type)
        entry["scope"][2].add(operator)
    told = []
    for sweep_id, entry in sorted(failing.items()):
        statuses = ", ".join(
            f"{n} {s.replace('_', ' ')}" for s, n in sorted(entry["statuses"].items())
        )
        backends, device_types, operators = entry["scope"]
        if notification_publish(
            topic=Topic.SWEEP,
            key=f"sweep:{sweep_id}:finished",
            subject=f"[TileMatrix] Sweep {sweep_id} finished with "
            f"{entry['n']} failing result{'s' if entry['n'] != 1 else ''}",
            text=f"Sweep {sweep_id} finished its {finished[sweep_id]} jobs: "
            f"{statuses}.",
            link=absolute(reverse("sweep", args=[sweep_id])),
            scope={
                "backends": sorted(backends),
                "device_types": sorted(device_types),
                "operators": sorted(operators),
            },
            data={
                "sweep": sweep_id,
                "failing": entry["n"],
                "statuses": entry["statuses"],
            },
        ):
            told.append(sweep_id)
    return told
