"""GET /api/v1/alerts: the alerts page as JSON for scripts (a CI step that
stops while an open alert touches a served cell of its device type), by the
served weight they touch, open ones first. Read as the pages are."""

from __future__ import annotations

from datetime import datetime

from django.urls import reverse
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError

from matrix.alerts import reads
from matrix.api_coverage import REFUSED, coverage_reader

router = Router(tags=["alerts"], auth=coverage_reader)
LIMIT_MAX = 500


class AlertFilters(Schema):
    state: str = Field(
        "open",
        description="open (new, acknowledged, upstream), one state "
        "(new, acknowledged, upstream, fixed, wont_fix), or empty for all",
    )
    backend: str = ""
    limit: int = Field(100, ge=1, le=LIMIT_MAX)
    offset: int = Field(0, ge=0)


class AlertOut(Schema):
    id: int
    url: str
    state: str
    kind: str = Field(
        description="toolchain, revision or unchanged: what changed; current: "
        "the current toolchain fails where a newer one passes"
    )
    status: str = Field(description="the failing status, or slower")
    signature: str
    toolchain: str
    good_toolchain: str | None
    operator: str
    revision: str
    good_revision: str | None
    cells: int
    failing_cells: int
    served_weight: float
    backends: list[str]
    owners: list[str]
    first_bad_result: int
    fixed_on_candidate: str | None = Field(
        description="the newer toolchain every failing cell passes on, if any"
    )
    upgrade: int | None
    upstream_url: str
    wont_fix_reason: str
    bisection: dict | None = Field(
        description="the toolchain bisection's id, state, summary, named release "
        "and needs, once one ran"
    )
    opened_at: datetime
    fixed_at: datetime | None


class AlertsOut(Schema):
    count: int
    alerts: list[AlertOut]


# A filter value that names nothing is refused (400) with the allowed ones.
@router.get("/alerts", response={200: AlertsOut, **REFUSED}, url_name="alerts_list")
def alerts_list(request, params: Query[AlertFilters]):
    """Alerts by served weight touched, open first; each with its cause,
    counts, owners and whether a candidate toolchain already fixes it."""
    problems = reads.filters_check(state=params.state, backend=params.backend)
    if problems:
        raise HttpError(400, "; ".join(problems))
    alerts = reads.alert_list(state=params.state, backend=params.backend)
    count = alerts.count()
    page = list(alerts[params.offset : params.offset + params.limit])
    candidates = reads.fixed_on_candidate(page)
    return {
        "count": count,
        "alerts": [
            {
                "id": a.pk,
                "url": request.build_absolute_uri(reverse("alert", args=[a.pk])),
                "state": a.state,
                "kind": a.kind,
                "status": a.status,
                "signature": a.signature,
                "toolchain": a.toolchain.name,
                "good_toolchain": a.good_toolchain.name
                if a.good_toolchain_id
                else None,
                "operator": a.revision.operator.name,
                "revision": a.revision.source_sha256,
                "good_revision": (
                    a.good_revision.source_sha256 if a.good_revision_id else None
                ),
                "cells": a.cell_count,
                "failing_cells": a.open_cells,
                "served_weight": a.served_weight,
                "backends": a.backends,
                "owners": a.owners,
                "first_bad_result": a.first_bad_result_id,
                "fixed_on_candidate": (
                    candidates[a.pk].toolchain if a.pk in candidates else None
                ),
                "upgrade": candidates[a.pk].proposal if a.pk in candidates else None,
                "upstream_url": a.upstream_url,
                "wont_fix_reason": a.wont_fix_reason,
                "bisection": a.bisection,
                "opened_at": a.opened_at,
                "fixed_at": a.fixed_at,
            }
            for a in page
        ],
    }
